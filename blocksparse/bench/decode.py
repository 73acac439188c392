"""The ``decode`` suite: few-token products at the memory limit, and generation tokens/s of a Llama decoder.

Two kinds of cells:

- ``product``: ``x (n, K) @ W (K, N)`` (``x @ W``, the ``dds`` product of a linear layer) and ``W (N, K) @ x
  (K, n)`` (``W @ x``) with ``W`` a uniformly random block pattern, for the decode shapes ``K x N`` of a
  Llama-8B-sized FFN (4096 x 14336 and 14336 x 4096) and ``n`` from 1 to 64 tokens; checked against a float32
  product of the same values, timed both ways (:class:`~blocksparse.bench.Timer`), with dense ``jnp.dot`` of
  the same shape and dtype in the same cell (``dense_*``), the work-list Triton kernel the few-token kernel
  replaced (``worklist_*``: ``TritonConfig(stream=False)``), the speedup and the bandwidth of the bytes moved
  (``kept_gbs``: the blocks kept, their indices, ``x`` and ``y``; ``dense_gbs``: the dense weight, ``x``,
  ``y``). At the tuning cells (``tune``: tokens and density; ``None``: every cell) the cell also times the
  few-token kernel's variants of ``variants`` (``TritonConfig`` fields: sub-tile, blocks per step, warps,
  stages) as ``{name}_*``. On a GPU, ``kernel_us`` / ``busy_us`` (and ``dense_*``, ``{variant}_*``) come from a
  profiler trace of the Timer's loop (:func:`~blocksparse.bench._trace.kernel_us`): the loop's own work is
  most of an iteration of a few microseconds. ``x @ W glu`` cells are the gate and up projections of a SwiGLU
  MLP side by side in one ``W (K, 2 F)`` (SwiGLU shapes of the 1B and 8B configs), ``silu(gate) * up`` gated in the
  product's store (``bs.matmul(..., activation="silu", glu=True)``), against dense ``jnp.dot`` and the gate in
  XLA after it, and the same sparse product with the gate after it (``gate_after_*``). ``glu x @ W`` cells are a
  SwiGLU's down projection on the gate/up product's output ``x (n, 2 K)``: ``(silu(gate) * up) @ W (K, N)``, the gate
  where the kernel loads ``x`` (``bs.matmul(x, W, input_glu="silu")``), against dense ``jnp.dot`` after the gate in
  XLA, and the same sparse product after the gate in XLA (``gate_first_*``);
- ``layers``: a decoder layer's product ``x (n, K) @ W (K, N)`` at the 1B config's shapes (q/k/v fused, o, gate/up
  fused, down), ``count`` times in a row with ``count`` distinct random patterns and weights, as a model's step runs
  it (neither the weights nor the walks' indices of a 1B model stay in L2 from one layer to the next, where a loop
  over one product keeps them there). Each product is checked against the float32 dense product; on a GPU
  ``kernel_us`` is the products' own kernels (named ``bs_*``) and ``busy_us`` every launch of the sequence, per
  product, from a profiler trace of the Timer's loop; dense ``jnp.dot`` on the same ``count`` weights beside them
  (``dense_busy_us``). The few-token kernel's launch variants of ``layer_variants`` (sub-tile, parts, warps, blocks
  per step) and the work list as ``{name}_*``; ``balanced_*``: the same on column-balanced patterns (every block
  column of ``W`` keeps the same number of blocks, as ``prune_decoder(..., balance="cols")`` prunes: every walk of
  ``x @ W`` equally long); ``ordered_*`` (GPU): those with ``W``'s blocks handed to the kernel in walk order
  (:func:`blocksparse.ops.matmul.triton.stream.dds`'s ``ordered``: no index load before a block's), what a
  column-ordered storage would give;
- ``generate``: :func:`blocksparse.models.generate` of a Llama decoder with **random weights** (said in
  every row's label): a prompt then greedy decoding as one jitted program, ``tokens_per_s`` = batch x new
  tokens / the program's time (prefill included; ``prefill_ms`` alone beside it). Dense, and pruned by
  :func:`blocksparse.models.prune_decoder` (every projection of every layer; the embeddings and the head
  stay dense). Each cell checks its greedy tokens against the argmax of its own logits recomputed over the
  whole sequence (a token may differ from it only within the dtype's rounding of a near-tie), and a
  pruned model against the same pruned weights held by dense layers (logits on the same sequence; in
  bfloat16 against that dense model in float32, within twice the dense bfloat16 model's own error
  ``dense_half_rel_err`` plus 1e-2; ``tokens_equal``: the fraction of greedy tokens both pick). A pruned
  cell also times the model with its projections fused (:func:`blocksparse.models.fuse_projections`: q, k, v
  and gate, up one product each; ``fused_*``), its greedy tokens checked against its own logits, and that
  fused model with its one-token steps' rotary embedding, cache update and attention in one launch per layer
  (:func:`blocksparse.ops.attention.decode_step_attention`, ``fused_attention_*``), checked the same way;
- ``generate_steps``: the fastest pruned model alone (fused, Pallas steps: the last variant of a ``generate``
  cell), also pruned with ``balance="cols"`` (every walk of its ``x @ W`` products equally long), its greedy tokens
  checked against its own logits, timed against the dense model in the same process
  (``speedup_vs_dense``) and traced; a cell that fits one short command where the ``generate`` cell at batch 32
  (five models compiled and timed) does not.

Quick (CPU) sizes: a tiny decoder and small products, in seconds. Full sizes (GPU, bf16): the 1B-class
config (hidden 2048, 16 layers, 32 heads and 8 KV heads, FFN 8192, vocabulary 32000) at batch 1, 8 and 32
with a 128-token prompt and 128 new tokens, dense and b = 32, 64 x d = 1/4, 1/8; the products at
b = 16, 32, 64, 128 x d = 1/4, 1/8, 1/16 and n = 1, 16, 64, both orientations. transformers' model of the same
configuration is timed by ``benchmarks/check_llama.py`` (it needs torch).
"""

