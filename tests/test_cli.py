"""The command line (``python -m blocksparse``), run in-process: results, and one-line errors with exit status 2."""

import json

import pytest

from blocksparse.__main__ import main


def _fails(capsys, argv) -> str:
    """Run ``argv``; it must exit with status 2 and a one-line message, no traceback. Returns the message."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_plan_writes_report_and_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    argv = ["plan", "--m", "1024", "--k", "512", "--n", "256", "--block", "8", "--density", "1/16",
            "--dtype", "float32", "--machine", "mk2", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "Static block-sparse plan" in capsys.readouterr().out
    d = json.loads(out.read_text())
    assert d["machine"] == "mk2" and d["dtype"] == "float32" and d["shape"] == [1024, 512]


def test_plan_block_not_dividing_shape(capsys):
    msg = _fails(capsys, ["plan", "--m", "1000", "--k", "1024", "--n", "64", "--block", "16"])
    assert "to divide the shape (1000, 1024)" in msg
