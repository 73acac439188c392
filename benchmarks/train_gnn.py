"""Node classification with the PyG-shaped layers: two-layer GCN and GATv2 on a planted-community graph.

    python benchmarks/train_gnn.py [--nodes N --communities K --feat F --epochs T] [--small] [--json out.json]
                                   [--plot out.png] [--models gcn gat] [--modes full batch] [--no-pyg]

The graph is a stochastic block model generated here: ``K`` communities of equal size, each node
with on average ``--deg-in`` neighbours in its own community and ``--deg-out`` in others (edges in
both directions); a node's features are its community's mean vector plus Gaussian noise
(``--noise``), so features alone classify poorly and the graph has to help. The label is the
community; ``--train-frac`` of the nodes are labelled (the rest are the test set).

Modes:

- ``full``: full-graph training, the graph a static :class:`blocksparse.gnn.Graph` (one compile);
- ``batch``: sampled mini-batches through :class:`blocksparse.gnn.DynamicGraph`: each step draws
  ``--batch`` nodes uniformly on the device and trains on their induced subgraph, padded to a fixed
  edge capacity (edges beyond it are dropped), so every step reuses one compilation. An epoch is
  ``N / batch`` steps; test accuracy is measured on the full graph.

Models (optax adam, cross-entropy on the labelled nodes, feature dropout 0.5 on the input and hidden
layer): ``gcn`` = ``GCNConv(F, hidden) -> relu -> GCNConv(hidden, K)``; ``gat`` =
``GATv2Conv(F, hidden / heads, heads) -> elu -> GATv2Conv(hidden, K)``; attention dropout
``--att-dropout`` (default 0: with it the attention runs on segment ops instead of the fused op).

Reported per (model, mode): test accuracy per epoch, the final one, epochs/s after the first
(compiling) epoch, and the compile time. If ``torch_geometric`` is importable (and not ``--no-pyg``)
the same models are trained in PyG on the same data in the same run (full graph), for epochs/s; else
those cells are skipped. One cell per run, written as ``blocksparse bench --json`` writes its cells.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import blocksparse as bs
from blocksparse.bench import Cell, CellSkipped, run_cells
from blocksparse.gnn.layers import GATv2Conv, GCNConv


# ------------------------------------------------------------------------------------ data
def stochastic_block_model(n: int, k: int, deg_in: float, deg_out: float, feat: int, noise: float, seed: int):
    """``(edge_index (2, E) int32, x (n, feat) float32, y (n,) int32)``: ``k`` planted communities."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % k
    rng.shuffle(y)
    by_comm = np.argsort(y, kind="stable")
    size = np.bincount(y, minlength=k)
    start = np.concatenate([[0], np.cumsum(size)[:-1]])
    # each node draws Poisson(deg / 2) partners inside and outside its community; edges go both ways
    src, dst = [], []
    for same, deg in ((True, deg_in), (False, deg_out)):
        s = np.repeat(np.arange(n), rng.poisson(deg / 2, n))
        comm = y[s] if same or k == 1 else (y[s] + rng.integers(1, k, s.size)) % k
        d = by_comm[start[comm] + (rng.random(s.size) * size[comm]).astype(np.int64)]
        src += [s, d]
        dst += [d, s]
    edge_index = np.stack([np.concatenate(src), np.concatenate(dst)]).astype(np.int32)
    means = rng.standard_normal((k, feat))
    x = means[y] + noise * rng.standard_normal((n, feat))
    x = (x - x.mean(0)) / x.std(0)  # standardised columns, as a preprocessing step would
    return edge_index, x.astype(np.float32), y.astype(np.int32)