from __future__ import annotations

import functools
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np

import blocksparse as bs

from ._core import Cell, CellFailed, Timer, check_close, implementation, measure, missing, ratio, tolerance, variant
from ._trace import kernel_us, trace_loop

#: A 1B-class Llama (the shape of TinyLlama-1.1B's layers with a 2048 context): the full mode's model.
LLAMA_1B = dict(vocab_size=32000, hidden_size=2048, num_layers=16, num_heads=32, num_kv_heads=8,
                intermediate_size=8192, max_positions=2048)  # fmt: skip
#: The quick mode's decoder: the same structure, CPU-sized.
LLAMA_TINY = dict(vocab_size=256, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
                  max_positions=128)  # fmt: skip

#: The few-token kernel's variants timed at the tuning density (TritonConfig fields, each with ``stream=True``;
#: the tuned table's ``TRITON_STREAM_*`` entries are the default they are measured against). ``stream``: the
#: kernel's own default plan, also where the dispatch picks the work list.
STREAM_VARIANTS = {
    "stream": {},
    "split1": dict(stream_split=1),
    "split2": dict(stream_split=2),
    "split4": dict(stream_split=4),
    "split8": dict(stream_split=8),
    "group2": dict(stream_group=2),
    "group8": dict(stream_group=8),
    "warps2": dict(num_warps=2),
    "warps8": dict(num_warps=8),
    "stages2": dict(num_stages=2),
    "stages5": dict(num_stages=5),
    "tile16": dict(tn=16, tb=16),
    "tile64": dict(tn=64, tb=64),
}
#: The variants a gated cell times at the tuning density (its two walks per program change the sub-tile's trade).
GATED_VARIANTS = ("group2", "group8", "tile16", "tile64", "warps8")
#: The variants a gated-input cell times at the tuning density (its gate between the loads of x and the dot changes
#: what Triton's pipeliner can overlap): its own stages and groups, and the plain cells' other variants.
GATED_INPUT_VARIANTS = {
    "stages1": dict(num_stages=1),
    "stages3": dict(num_stages=3),
    "group1": dict(stream_group=1),
    **{k: STREAM_VARIANTS[k] for k in ("stages2", "group2", "warps2", "warps8", "tile64")},
}
#: The few-token kernel's variants a ``layers`` cell times (TritonConfig fields, each with ``stream=True``): more and
#: fewer programs, split walks, warps, one block a step.
LAYER_VARIANTS = {k: STREAM_VARIANTS[k] for k in ("tile16", "tile64", "split2", "split4", "warps2")} | {
    "tile16_warps2": dict(tn=16, num_warps=2), "group1": dict(stream_group=1)}  # fmt: skip
