"""Hardware counters of the library's GPU kernels, read with Nsight Compute (``ncu``), next to their timings.

For each case (an implementation of ``W @ x``, W ``m x m`` with ``b x b`` uniform random blocks at density
``1/d``, x ``m x n``, bf16) the script:

1. times the jitted product in this process (:class:`blocksparse.bench.Timer`: ``loop_ms``, device time inside
   one jitted loop; ``calls_ms``, back-to-back jitted calls);
2. runs itself again under ``ncu`` on that case alone (``--child``): the child compiles and warms up the product,
   then runs it once between ``cuProfilerStart`` / ``cuProfilerStop``, so that ncu profiles exactly the kernels
   of one call (the Pallas kernel and any XLA kernels around it, the transposes and sums of the glue);
3. records, per kernel, its duration and the counters of ncu's sections (speed of light, compute and memory
   workload, occupancy, launch statistics, warp states) and a few metrics of its own: DRAM and L2 bytes, the
   tensor pipe's active cycles (``wgmma``), shared-memory wavefronts. A metric this ncu does not know is left
   out (the list is checked against ``ncu --query-metrics``).

4. traces the timed loop itself (``jax.profiler.trace``, read back with ``jax.profiler.ProfileData``): per
   iteration, the span of the GPU's activity, the time some kernel or copy was running (``busy``), and each
   kernel's count and time, the loop's own kernels and copies included.

``kernel_sum_us`` (the kernels' durations under ncu, which serialises them) and the trace's ``busy`` against
``loop_ms`` say how much of a short product is its kernels and how much is the gaps between them.

Cases are ``IMPL:B:D:N`` with IMPL ``dense`` (``jnp.dot``), ``pallas`` (Triton), ``mosaic`` (the Mosaic backend:
the banded kernel for b = 16 / 32, the TMA + wgmma kernel for 64 / 128), ``grouped`` (the grouped Triton kernel with
the packed operand, ``grouped_kernel.CLAIMED``, whether or not the rule claims the product) or ``default``
(``implementation=None``); ``mosaic:B:D:N:KEY=VALUE,...`` runs the Mosaic kernel with those tiles (``MosaicConfig`` /
``BandConfig`` fields). Any case takes ``pattern=`` (``uniform``, the default; ``clustered``: block rows in clusters
of ``128 / b`` sharing their columns, ``BlockPattern.clustered``; ``power_law``) and ``op=`` (``dsd``: ``W @ x``, the
default; ``dds``: ``x @ W`` with x ``n x m``, the clusters then along W's block columns).

Usage (on the GPU machine; ncu reads the counters on a Firecracker machine, with ``--clock-control none``)::

    python3 benchmarks/profile_kernels.py --json $OUT/profile.json
    python3 benchmarks/profile_kernels.py --cases mosaic:64:4:4096 pallas:64:4:4096 --json $OUT/p.json
    python3 benchmarks/profile_kernels.py --cases mosaic:64:4:4096:tn=256,stages=4 --json $OUT/p_tn256.json
    python3 benchmarks/profile_kernels.py --cases grouped:16:4:4096:pattern=clustered,op=dds \
        pallas:16:4:4096:pattern=clustered,op=dds --json $OUT/p_grouped.json
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import io
import os
import shutil
import subprocess
import sys
import time

from blocksparse.bench import trace_loop

DEFAULT_CASES = [
    "dense:128:4:4096", "mosaic:128:4:4096", "mosaic:64:4:4096", "pallas:64:4:4096", "mosaic:64:16:4096",
    "mosaic:32:4:4096", "pallas:32:4:4096", "mosaic:16:4:4096", "pallas:16:4:4096",
    "dense:128:4:256", "mosaic:128:16:256", "mosaic:128:64:256", "mosaic:64:64:256", "pallas:64:64:256",
]  # fmt: skip
SECTIONS = ["SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis", "Occupancy", "LaunchStats",
            "WarpStateStats", "SchedulerStats"]  # fmt: skip
# (metric, short name); kept where ncu --query-metrics lists the metric's base name
METRICS = [
    ("dram__bytes_read.sum", "dram_read_bytes"),
    ("dram__bytes_write.sum", "dram_write_bytes"),
    ("lts__t_bytes.sum", "l2_bytes"),
    ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "tensor_active_pct"),
    ("sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active", "tensor_active_pct"),
    ("sm__inst_executed_pipe_tensor_op_gmma.sum", "gmma_instructions"),
    ("l1tex__data_pipe_lsu_wavefronts_mem_shared.sum", "smem_wavefronts"),
    ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_gmma.sum", "smem_gmma_bank_conflicts"),
    ("sm__cycles_elapsed.avg", "sm_cycles"),
]
# (section, metric name in ncu's details page, short name) summarised in the table
SUMMARY = [
    ("GPU Speed Of Light Throughput", "Duration", "duration"),
    ("GPU Speed Of Light Throughput", "Compute (SM) Throughput", "sm_pct"),
    ("GPU Speed Of Light Throughput", "Memory Throughput", "mem_pct"),
    ("GPU Speed Of Light Throughput", "L2 Cache Throughput", "l2_pct"),
    ("GPU Speed Of Light Throughput", "DRAM Throughput", "dram_pct"),
    ("Occupancy", "Achieved Occupancy", "occupancy_pct"),
    ("Launch Statistics", "Registers Per Thread", "registers"),
    ("Launch Statistics", "Grid Size", "grid"),
    ("Launch Statistics", "Waves Per SM", "waves"),
    ("Warp State Statistics", "Warp Cycles Per Issued Instruction", "cycles_per_issue"),
]


def _value(text: str):
    """A config value from the command line: an integer, ``true`` / ``false``, ``none``, or the text."""
    low = text.lower()
    if low in ("true", "false", "none"):
        return {"true": True, "false": False, "none": None}[low]
    return int(text) if text.lstrip("-").isdigit() else text


PATTERNS = ("uniform", "clustered", "power_law")
OPS = ("dsd", "dds")


def parse_case(case: str) -> tuple[str, int, int, int, dict]:
    """``"IMPL:B:D:N[:KEY=VALUE,...]"`` -> ``(impl, b, d, n, config)``; ``ValueError`` naming the expected form.

    ``pattern`` and ``op`` (any IMPL) pick W's pattern family and the orientation; the other keys (``mosaic`` only)
    set the fields of ``MosaicConfig`` (b >= 64) or ``BandConfig`` (b = 16, 32), e.g.
    ``mosaic:64:4:4096:tn=256,consumers=2``."""
    parts = case.split(":")
    impls = ("dense", "pallas", "mosaic", "grouped", "default")
    form = f"Expected a case IMPL:B:D:N[:KEY=VALUE,...] with IMPL in {impls}, positive integers"
    if len(parts) not in (4, 5) or parts[0] not in impls or not all(p.isdigit() and int(p) > 0 for p in parts[1:4]):
        raise ValueError(f"{form}. Got {case!r}.")
    config = {}
    if len(parts) == 5:
        items = [kv.split("=", 1) for kv in parts[4].split(",")]
        if not all(len(kv) == 2 and kv[0] for kv in items):
            raise ValueError(f"{form} and KEY=VALUE pairs. Got {case!r}.")
        config = {k: _value(v) for k, v in items}
        tiles = set(config) - {"pattern", "op"}
        if tiles and (parts[0] != "mosaic" or config.get("op", "dsd") != "dsd"):
            raise ValueError(f"{form}; tile fields ({sorted(tiles)}) for IMPL mosaic and op dsd only. Got {case!r}.")
        if config.get("pattern", "uniform") not in PATTERNS or config.get("op", "dsd") not in OPS:
            raise ValueError(f"{form}; pattern in {PATTERNS}, op in {OPS}. Got {case!r}.")
    return parts[0], int(parts[1]), int(parts[2]), int(parts[3]), config


def build(case: str, m: int):
    """``(fn, args)`` of one case: the product to run, jitted, and its operands (bf16, fixed seeds)."""
    import jax
    import jax.numpy as jnp

    import blocksparse as bs
    from blocksparse.bench.matmul import small_pattern
    from blocksparse.ops.matmul.mosaic import backend as pallas_mosaic
    from blocksparse.ops.matmul.mosaic import bands as pallas_mosaic_bands
    from blocksparse.ops.matmul.mosaic import dsd as mosaic_dsd
    from blocksparse.ops.matmul.triton import grouped_kernel

    impl, b, d, n, config = parse_case(case)
    config = dict(config)
    family, op = config.pop("pattern", "uniform"), config.pop("op", "dsd")
    if family == "uniform":  # (the cases before patterns: the same W)
        W = bs.random(jax.random.key(0), (m, m), b, 1.0 / d, jnp.bfloat16)
    else:  # the matmul suite's small-block patterns (clustered along the orientation's grouped axis)
        pattern = small_pattern(dict(m=m, b=b, density=1.0 / d, op=op, pattern=family), 0)
        W = bs.BlockSparseMatrix(
            pattern, jax.random.normal(jax.random.key(0), (pattern.nnz_blocks, b, b), jnp.bfloat16)
        )
    x = jax.random.normal(jax.random.key(1), (m, n) if op == "dsd" else (n, m), jnp.bfloat16)
    if impl == "dense":

        def dense(a, x):
            out = jnp.dot(*((a, x) if op == "dsd" else (x, a)), preferred_element_type=jnp.float32)
            return out.astype(x.dtype)

        return jax.jit(dense), (W.to_dense(), x)
    if config:
        module, cls = ((pallas_mosaic_bands, pallas_mosaic_bands.BandConfig) if b in pallas_mosaic_bands.BLOCKS
                       else (pallas_mosaic, mosaic_dsd.MosaicConfig))  # fmt: skip
        cfg = cls(**config)
        return jax.jit(lambda W, x: module.dsd(W.pattern, W.data, x, config=cfg)), (W, x)
    implementation = {"default": None, "grouped": "pallas"}.get(impl, impl)
    kw = dict(implementation=implementation, config=grouped_kernel.CLAIMED if impl == "grouped" else None)
    if op == "dds":
        return jax.jit(lambda W, x: bs.matmul(x, W, **kw)), (W, x)
    return jax.jit(lambda W, x: bs.matmul(W, x, **kw)), (W, x)


def _cuda_profiler(start: bool) -> None:
    """``cuProfilerStart`` / ``Stop`` on the device's primary context (the one XLA runs on)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    calls = [("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(dev), 0)),
             ("cuDevicePrimaryCtxRetain", (ctypes.byref(ctx), dev)), ("cuCtxSetCurrent", (ctx,)),
             ("cuProfilerStart" if start else "cuProfilerStop", ())]  # fmt: skip
    for call, args in calls:
        rc = getattr(cuda, call)(*args)
        if rc != 0:
            raise RuntimeError(f"Expected {call} to return CUDA_SUCCESS (0). Got {rc}.")


