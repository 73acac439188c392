"""The GNN ops' backends: one registry, implementation name -> the module of each op's folder holding it.

Every op folder (``spmm/``, ``aggregate/``, ``attention/``) has one module per backend with the same entry
points (``csr_sum``; ``segment_extreme``; ``attention_forward`` / ``attention_backward``), so a name selects a
module and the op calls its entry point. Kernel modules are imported on first use: ``import blocksparse``
never imports Pallas' Triton backend. :mod:`blocksparse.ops.gnn.order` says in which order to try them.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["IMPLEMENTATIONS", "OP_FOLDERS", "module"]

#: Implementation name -> module of an op's folder holding it.
IMPLEMENTATIONS = {"pallas": "pallas_triton", "xla": "reference"}
#: Op family -> its folder under ``blocksparse.ops.gnn``.
OP_FOLDERS = ("spmm", "aggregate", "attention")


def module(op: str, name: str) -> ModuleType:
    """The module of op folder ``op`` (``"spmm"``, ``"aggregate"``, ``"attention"``) implementing ``name``."""
    if op not in OP_FOLDERS:
        raise ValueError(f"Expected an op folder in {list(OP_FOLDERS)}. Got {op!r}.")
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"Expected an implementation in {sorted(IMPLEMENTATIONS)}. Got {name!r}.")
    return importlib.import_module(f"{__package__}.{op}.{IMPLEMENTATIONS[name]}")