#: The 1B config's layer products ``(K, N)``: q/k/v fused, o, gate/up fused, down.
LAYERS_1B = ((2048, 3072), (2048, 2048), (2048, 16384), (8192, 2048))
#: Named sizes: ``tiny`` for tests, ``quick`` for the CPU default, ``full`` for the GPU figures.
SIZES = {
    "tiny": dict(products=((128, 256),), ns=(4,), blocks=(32,), densities=(1 / 4,), ops=("x @ W",), gated=(),
                 gated_input=(dict(K=128, N=64, n=2, block_size=32, density=1 / 4),),
                 variants={"group1": dict(stream_group=1)}, tune=None,
                 layers=dict(shapes=((128, 128),), ns=(2,), blocks=(32,), densities=(1 / 4,), count=2,
                             variants={"group1": dict(stream_group=1)}),
                 model=dict(LLAMA_TINY, vocab_size=64, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=32),
                 batches=(2,), prompt=4, new_tokens=4, gen_blocks=(16,),
                 gen_densities=(1 / 4,), steps=dict(batches=(2,), prunings=((16, 1 / 4), (16, 1 / 2, "cols"))),
                 dtype="float32"),
    "quick": dict(products=((256, 512), (512, 256)), ns=(1, 16), blocks=(32,), densities=(1 / 4,),
                  ops=("x @ W", "W @ x"), variants={"group1": dict(stream_group=1)}, tune=None,
                  gated=(dict(K=256, N=512, n=1, block_size=32, density=1 / 4),),
                  gated_input=(dict(K=256, N=128, n=1, block_size=32, density=1 / 4),),
                  layers=dict(shapes=((256, 256),), ns=(1,), blocks=(32,), densities=(1 / 4,), count=2,
                              variants={"group1": dict(stream_group=1)}),
                  model=LLAMA_TINY, batches=(1, 4), prompt=8, new_tokens=8, gen_blocks=(16,), gen_densities=(1 / 4,),
                  steps=dict(batches=(), prunings=()), dtype="float32"),
    "full": dict(products=((4096, 14336), (14336, 4096)), ns=(1, 16, 64), blocks=(16, 32, 64, 128),
                 densities=(1 / 4, 1 / 8, 1 / 16), ops=("x @ W", "W @ x"), variants=STREAM_VARIANTS, tune=(1, 1 / 8),
                 gated=tuple(dict(K=k, N=f, n=n, block_size=b, density=d) for k, f in ((2048, 16384), (4096, 28672))
                             for n in (1, 8, 32) for b in (32, 64) for d in (1 / 4, 1 / 8)),
                 gated_input=tuple(dict(K=f, N=h, n=n, block_size=b, density=d)
                                   for f, h in ((8192, 2048), (14336, 4096))
                                   for n in (1, 8, 32) for b in (32, 64) for d in (1 / 4, 1 / 8)),
                 layers=dict(shapes=LAYERS_1B, ns=(1, 8), blocks=(64,), densities=(1 / 8,), count=16,
                             variants=LAYER_VARIANTS),
                 model=LLAMA_1B, batches=(1, 8, 32), prompt=128, new_tokens=128,
                 gen_blocks=(32, 64), gen_densities=(1 / 4, 1 / 8),
                 steps=dict(batches=(1, 8, 32), prunings=((64, 1 / 8), (64, 1 / 8, "cols"))), dtype="bfloat16"),
}  # fmt: skip

#: Columns of this suite's table: (header, metric key, format).
COLUMNS = (
    ("loop ms", "loop_ms", ".4g"),
    ("calls ms", "calls_ms", ".4g"),
    ("dense ms", "dense_loop_ms", ".4g"),
    ("x dense", "speedup_vs_dense", ".3g"),
    ("kernel us", "kernel_us", ".4g"),
    ("dense kernel us", "dense_kernel_us", ".4g"),
    ("GB/s kept", "kept_gbs", ".4g"),
    ("tok/s", "tokens_per_s", ".4g"),
    ("prefill ms", "prefill_ms", ".4g"),
    ("rel err", "rel_err", ".2g"),
)

#: Generation timings run fewer iterations than the Timer's (one iteration is a whole generation).
GENERATE_ITERS = 3


def density_label(d: float) -> str:
    f = Fraction(d).limit_denominator(1 << 16)
    return str(f) if f != 1 else "1"


def cells(*, full: bool) -> list[Cell]:
    return suite(**SIZES["full" if full else "quick"])


