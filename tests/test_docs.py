"""The documentation runs: every ```python block of README.md and docs/*.md, and every docstring example.

Each page's blocks run in order in one fresh namespace, so a page is self-contained and a reader can
paste it block by block. A failure names the page and the line of the block that failed.
"""

import doctest
import importlib
import pkgutil
import re
import textwrap
import traceback
from pathlib import Path

import pytest

import blocksparse

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
OPTIONAL = (
    "hypothesis",
    "scipy",
    "matplotlib",
    "torch",
    "torch_geometric",
    "flax",
    "equinox",
    "optax",
    "safetensors",
    "tokenizers",
)
# Pages whose blocks are known not to run yet, page -> why (e.g. a snippet with undefined names).
# Not strict, so a fixed page passes; remove its entry then, so that it stays fixed.
KNOWN_BROKEN: dict[str, str] = {}


def _page_param(page: Path):
    name = str(page.relative_to(ROOT))
    marks = [pytest.mark.xfail(reason=KNOWN_BROKEN[name], strict=False)] if name in KNOWN_BROKEN else []
    return pytest.param(page, id=name, marks=marks)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(line, source)`` of each ```python block, ``line`` being 1-based (the fence's line)."""
    out = []
    for m in FENCE.finditer(text):
        if m.group("lang").strip().split(" ")[0] in ("python", "py"):
            line = text.count("\n", 0, m.start()) + 1
            out.append((line, textwrap.dedent(m.group("body"))))
    return out


def test_block_extraction():
    text = "a\n```python\nx = 1\n```\n\n```bash\nmake\n```\n  ```python\n  y = x\n  ```\n"
    assert python_blocks(text) == [(2, "x = 1\n"), (9, "y = x\n")]


@pytest.mark.docs  # `make test-docs` (CI runs it after `make test`)
@pytest.mark.parametrize("page", [_page_param(p) for p in PAGES])
def test_page_blocks_run(page):
    blocks = python_blocks(page.read_text())
    if not blocks:
        return  # nothing to run (tables and prose only)
    namespace = {"__name__": f"docs_{page.stem}"}
    name = page.relative_to(ROOT)
    for line, source in blocks:
        try:
            code = compile(source, f"{name}:{line}", "exec")
            exec(code, namespace)
        except ModuleNotFoundError as e:
            if e.name and e.name.split(".")[0] in OPTIONAL:
                pytest.skip(f"{name}, block at line {line}: needs the optional package {e.name}")
            raise AssertionError(f"{name}, python block at line {line} failed:\n{traceback.format_exc()}") from e
        except Exception as e:
            raise AssertionError(f"{name}, python block at line {line} failed:\n{traceback.format_exc()}") from e


def _modules() -> list[str]:
    names = [blocksparse.__name__]
    for info in pkgutil.walk_packages(blocksparse.__path__, prefix=f"{blocksparse.__name__}."):
        if info.name.split(".")[-1] != "__main__":
            names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("module_name", _modules())
def test_docstring_examples(module_name):
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] in OPTIONAL:
            pytest.skip(f"{module_name} needs the optional package {e.name}")
        raise
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = [t for t in finder.find(module, module_name) if t.examples]
    report = []
    for test in tests:
        # Only examples written in this module: objects re-exported from elsewhere are tested there.
        if test.filename and Path(test.filename).resolve() != Path(module.__file__).resolve():
            continue
        result = runner.run(test, out=report.append)
        assert not result.failed, f"{module_name}: docstring example of {test.name} failed:\n{''.join(report)}"