# ------------------------------------------------------------------------------------ models
def _dropout(key, x, rate):
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def init_model(name: str, key, feat: int, hidden: int, classes: int, heads: int, att_dropout: float):
    k1, k2 = jax.random.split(key)
    if name == "gcn":
        return (GCNConv.init(k1, feat, hidden), GCNConv.init(k2, hidden, classes))
    return (GATv2Conv.init(k1, feat, hidden // heads, heads=heads, dropout=att_dropout),
            GATv2Conv.init(k2, hidden, classes, dropout=att_dropout))  # fmt: skip


def apply_model(params, x, graph, *, num_edges=None, key=None, rate=0.5):
    """Logits ``(N, classes)``; dropout (features and, if configured, attention) when ``key`` is given."""
    l1, l2 = params
    keys = [None] * 4 if key is None else list(jax.random.split(key, 4))
    act = jax.nn.relu if isinstance(l1, GCNConv) else jax.nn.elu

    def conv(layer, h, k):
        if isinstance(layer, GCNConv):
            return layer(h, graph, num_edges=num_edges)
        return layer(h, graph, num_edges=num_edges, key=k)  # attention dropout exactly when a key is given

    h = act(conv(l1, _dropout(keys[0], x, rate), keys[1]))
    return conv(l2, _dropout(keys[2], h, rate), keys[3])


def _loss(params, x, graph, y, mask, key, num_edges=None):
    logits = apply_model(params, x, graph, num_edges=num_edges, key=key)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    return jnp.sum(jnp.where(mask, ce, 0.0)) / jnp.maximum(jnp.sum(mask), 1)


def _accuracy(params, x, graph, y, mask):
    pred = jnp.argmax(apply_model(params, x, graph), axis=-1)
    return jnp.sum((pred == y) & mask) / jnp.maximum(jnp.sum(mask), 1)


def sample_subgraph(key, edge_index, n: int, batch: int, max_edges: int):
    """``batch`` nodes drawn uniformly (on the device) and their induced subgraph, relabelled and padded.

    Returns ``(nodes (batch,), edge_index (2, max_edges), num_edges)``: the counted edges first,
    then padding; edges beyond ``max_edges`` are dropped.
    """
    nodes = jax.random.permutation(key, n)[:batch]
    local = jnp.full((n,), -1, jnp.int32).at[nodes].set(jnp.arange(batch, dtype=jnp.int32))
    ls, ld = local[edge_index[0]], local[edge_index[1]]
    keep = (ls >= 0) & (ld >= 0)
    order = jnp.argsort(~keep, stable=True)[:max_edges]
    sub = jnp.stack([ls, ld])[:, order]
    num_edges = jnp.minimum(jnp.sum(keep, dtype=jnp.int32), max_edges)
    return nodes, jnp.where(jnp.arange(max_edges) < num_edges, sub, 0), num_edges


def train(name: str, mode: str, data: dict, a) -> dict:
    edge_index, x, y, train_mask, test_mask = (data[k] for k in ("edge_index", "x", "y", "train", "test"))
    n, classes = x.shape[0], int(y.max()) + 1
    params = init_model(name, jax.random.key(a.seed), x.shape[1], a.hidden, classes, a.heads, a.att_dropout)
    opt = optax.adam(a.lr)
    opt_state = opt.init(params)
    graph = bs.gnn.Graph.from_edges(edge_index[0], edge_index[1], n)
    xj, yj, trj, tej = (jnp.asarray(v) for v in (x, y, train_mask, test_mask))
    evaluate = jax.jit(_accuracy)

    if mode == "full":

        @jax.jit
        def epoch(params, opt_state, key):
            loss, grads = jax.value_and_grad(_loss)(params, xj, graph, yj, trj, key)
            updates, opt_state = opt.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

    else:
        batch = min(a.batch, n)
        steps = max(1, n // batch)
        expected = edge_index.shape[1] * (batch / n) ** 2
        max_edges = int(expected + 4 * np.sqrt(expected) + 64)
        ei_dev = jnp.asarray(edge_index)

        def step(carry, key):
            params, opt_state = carry
            ks, kd = jax.random.split(key)
            nodes, sub, count = sample_subgraph(ks, ei_dev, n, batch, max_edges)
            if name == "gcn":  # both layers share one traced graph, built once per step
                sub, count = bs.gnn.DynamicGraph.from_edge_index(sub, num_nodes=batch, num_edges=count), None
            # (GATv2Conv builds its graph with the self loops from edge_index itself)
            loss, grads = jax.value_and_grad(_loss)(params, xj[nodes], sub, yj[nodes], trj[nodes], kd, count)
            updates, opt_state = opt.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        @jax.jit
        def epoch(params, opt_state, key):
            (params, opt_state), losses = jax.lax.scan(step, (params, opt_state), jax.random.split(key, steps))
            return params, opt_state, losses.mean()

    accs, times, losses = [], [], []
    key = jax.random.key(a.seed + 1)
    for _ in range(a.epochs):
        key, sub = jax.random.split(key)
        t0 = time.perf_counter()
        params, opt_state, loss = epoch(params, opt_state, sub)
        jax.block_until_ready(params)
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
        accs.append(float(evaluate(params, xj, graph, yj, tej)))
    steady = times[1:] or times
    row = dict(framework="blocksparse", model=name, mode=mode, epochs=a.epochs, test_acc=accs, loss=losses,
               final_acc=accs[-1], best_acc=max(accs), epochs_per_s=len(steady) / sum(steady),
               first_epoch_s=times[0])  # fmt: skip
    if mode == "batch":
        row.update(batch=batch, steps_per_epoch=steps, max_edges=max_edges)
    return row


def train_pyg(name: str, data: dict, a) -> dict:
    """The same model in PyTorch Geometric, full graph, for epochs/s (its epochs timed with CUDA synchronisation)."""
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import GATv2Conv as PygGAT
    from torch_geometric.nn import GCNConv as PygGCN

    torch.manual_seed(a.seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.tensor(data["x"], device=dev)
    y = torch.tensor(data["y"], dtype=torch.long, device=dev)
    ei = torch.tensor(data["edge_index"], dtype=torch.long, device=dev)
    tr = torch.tensor(data["train"], device=dev)
    te = torch.tensor(data["test"], device=dev)
    classes = int(data["y"].max()) + 1
    f = x.shape[1]
    if name == "gcn":
        layers = torch.nn.ModuleList([PygGCN(f, a.hidden), PygGCN(a.hidden, classes)]).to(dev)
        act = F.relu
    else:
        layers = torch.nn.ModuleList([PygGAT(f, a.hidden // a.heads, heads=a.heads, dropout=a.att_dropout),
                                      PygGAT(a.hidden, classes, dropout=a.att_dropout)]).to(dev)  # fmt: skip
        act = F.elu

    def forward(train: bool):
        h = F.dropout(x, 0.5, train)
        h = F.dropout(act(layers[0](h, ei)), 0.5, train)
        return layers[1](h, ei)

    opt = torch.optim.Adam(layers.parameters(), lr=a.lr)
    accs, times = [], []
    for _ in range(a.epochs):
        t0 = time.perf_counter()
        layers.train()
        opt.zero_grad()
        loss = F.cross_entropy(forward(True)[tr], y[tr])
        loss.backward()
        opt.step()
        if dev == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        layers.eval()
        with torch.no_grad():
            accs.append(float((forward(False).argmax(-1)[te] == y[te]).float().mean()))
    steady = times[1:] or times
    return dict(framework="pyg", model=name, mode="full", epochs=a.epochs, test_acc=accs, final_acc=accs[-1],
                best_acc=max(accs), epochs_per_s=len(steady) / sum(steady), first_epoch_s=times[0])  # fmt: skip


# ------------------------------------------------------------------------------------ driver
def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=100_000)
    p.add_argument("--communities", type=int, default=8)
    p.add_argument("--feat", type=int, default=128)
    p.add_argument("--deg-in", type=float, default=12.0)
    p.add_argument("--deg-out", type=float, default=4.0)
    p.add_argument("--noise", type=float, default=3.0, help="feature noise (std) around the community mean")
    p.add_argument("--train-frac", type=float, default=0.1)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--att-dropout", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument("--batch", type=int, default=25_000, help="nodes per sampled mini-batch")
    p.add_argument("--models", nargs="+", default=["gcn", "gat"], choices=["gcn", "gat"])
    p.add_argument("--modes", nargs="+", default=["full", "batch"], choices=["full", "batch"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--small", action="store_true", help="a CPU-sized graph (2,000 nodes, 16 features)")
    p.add_argument("--no-pyg", action="store_true", help="skip the PyG comparison even if it is importable")
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None, help="accuracy per epoch figure (needs matplotlib)")
    a = p.parse_args(argv)
    if a.small:
        a.nodes, a.feat, a.hidden, a.batch = min(a.nodes, 2000), min(a.feat, 16), min(a.hidden, 32), min(a.batch, 500)
        a.communities = min(a.communities, 4)
    return a


def main(argv=None) -> dict:
    """Every (framework, model, mode) a cell, run by :func:`blocksparse.bench.run_cells` (table, JSON); returns
    ``dict(rows=[...])``: each trained model's metrics with its framework, model and mode."""
    a = parse(argv)
    edge_index, x, y = stochastic_block_model(a.nodes, a.communities, a.deg_in, a.deg_out, a.feat, a.noise, a.seed)
    train_mask = np.random.default_rng(a.seed + 7).random(a.nodes) < a.train_frac
    data = dict(edge_index=edge_index, x=x, y=y, train=train_mask, test=~train_mask)
    print(f"SBM: {a.nodes} nodes, {edge_index.shape[1]} edges, {a.communities} communities, {a.feat} features, "
          f"{int(train_mask.sum())} labelled; chance = {1 / a.communities:.3f}; "
          f"device {jax.devices()[0].device_kind}")  # fmt: skip
    result = dict(config=vars(a), num_edges=int(edge_index.shape[1]), chance=1 / a.communities,
                  device=jax.devices()[0].device_kind, rows=[])  # fmt: skip

    def job(framework, model, mode):
        def run(timer):
            if framework == "pyg":
                if a.no_pyg:
                    raise CellSkipped("--no-pyg")
                try:
                    import torch_geometric  # noqa: F401
                except ImportError as e:
                    raise CellSkipped(f"torch_geometric not importable: {e}") from None
            row = train(model, mode, data, a) if framework == "blocksparse" else train_pyg(model, data, a)
            result["rows"].append(row)
            return dict(row, implementation=framework)

        return Cell("train-gnn", f"{framework} {model} {mode}", dict(framework=framework, model=model, mode=mode), run)

    jobs = [job("blocksparse", m, mode) for m in a.models for mode in a.modes]
    jobs += [job("pyg", m, "full") for m in a.models]
    columns = {
        "train-gnn": (
            ("final acc", "final_acc", ".3f"),
            ("best acc", "best_acc", ".3f"),
            ("epochs/s", "epochs_per_s", ".4g"),
            ("1st epoch s", "first_epoch_s", ".3g"),
        )
    }
    meta = dict(
        script="benchmarks/train_gnn.py", config=vars(a), num_edges=result["num_edges"], chance=result["chance"]
    )
    result["status"] = run_cells(jobs, full=not a.small, json_path=a.json, meta=meta, columns=columns)
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for row in result["rows"]:
            ax.plot(np.arange(1, len(row["test_acc"]) + 1), row["test_acc"],
                    label=f"{row['framework']} {row['model']} {row['mode']}")  # fmt: skip
        ax.axhline(result["chance"], color="gray", ls=":", label="chance")
        ax.set(xlabel="epoch", ylabel="test accuracy", title=f"SBM node classification ({a.nodes} nodes)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.plot, dpi=120)
    return result


if __name__ == "__main__":
    sys.exit(main()["status"])