def suite(*, products, ns, blocks, densities, ops, variants, tune, gated, gated_input, layers, model, batches, prompt,
          new_tokens, gen_blocks, gen_densities, steps, dtype) -> list[Cell]:  # fmt: skip
    """The cells of one size: every product, the gated ones (output, then input), the layer sequences, the fastest
    pruned models alone (``steps``), then generation at every batch (dense, then each pruning)."""
    out = []
    for op in ops:
        for k, n_out in products:
            for n in ns:
                for b in blocks:
                    for d in densities:
                        params = dict(kind="product", op=op, K=k, N=n_out, n=n, block_size=b, density=d, dtype=dtype)
                        if tune is None or (n, d) == tune:
                            params["variants"] = variants
                        if op == "x @ W":
                            label = f"x ({n}, {k}) @ W ({k}, {n_out}) b={b} d={density_label(d)}"
                        else:
                            label = f"W ({n_out}, {k}) @ x ({k}, {n}) b={b} d={density_label(d)}"
                        out.append(Cell("decode", label, params, functools.partial(_product, params)))
    for g in gated:
        params = dict(kind="product", op="x @ W glu", dtype=dtype, **g)
        if tune is None or (g["n"], g["density"]) == tune:  # the launch shape's variants that a gated walk changes
            params["variants"] = {k: v for k, v in variants.items() if k in GATED_VARIANTS}
        label = (f"silu glu x ({g['n']}, {g['K']}) @ W ({g['K']}, {g['N']}) b={g['block_size']} "
                 f"d={density_label(g['density'])}")  # fmt: skip
        out.append(Cell("decode", label, params, functools.partial(_product, params)))
    for g in gated_input:
        params = dict(kind="product", op="glu x @ W", dtype=dtype, **g)
        if tune is None or (g["n"], g["density"]) == tune:  # the full size's variants: the gated input's own
            params["variants"] = GATED_INPUT_VARIANTS if variants is STREAM_VARIANTS else variants
        label = (f"silu-gated x ({g['n']}, {2 * g['K']}) @ W ({g['K']}, {g['N']}) b={g['block_size']} "
                 f"d={density_label(g['density'])}")  # fmt: skip
        out.append(Cell("decode", label, params, functools.partial(_product, params)))
    for n in layers["ns"]:
        for k, n_out in layers["shapes"]:
            for b in layers["blocks"]:
                for d in layers["densities"]:
                    params = dict(kind="layers", op="x @ W", K=k, N=n_out, n=n, block_size=b, density=d, dtype=dtype,
                                  count=layers["count"], variants=layers["variants"])  # fmt: skip
                    label = f"layers {layers['count']} x x ({n}, {k}) @ W ({k}, {n_out}) b={b} d={density_label(d)}"
                    out.append(Cell("decode", label, params, functools.partial(_layers, params)))
    ctx = _Generation(model, prompt, new_tokens, dtype)
    for batch in steps["batches"]:
        for b, d, *balance in steps["prunings"]:
            balance = balance[0] if balance else None
            params = dict(kind="generate_steps", batch=batch, prompt=prompt, new_tokens=new_tokens, block_size=b,
                          density=d, balance=balance, dtype=dtype, weights="random",
                          **{f"model_{k}": v for k, v in model.items()})  # fmt: skip
            what = f"b={b} d={density_label(d)}" + (f" {balance}" if balance else "")
            label = f"generate {what} batch={batch} fused, Pallas steps [random weights]"
            out.append(Cell("decode", label, params, functools.partial(_generate_steps, ctx, batch, b, d, balance)))
    for batch in batches:
        for b, d in [(None, None)] + [(b, d) for b in gen_blocks for d in gen_densities]:
            params = dict(kind="generate", batch=batch, prompt=prompt, new_tokens=new_tokens, block_size=b, density=d,
                          dtype=dtype, weights="random", **{f"model_{k}": v for k, v in model.items()})  # fmt: skip
            what = "dense" if b is None else f"b={b} d={density_label(d)}"
            label = f"generate {what} batch={batch} [random weights]"
            out.append(Cell("decode", label, params, functools.partial(_generate, ctx, batch, b, d)))
    return out


# -- products -----------------------------------------------------------------------------------------
def _sparse_first(W, x, config=None):
    return bs.matmul(W, x, config=config)


def _sparse_last(x, W, config=None):
    return bs.matmul(x, W, config=config)


def _dense(a, b):
    return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)


def _gated(x, W, config=None):
    return bs.matmul(x, W, activation="silu", glu=True, config=config)


def _gate(y):
    gate, up = jnp.split(y.astype(jnp.float32), 2, axis=-1)
    return (jax.nn.silu(gate) * up).astype(y.dtype)


def _gate_after(x, W):
    """The gate and up projections as the fused model ran them before the gated epilogue: one product, the gate in
    XLA."""
    return _gate(bs.matmul(x, W))


def _dense_gated(x, w):
    return _gate(_dense(x, w))


def _input_gated(x, W, config=None):
    return bs.matmul(x, W, input_glu="silu", config=config)


def _gate_first(x, W):
    """A SwiGLU's down projection as the fused model ran it before the gated input: the gate in XLA, then the
    product."""
    return bs.matmul(_gate(x), W)


def _dense_input_gated(x, w):
    return _dense(_gate(x), w)


