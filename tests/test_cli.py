"""The command line (``python -m blocksparse``), run in-process: results, and one-line errors with exit status 2.

``bench`` has its own tests in test_bench.py (its suites, exit codes, JSON and figures).
"""

import json
import time

import pytest

from blocksparse.__main__ import MAX_GRID_BLOCKS, MAX_N, MAX_NNZ_BLOCKS, main


def _fails(capsys, argv) -> str:
    """Run ``argv``: it must exit with status 2 and a one-line message, no traceback. Returns the message."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("python -m blocksparse") and ": error: " in lines[0]
    return lines[0]


# -- successful runs ------------------------------------------------------------------------------------
def test_plan_writes_report_and_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    argv = ["plan", "--m", "1024", "--k", "512", "--n", "256", "--block", "8", "--density", "1/16",
            "--dtype", "float32", "--machine", "mk2", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "Static block-sparse plan" in text and "predicted speedup over dense" in text and f"wrote {out}" in text
    d = json.loads(out.read_text())
    assert d["machine"] == "mk2" and d["dtype"] == "float32" and d["shape"] == [1024, 512] and d["nnz_blocks"] == 512


@pytest.mark.parametrize("density", ["1/16", "0.0625"])
def test_demo_small_run_reports_implementation_error_verdict_speedup(capsys, density):
    argv = ["demo", "--size", "128", "--n", "32", "--block", "16", "--density", density, "--repeats", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "nnz_blocks=4" in out  # 1/16 of the 8 x 8 grid
    assert "implementation: dsd: " in out  # recorded while the product was traced
    assert "relative error vs dense" in out and "verdict: within the float32 tolerance" in out
    assert "speedup over dense jnp.dot: " in out and "ms over 2 calls" in out


@pytest.mark.parametrize("cmd", ["bench", "demo", "plan"])
def test_every_option_has_help_and_shows_its_default(capsys, cmd):
    with pytest.raises(SystemExit) as info:
        main([cmd, "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    options = [w.split()[0] for w in text.split("\n  --")[1:]]
    assert len(options) >= 7
    for block in text.split("\n  --")[1:]:
        assert "(default: " in " ".join(block.split()), block


def test_top_level_help_lists_bench_demo_and_plan(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert all(f"    {cmd}" in text for cmd in ("bench", "demo", "plan"))


def test_a_missing_subcommand_is_one_line(capsys):
    assert "the following arguments are required: cmd" in _fails(capsys, [])


# -- bad input: one line, naming expected and actual, exit status 2 ---------------------------------------
@pytest.mark.parametrize(
    "argv, expected",
    [
        (["plan", "--m", "0"], "argument --m: expected a positive integer, got 0"),
        (["plan", "--n", "-3"], "argument --n: expected a positive integer, got -3"),
        (["plan", "--block", "x"], "argument --block: expected a positive integer, got 'x'"),
        (["plan", "--density", "0"], "argument --density: expected a density such as 1/16 or 0.0625 in (0, 1], got '0"),
        (["plan", "--density", "3/2"], "in (0, 1], got '3/2'"),
        (["demo", "--density", "0"], "argument --density: expected a density"),
        (["demo", "--repeats", "0"], "argument --repeats: expected a positive integer, got 0"),
        (["plan", "--available-memory-proportion", "1.5"], "expected a proportion such as 0.6 in (0, 1], got '1.5'"),
        (["plan", "--m", "1000", "--block", "16"], "expected --block to divide --m and --k; got --block 16 for"),
        (["demo", "--size", "100"], "expected --block to divide --size; got --block 16 for a 100 x 100 matrix"),
        (["plan", "--n", str(MAX_N + 1)], f"expected --n <= MAX_N={MAX_N:,}; got {MAX_N + 1:,}"),
        (["demo", "--size", "8192", "--n", "8192", "--block", "64"], "expected at most MAX_DEMO_ELEMENTS="),
    ],
)  # fmt: skip
def test_bad_values(capsys, argv, expected):
    assert expected in _fails(capsys, argv)


@pytest.mark.parametrize(
    "argv, cap, got",
    [
        (["plan", "--m", "10000000", "--k", "10000000"], f"MAX_GRID_BLOCKS={MAX_GRID_BLOCKS:,}", "= 390,625,000,000"),
        (["plan", "--m", "10000000"], f"MAX_GRID_BLOCKS={MAX_GRID_BLOCKS:,}", "625,000 x 256 = 160,000,000"),
        (["plan", "--m", "8192", "--k", "8192", "--block", "4", "--density", "1/2"],
         f"MAX_NNZ_BLOCKS={MAX_NNZ_BLOCKS:,}", "0.5 x 4,194,304 = 2,097,152"),
    ],
)  # fmt: skip
def test_size_guards_refuse_before_allocating(capsys, argv, cap, got):
    t0 = time.perf_counter()
    msg = _fails(capsys, argv)
    assert time.perf_counter() - t0 < 5.0  # refused up front, not after allocating or planning
    assert cap in msg and got in msg


def test_json_to_an_unwritable_path(tmp_path, capsys):
    missing = tmp_path / "no-such-folder" / "plan.json"
    small = ["plan", "--m", "256", "--k", "256", "--n", "64"]
    msg = _fails(capsys, [*small, "--json", str(missing)])
    assert "expected --json to name a writable file" in msg and repr(str(missing)) in msg
    assert "does not exist" in msg
    msg = _fails(capsys, [*small, "--json", str(tmp_path)])  # a folder
    assert repr(str(tmp_path)) in msg and "it is a directory" in msg


@pytest.mark.parametrize("cmd", ["demo", "plan"])
def test_density_that_keeps_no_block(capsys, cmd):
    size = ["--size", "64"] if cmd == "demo" else ["--m", "64", "--k", "64"]
    msg = _fails(capsys, [cmd, *size, "--block", "16", "--density", "0.01"])
    assert "keeps none" in msg and "--density >= 1/16" in msg


def test_no_valid_plan_is_one_line_with_checked_advice(capsys):
    msg = _fails(capsys, ["plan", "--m", "256", "--k", "256", "--n", "1000000", "--available-memory-proportion", "0.1"])
    assert "No valid plan" in msg and "reduce n to at most" in msg