def child(case: str, m: int) -> int:
    """Compile and warm up one case, then run it once inside the profiler's range."""
    import jax

    fn, args = build(case, m)
    for _ in range(2):
        jax.block_until_ready(fn(*args))
    _cuda_profiler(True)
    jax.block_until_ready(fn(*args))
    _cuda_profiler(False)
    return 0


def available_metrics(ncu: str) -> list[tuple[str, str]]:
    """The entries of ``METRICS`` whose base name this ncu lists for the GPU; none where the query fails or lists
    nothing (an unknown metric would fail the whole ncu run; the sections' counters are read either way)."""
    try:
        out = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    names = {line.split()[0] for line in out.splitlines() if line.strip() and "__" in line.split()[0]}
    return [(m, s) for m, s in METRICS if m.split(".")[0] in names] if names else []


def parse_ncu_csv(text: str) -> list[dict]:
    """ncu's ``--csv --page details`` output -> one dict per profiled kernel launch, in launch order:
    ``{"id", "name", "grid", "block", "metrics": {"Section / Metric": [value, unit]}}``. Lines before the CSV
    header (ncu's own messages) are skipped; values are floats where they parse as numbers."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    kernels: dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if not row.get("ID") or not row.get("Metric Name"):
            continue
        k = kernels.setdefault(row["ID"], {"id": int(row["ID"]), "name": row.get("Kernel Name", ""),
                                           "grid": row.get("Grid Size", ""), "block": row.get("Block Size", ""),
                                           "metrics": {}})  # fmt: skip
        value = row.get("Metric Value", "").replace(",", "")
        try:
            value = float(value)
        except ValueError:
            pass
        k["metrics"][f"{row.get('Section Name', '')} / {row['Metric Name']}"] = [value, row.get("Metric Unit", "")]
    return sorted(kernels.values(), key=lambda k: k["id"])


def summarise(kernel: dict, extra: list[tuple[str, str]]) -> dict:
    """The ``SUMMARY`` and ``METRICS`` values of one parsed kernel (durations in us, bytes in bytes)."""
    out = {"name": kernel["name"][:120], "grid": kernel["grid"], "block": kernel["block"]}
    metrics = kernel["metrics"]
    for section, metric, short in SUMMARY:
        value, unit = metrics.get(f"{section} / {metric}", [None, ""])
        if short == "duration" and isinstance(value, float):
            value = value * {"ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(unit, 1e-3)
            short = "duration_us"
        out[short] = value
    for name, short in extra:
        hit = [v for k, v in metrics.items() if k.endswith(f"/ {name}")]
        out[short] = hit[0][0] if hit else None
    return out


def profile(case: str, m: int, ncu: str, extra: list[tuple[str, str]], timeout: int) -> dict:
    """Run one case under ncu (a child process); the parsed kernels, or the reason none came back."""
    cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--csv", "--page", "details",
           "--target-processes", "all"]  # fmt: skip
    for s in SECTIONS:
        cmd += ["--section", s]
    if extra:
        cmd += ["--metrics", ",".join(name for name, _ in extra)]
    cmd += [sys.executable, os.path.abspath(__file__), "--child", case, "--m", str(m)]
    t0 = time.perf_counter()
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"ncu ran past {timeout} s", "seconds": time.perf_counter() - t0}
    kernels = parse_ncu_csv(run.stdout)
    result = {"seconds": time.perf_counter() - t0, "kernels": [summarise(k, extra) for k in kernels],
              "raw": kernels}  # fmt: skip
    if not kernels:
        result["error"] = f"ncu exited {run.returncode} with no kernel: {(run.stderr or run.stdout)[-1500:]}"
    durations = [k.get("duration_us") for k in result["kernels"]]
    if durations and all(isinstance(v, float) for v in durations):
        result["kernel_sum_us"] = sum(durations)
    return result


def _fmt(v, spec="{:.3g}") -> str:
    return "-" if v is None else spec.format(v) if isinstance(v, float) else str(v)


def table(rows: list[dict]) -> str:
    head = ("case", "loop us", "calls us", "kernel", "us", "SM%", "mem%", "L2%", "DRAM MB", "L2 MB", "tensor%", "occ%",
            "regs", "cyc/issue")  # fmt: skip
    lines = [" | ".join(head)]
    for r in rows:
        for i, k in enumerate(r.get("kernels") or [{}]):
            mb = [None if k.get(f) is None else k[f] / 1e6 for f in ("dram_read_bytes", "l2_bytes")]
            if mb[0] is not None and k.get("dram_write_bytes") is not None:
                mb[0] += k["dram_write_bytes"] / 1e6
            lead = (r["case"], _fmt(r.get("loop_ms") and r["loop_ms"] * 1e3), _fmt(r.get("calls_ms") and r["calls_ms"]
                    * 1e3)) if i == 0 else ("", "", "")  # fmt: skip
            lines.append(" | ".join(lead + (k.get("name", r.get("error", ""))[:48], _fmt(k.get("duration_us")),
                         *(_fmt(k.get(f)) for f in ("sm_pct", "mem_pct", "l2_pct")), _fmt(mb[0]), _fmt(mb[1]),
                         *(_fmt(k.get(f)) for f in ("tensor_active_pct", "occupancy_pct", "registers",
                                                    "cycles_per_issue")))))  # fmt: skip
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="+", default=DEFAULT_CASES, help="IMPL:B:D:N (see the module docstring)")
    ap.add_argument("--m", type=int, default=8192, help="W is m x m, x m x n")
    ap.add_argument("--ncu", default=shutil.which("ncu") or "ncu")
    ap.add_argument("--timeout", type=int, default=240, help="seconds for one case under ncu")
    ap.add_argument("--no-ncu", action="store_true", help="time (and trace) only")
    ap.add_argument("--no-trace", action="store_true", help="no jax.profiler trace of the timed loop")
    ap.add_argument("--json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        return child(args.child, args.m)
    for case in args.cases:
        parse_case(case)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave the GPU's memory to the ncu child

    from blocksparse.bench import Cell, Timer, run_cells

    timer = Timer(iters=10, trials=3)
    extra = [] if args.no_ncu else available_metrics(args.ncu)
    rows = []

    def case_cell(case):
        def run(timer):
            row = {"case": case, "m": args.m}
            try:
                fn, ops = build(case, args.m)
                row["loop_ms"] = timer.loop(fn, *ops)
                row["calls_ms"] = timer.calls(fn, *ops)
                if not args.no_trace:
                    row["trace"] = trace_loop(fn, ops, timer, timer.iters)
                del fn, ops
            except Exception as e:  # noqa: BLE001 - still profiled below; the cell fails after
                row["error"] = f"{type(e).__name__}: {e}"[:400]
            if not args.no_ncu:
                prof = profile(case, args.m, args.ncu, extra, args.timeout)
                if "error" in row and "error" in prof:  # keep both reasons
                    prof["error"] = f"{row['error']}; ncu: {prof['error']}"
                row.update(prof)
            rows.append(row)
            print(table([row]).split("\n", 1)[1], flush=True)
            t = row.get("trace", {})
            if "busy_us" in t:
                top = ", ".join(f"{k[:40]} {v[0]:.3g}x {v[1]:.3g} us" for k, v in list(t["events"].items())[:6])
                print(f"  trace per iteration: span {t['span_us']:.1f} us, busy {t['busy_us']:.1f} us: {top}",
                      flush=True)  # fmt: skip
            if "error" in row:
                raise RuntimeError(row["error"])
            return dict(row, implementation=case.split(":")[0])

        impl, b, d, n, cfg = parse_case(case)
        return Cell("profile-kernels", case, dict(impl=impl, b=b, density=1 / d, n=n, m=args.m, config=cfg), run)

    meta = dict(script="benchmarks/profile_kernels.py", ncu=args.ncu, metrics=extra)
    columns = {"profile-kernels": (("loop ms", "loop_ms", ".4g"), ("calls ms", "calls_ms", ".4g"),
                                   ("kernel us", "kernel_sum_us", ".4g"))}  # fmt: skip
    status = run_cells([case_cell(c) for c in args.cases], full=True, json_path=args.json, timer=timer, meta=meta,
                       columns=columns, progress=False)  # fmt: skip
    print(table(rows))
    return status


if __name__ == "__main__":
    sys.exit(main())