def _product(p: dict, timer: Timer) -> dict:
    from ..ops.matmul.triton import TritonConfig

    dtype = jnp.dtype(p["dtype"])
    k, n_out, n, b, d = p["K"], p["N"], p["n"], p["block_size"], p["density"]
    op = p.get("op", "x @ W")
    dense_fn = {"x @ W glu": _dense_gated, "glu x @ W": _dense_input_gated}.get(op, _dense)
    if op in ("x @ W", "x @ W glu", "glu x @ W"):
        W = bs.random(jax.random.key(0), (k, n_out), b, d, dtype=dtype)
        x = jax.random.normal(jax.random.key(1), (n, 2 * k if op == "glu x @ W" else k), jnp.float32).astype(dtype)
        fn = {"x @ W glu": _gated, "glu x @ W": _input_gated}.get(op, _sparse_last)
        args, dense_args = (x, W), lambda w: (x, w)
    else:
        W = bs.random(jax.random.key(0), (n_out, k), b, d, dtype=dtype)
        x = jax.random.normal(jax.random.key(1), (k, n), jnp.float32).astype(dtype)
        fn, args, dense_args = _sparse_first, (W, x), lambda w: (w, x)
    dense_w = W.to_dense()
    a32, b32 = (t.astype(jnp.float32) for t in dense_args(dense_w))
    if op == "glu x @ W":  # the product of the gated operand
        a32 = _gate(x).astype(jnp.float32)
    want = jnp.dot(a32, b32, precision=jax.lax.Precision.HIGHEST)
    if op == "x @ W glu":
        want = _gate(want)
    tol = None if dtype == jnp.float32 else 2 * tolerance(dtype)
    with bs.dispatch_log() as log:
        got = jax.block_until_ready(jax.jit(fn)(*args))
    rel_err = check_close(got, want, dtype=dtype, tol=tol, what=f"{op} vs the float32 dense product")
    loop_ms, calls_ms = timer.loop(fn, *args), timer.calls(fn, *args)
    out = dict(loop_ms=loop_ms, calls_ms=calls_ms, rel_err=rel_err, implementation=implementation(log))
    out.update(variant(timer, "dense", dense_fn, *dense_args(dense_w), want=want, dtype=dtype, tol=tol,
                       what="dense jnp.dot"))  # fmt: skip
    if op == "x @ W glu":
        out.update(variant(timer, "gate_after", _gate_after, *args, want=want, dtype=dtype, tol=tol,
                           what="the product, then the gate in XLA"))  # fmt: skip
        ratio(out, "gate_after_loop_ms", "loop_ms", "gate_after_time_ratio")  # > 1: gating in the store is faster
    if op == "glu x @ W":
        out.update(variant(timer, "gate_first", _gate_first, *args, want=want, dtype=dtype, tol=tol,
                           what="the gate in XLA, then the product"))  # fmt: skip
        ratio(out, "gate_first_loop_ms", "loop_ms", "gate_first_time_ratio")  # > 1: gating in the load is faster
    if missing("gpu") is None:  # the kernels' own time: the loop's own work is most of a few-microsecond product
        out.update(kernel_us(timer, fn, *args))
        out.update({f"dense_{k}": v for k, v in kernel_us(timer, dense_fn, *dense_args(dense_w)).items()})
        ratio(out, "dense_kernel_us", "kernel_us", "kernel_speedup_vs_dense")
        if op == "glu x @ W":  # the gate's own launch counts in the busy time
            out.update({f"gate_first_{k}": v for k, v in kernel_us(timer, _gate_first, *args).items()})
            ratio(out, "gate_first_busy_us", "busy_us", "gate_first_busy_ratio")
    configs = {"worklist": dict(stream=False), **p.get("variants", {})}
    for name, fields in configs.items():
        fields = fields if name == "worklist" else dict(stream=True, **fields)
        run = functools.partial(fn, config=TritonConfig(**fields))
        got = variant(timer, name, run, *args, needs="gpu", want=want, dtype=dtype, tol=tol, what=name)
        if f"{name}_loop_ms" in got:
            got.update({f"{name}_{k}": v for k, v in kernel_us(timer, run, *args).items()})
        out.update(got)
        ratio(out, f"{name}_kernel_us", "kernel_us", f"{name}_time_ratio")  # > 1: the default is faster
    item = dtype.itemsize
    io = (n * k * (2 if op == "glu x @ W" else 1) + n * n_out // (2 if op == "x @ W glu" else 1)) * item
    kept = W.nnz_blocks * b * b * item + W.nnz_blocks * 4 + (W.shape[0] // b + 1) * 4 + io  # blocks, indices
    out.update(kept_gbs=kept / (loop_ms * 1e-3) / 1e9, dense_gbs=(k * n_out * item + io) / (out["dense_loop_ms"] * 1e-3)
               / 1e9, speedup_vs_dense=out["dense_loop_ms"] / loop_ms, calls_vs_dense=out["dense_calls_ms"] / calls_ms,
               ideal_speedup=1 / W.density)  # fmt: skip
    return out


def _layers(p: dict, timer: Timer) -> dict:
    """A ``layers`` cell (see the module docstring): ``count`` products of distinct patterns and weights, random and
    column-balanced."""
    from ..ops.matmul.triton import TritonConfig, stream
    from ..prune import keep_count, top_blocks

    dtype = jnp.dtype(p["dtype"])
    k, n_out, n, b, d, count = p["K"], p["N"], p["n"], p["block_size"], p["density"], p["count"]
    grid = (k // b, n_out // b)

    def balanced(seed):  # every block column keeps the same number of blocks, chosen at random
        scores = np.random.default_rng(seed).random(grid)
        return bs.BlockPattern.from_mask(top_blocks(scores, keep_count(d, grid, "cols"), "cols"), b)

    def weights(patterns):
        normal = lambda i, q: 0.05 * jax.random.normal(jax.random.key(i), (q.nnz_blocks, b, b))  # noqa: E731
        return [bs.BlockSparseMatrix(q, normal(i, q).astype(dtype)) for i, q in enumerate(patterns)]

    Ws = weights([bs.BlockPattern.random(i, (k, n_out), (b, b), d) for i in range(count)])
    Wb = weights([balanced(i) for i in range(count)])
    x = jax.random.normal(jax.random.key(count), (n, k), jnp.float32).astype(dtype)
    dense_ws = [W.to_dense() for W in Ws]

    def oracle(ws):
        return [jnp.dot(x.astype(jnp.float32), w.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST) for w in ws]

    want, want_b = oracle(dense_ws), oracle([W.to_dense() for W in Wb])
    tol = None if dtype == jnp.float32 else 2 * tolerance(dtype)

    def sequence(x, Ws, config=None):
        return [bs.matmul(x, W, config=config) for W in Ws]

    # W's blocks in walk order (block column after block column), permuted once here, outside the timed products
    ordered = [W.data[np.asarray(W.pattern.transpose()[1])] for W in Wb]

    def ordered_sequence(x, datas):
        return [stream.dds(x, W.pattern, data, x.dtype, config=TritonConfig(stream=True), ordered=True)
                for W, data in zip(Wb, datas, strict=True)]  # fmt: skip

    def dense_sequence(x, ws):
        return [_dense(x, w) for w in ws]

    def per_product(fn, *args) -> dict:  # the products' kernels and every launch, per product
        t = trace_loop(fn, args, timer, timer.iters)
        if not t.get("events"):
            return {}
        own = sum(us for name, (_, us) in t["events"].items() if name.startswith("bs_"))
        return {"kernel_us": own / count, "busy_us": t["busy_us"] / count}

    out = measure(timer, sequence, x, Ws, want=want, dtype=dtype, tol=tol, what=f"{count} products")
    out.update(variant(timer, "dense", dense_sequence, x, dense_ws, want=want, dtype=dtype, tol=tol,
                       what=f"{count} dense products"))  # fmt: skip
    gpu = missing("gpu") is None
    if gpu:
        out.update(per_product(sequence, x, Ws))
        out.update({f"dense_{k}": v for k, v in per_product(dense_sequence, x, dense_ws).items()})
        ratio(out, "dense_busy_us", "busy_us", "busy_speedup_vs_dense")
    for name, fields in {"worklist": dict(stream=False), **p["variants"]}.items():
        fields = fields if name == "worklist" else dict(stream=True, **fields)
        run = functools.partial(sequence, config=TritonConfig(**fields))
        got = variant(timer, name, run, x, Ws, needs="gpu", want=want, dtype=dtype, tol=tol, what=name)
        if gpu and f"{name}_loop_ms" in got:
            got.update({f"{name}_{k}": v for k, v in per_product(run, x, Ws).items()})
        out.update(got)
        ratio(out, f"{name}_busy_us", "busy_us", f"{name}_time_ratio")  # > 1: the default is faster
    for name, run, args, ok in (("balanced", sequence, (x, Wb), want_b), ("ordered", ordered_sequence, (x, ordered),
                                                                           want_b)):  # fmt: skip
        got = variant(timer, name, run, *args, needs=None if name == "balanced" else "gpu", want=ok, dtype=dtype,
                      tol=tol, what=f"{count} {name} products")  # fmt: skip
        if gpu and f"{name}_loop_ms" in got:
            got.update({f"{name}_{k}": v for k, v in per_product(run, *args).items()})
        out.update(got)
        ratio(out, f"{name}_busy_us", "busy_us", f"{name}_time_ratio")
        ratio(out, "dense_busy_us", f"{name}_busy_us", f"{name}_busy_speedup_vs_dense")
    out["speedup_vs_dense"] = out["dense_loop_ms"] / out["loop_ms"]
    return out


# -- generation ---------------------------------------------------------------------------------------
class _Generation:
    """What the generation cells share, built on first use: the dense model, the prompts, the pruned models."""

    def __init__(self, model: dict, prompt: int, new_tokens: int, dtype: str):
        self.fields, self.prompt, self.new_tokens, self.dtype = model, prompt, new_tokens, jnp.dtype(dtype)

    @functools.cached_property
    def model(self):
        from ..models import LlamaConfig, LlamaModel

        return LlamaModel.random(jax.random.key(0), LlamaConfig(**self.fields), dtype=self.dtype, scale=0.05)

    @functools.cache  # noqa: B019 - one context per suite run
    def prompts(self, batch: int) -> jax.Array:
        vocab = self.fields["vocab_size"]
        return jax.random.randint(jax.random.key(batch), (batch, self.prompt), 0, vocab, jnp.int32)

    # The balance is always passed, positionally: functools.cache keys on the arguments as given.
    @functools.cache  # noqa: B019
    def pruned(self, b: int, d: float, balance: str | None):
        from ..models import prune_decoder

        return prune_decoder(self.model, b, d, balance=balance)

    @functools.cache  # noqa: B019
    def fused(self, b: int, d: float, balance: str | None):
        """The pruned model with q, k, v and gate, up fused into one product each (one object per pruning, so the
        ``generate`` and ``generate_steps`` cells share its compiled programs)."""
        from ..models import fuse_projections

        return fuse_projections(self.pruned(b, d, balance))

    @functools.cached_property
    def run(self):
        """The generation every cell checks and times: one function object, so its jitted program is compiled once
        per model structure and batch, whoever calls ``jax.jit`` on it."""
        return functools.partial(_reversed, new_tokens=self.new_tokens)

    @functools.cache  # noqa: B019
    def dense_loop_ms(self, batch: int, timer: Timer) -> float:
        """The dense model's generation time at ``batch``, measured once (its own cell and every ratio)."""
        return timer.loop(self.run, self.model, self.prompts(batch), iters=min(timer.iters, GENERATE_ITERS))


def _reversed(model, prompts, *, new_tokens):
    """The new tokens, last first: the Timer's probe (the first element) then depends on every decoding step."""
    from ..models import generate

    return generate(model, prompts, new_tokens)[:, ::-1]


def _prefill(model, prompts):
    cache = model.init_cache(prompts.shape[0], prompts.shape[1])
    return model.step(prompts, cache, 0, last=True)[0]


def _logits(model, seq):
    return model(seq)


def _check_greedy(logits, prompt: int, tokens, dtype, what: str) -> None:
    """Each greedy token must be the argmax of the recomputed logits, or within rounding of it (a near-tie)."""
    lg = np.asarray(logits[:, prompt - 1 : -1], np.float64)
    picked = np.take_along_axis(lg, np.asarray(tokens)[..., None], -1)[..., 0]
    gap = lg.max(-1) - picked
    scale = np.abs(lg).max() + 1e-30
    tol = (1e-4 if dtype == jnp.float32 else 0.05) * scale
    if not (gap <= tol).all():
        i = np.unravel_index(int(np.argmax(gap)), gap.shape)
        raise CellFailed(f"{what}: expected every greedy token the argmax of the recomputed logits (gap <= {tol:.3g}); "
                         f"got a gap of {gap[i]:.3g} at sequence {i[0]}, new token {i[1]}")  # fmt: skip


#: Kernels of a generation's trace kept in its cell (the most time first).
TRACE_TOP = 12


def _traced(run, model, prompts, timer: Timer, new_tokens: int, iters: int, prefix: str = "") -> dict:
    """On a GPU, the timed loop of generations under the profiler (its compiled program reused), per new
    token: busy time, launches, the top kernels."""
    if missing("gpu") is not None:
        return {}
    t = trace_loop(run, (model, prompts), timer, iters)
    if "events" not in t:
        return {}
    top = {k: [c / new_tokens, us / new_tokens] for k, (c, us) in list(t["events"].items())[:TRACE_TOP]}
    return {f"{prefix}busy_us_per_token": t["busy_us"] / new_tokens, f"{prefix}span_us_per_token": t["span_us"] /
            new_tokens, f"{prefix}launches_per_token": sum(c for c, _ in t["events"].values()) / new_tokens,
            f"{prefix}top_kernels_per_token": top}  # fmt: skip


def _timed_variant(ctx: _Generation, run, model, prompts, batch: int, timer: Timer, iters: int, prefix: str,
                   what: str) -> dict:  # fmt: skip
    """A variant of a cell's model: its greedy tokens checked against its own logits, then its loop, tokens/s and
    trace under ``prefix``."""
    tokens = jax.block_until_ready(jax.jit(run)(model, prompts))[:, ::-1]
    seq = jnp.concatenate([prompts, tokens], axis=1)
    _check_greedy(jax.jit(_logits)(model, seq), ctx.prompt, tokens, ctx.dtype, what)
    loop_ms = timer.loop(run, model, prompts, iters=iters)
    out = {f"{prefix}loop_ms": loop_ms, f"{prefix}tokens_per_s": batch * ctx.new_tokens / (loop_ms * 1e-3)}
    out.update(_traced(run, model, prompts, timer, ctx.new_tokens, iters, prefix))
    return out


def _generate_steps(ctx: _Generation, batch: int, b, d, balance, timer: Timer) -> dict:
    """A ``generate_steps`` cell: the pruned model (``balance``: see :func:`blocksparse.models.prune_decoder`) fused,
    with its Pallas steps, against the dense model."""
    model = ctx.fused(b, d, balance).with_attention("pallas")
    prompts = ctx.prompts(batch)
    iters = min(timer.iters, GENERATE_ITERS)
    with bs.dispatch_log() as log:
        out = _timed_variant(ctx, ctx.run, model, prompts, batch, timer, iters, "", "generation, Pallas steps")
    out["implementation"] = implementation(log)
    out["calls_ms"] = timer.calls(ctx.run, model, prompts, iters=iters)
    out["dense_loop_ms"] = ctx.dense_loop_ms(batch, timer)
    out["dense_tokens_per_s"] = batch * ctx.new_tokens / (out["dense_loop_ms"] * 1e-3)
    out["speedup_vs_dense"] = out["dense_loop_ms"] / out["loop_ms"]
    return out


def _generate(ctx: _Generation, batch: int, b, d, timer: Timer) -> dict:
    from ..models import block_density, densified

    model = ctx.model if b is None else ctx.pruned(b, d, None)
    prompts = ctx.prompts(batch)
    run = ctx.run
    iters = min(timer.iters, GENERATE_ITERS)
    with bs.dispatch_log() as log:
        tokens = jax.block_until_ready(jax.jit(run)(model, prompts))[:, ::-1]
    seq = jnp.concatenate([prompts, tokens], axis=1)
    logits = jax.jit(_logits)(model, seq)
    _check_greedy(logits, ctx.prompt, tokens, ctx.dtype, "generation")
    out = dict(implementation=implementation(log) if b is not None else "dense: xla dot")
    if b is not None:
        ref = densified(model)
        ref_tokens = jax.jit(run)(ref, prompts)[:, ::-1]
        want, tol = jax.jit(_logits)(ref, seq), None
        if ctx.dtype != jnp.float32:
            # Half precision: the reference is the dense model of the pruned weights in float32, and the pruned
            # model may be off by twice the dense model's own half-precision error on it (16 layers of
            # rounding), plus 1e-2.
            with jax.default_matmul_precision("highest"):
                want32 = jax.jit(_logits)(ref.astype(jnp.float32), seq)
            out["dense_half_rel_err"] = check_close(want, want32, tol=1.0, what="dense half-precision logits")
            want, tol = want32, 2 * out["dense_half_rel_err"] + 1e-2
        out["rel_err"] = check_close(logits, want, dtype=ctx.dtype, tol=tol,
                                     what="pruned logits vs its weights held densely")  # fmt: skip
        out["tokens_equal"] = float(np.mean(np.asarray(tokens) == np.asarray(ref_tokens)))
        out["block_density"] = block_density(model)
    if b is not None:  # the same pruned model with q, k, v and gate, up fused into one product each
        fused = ctx.fused(b, d, None)
        out.update(_timed_variant(ctx, run, fused, prompts, batch, timer, iters, "fused_", "fused generation"))
        out["fused_calls_ms"] = timer.calls(run, fused, prompts, iters=iters)
        # ... and its one-token steps' attention in one launch per layer (decode_step_attention; XLA off the GPU)
        out.update(_timed_variant(ctx, run, fused.with_attention("pallas"), prompts, batch, timer, iters,
                                  "fused_attention_", "fused generation, Pallas attention"))  # fmt: skip
    out["loop_ms"] = ctx.dense_loop_ms(batch, timer) if b is None else timer.loop(run, model, prompts, iters=iters)
    out["calls_ms"] = timer.calls(run, model, prompts, iters=iters)  # the checked program (compiled above)
    out["prefill_ms"] = timer.loop(_prefill, model, prompts, iters=iters)
    out.update(_traced(run, model, prompts, timer, ctx.new_tokens, iters))
    out["tokens_per_s"] = batch * ctx.new_tokens / (out["loop_ms"] * 1e-3)
    out["decode_ms_per_token"] = (out["loop_ms"] - out["prefill_ms"]) / max(ctx.new_tokens - 1, 1)
    out["dense_loop_ms"] = ctx.dense_loop_ms(batch, timer)
    out["speedup_vs_dense"] = out["dense_loop_ms"] / out["loop_ms"]
    return out
