"""The development install imports the real package from any folder, a clone's parent included."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBE = "import json, sys, blocksparse; print(json.dumps([blocksparse.__file__, sys.path]))"


def test_import_from_a_folder_holding_a_clone_named_blocksparse(tmp_path):
    # A clone folder named `blocksparse` in the current directory is a namespace package to Python; the Makefile's
    # editable install (compat mode: the checkout on sys.path) still resolves to the package itself.
    (tmp_path / "blocksparse").symlink_to(ROOT, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    file, path = json.loads(out.stdout)
    if str(ROOT) not in path:
        pytest.skip("blocksparse is not installed here by the Makefile's editable install (compat mode)")
    assert file == str(ROOT / "blocksparse" / "__init__.py")
