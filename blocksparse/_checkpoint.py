"""Checkpoints that keep the pattern: ``bs.save(path, tree)`` and ``bs.load(path)``.

A checkpoint is one safetensors file (:mod:`blocksparse._safetensors`). Its tensors are the tree's arrays, named by
their path in the tree (``layers.0.query.weight.data``), and, once per distinct pattern, the pattern's block
coordinates (``layers.0.query.weight.pattern.rows`` / ``.cols``, int32, row-major order). Its
``__metadata__["blocksparse"]`` is a JSON document: the format and its version, the tree (containers, registered
node types by name, their static fields), the patterns (shape, block size, tensors, fingerprint) and an index of
the static matrices (data tensor -> pattern) for readers without JAX. See docs/checkpoints.md.

Which objects a tree may hold, and how each comes back:

- ``None``, tuples, lists, dicts and ``OrderedDict`` (JAX's own containers), rebuilt as they were;
- arrays: ``jax.Array`` (typed PRNG keys through their key data), ``np.ndarray`` and NumPy scalars, every dtype
  safetensors stores (bfloat16 and float16 included), bit for bit, as the same kind of array; and
  ``jax.ShapeDtypeStruct`` (``jax.eval_shape``'s leaves: the structure without the values), in the header only;
- Python scalars and strings, NumPy dtypes, :class:`~blocksparse.BlockPattern` and registered value types (frozen
  dataclasses such as ``BertConfig``) as leaves or in static fields, stored in the header;
- node types registered by a stable name with :func:`register_checkpoint_type`: the library's matrices, ``bs.nn``
  layers, GNN layers and models register themselves; a user's dataclass, namedtuple or ``Pytree`` registers in one
  call. They are rebuilt from their fields without running ``__init__``, as JAX's own unflatten does.

Anything else raises a ``TypeError`` naming the type, where it sits in the tree and how to register it. Every load
validates the file against its header and the header against itself: a problem names the tensor or field, the
expected and the actual value.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._matrix import BlockSparseMatrix, DynamicBlockSparseMatrix
from ._pattern import BlockPattern, check_block_size
from ._safetensors import DTYPES, dtype_name, read, write
from ._util import Pytree

__all__ = ["FORMAT", "METADATA_KEY", "VERSION", "load", "register_checkpoint_type", "save"]

#: The ``format`` field of a checkpoint's header.
FORMAT = "blocksparse.checkpoint"
#: The header's layout version: :func:`load` reads files of this version (and refuses later ones by name).
VERSION = 1
#: The key of ``__metadata__`` holding the header (a JSON string: safetensors metadata maps strings to strings).
METADATA_KEY = "blocksparse"

_ARRAY_TYPES = ("jax", "numpy", "numpy_scalar", "key")
_NODE_KINDS = ("none", "tuple", "list", "dict", "ordered_dict", "array", "abstract", "value", "node")


# -- the registry -------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Type:
    """How one registered class is taken apart and rebuilt: ``how`` is ``pytree`` (the package's
    :class:`~blocksparse._util.Pytree`), ``dataclass``, ``namedtuple`` or ``custom`` (``flatten`` / ``unflatten``)."""

    cls: type
    name: str
    how: str
    flatten: Callable | None = None
    unflatten: Callable | None = None
    check: Callable | None = None

    def fields(self, obj) -> tuple[dict, dict]:
        """``(children, static)`` of ``obj``, each ``{field name: value}``."""
        if self.how == "pytree":
            return {n: getattr(obj, n) for n in self.cls._leaves}, {n: getattr(obj, n) for n in self.cls._static}
        if self.how == "namedtuple":
            return dict(obj._asdict()), {}
        if self.how == "custom":
            out = self.flatten(obj)
            if not (isinstance(out, tuple) and len(out) == 2 and all(_str_dict(d) for d in out)):
                raise TypeError(
                    f"bs.save: expected the flatten of {self.name!r} to return (children, static), two dicts keyed by "
                    f"field names. Got {type(out).__name__}: {out!r:.120}."
                )
            return dict(out[0]), dict(out[1])
        names = [f.name for f in dataclasses.fields(obj)]
        if not _is_node(obj):  # a value type: rebuilt through its constructor, so only what it takes
            return {}, {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}
        children = []
        for keys, _ in jax.tree_util.tree_flatten_with_path(obj, is_leaf=lambda x: x is not obj)[0]:
            key = keys[0] if len(keys) == 1 else None
            if not isinstance(key, jax.tree_util.GetAttrKey) or key.name not in names:
                raise TypeError(
                    f"bs.save: the children of {self.name!r} are not its dataclass fields (JAX names one {keys!r}); "
                    "register it with flatten= and unflatten=."
                )
            children.append(key.name)
        return {n: getattr(obj, n) for n in children}, {n: getattr(obj, n) for n in names if n not in children}

    def expected(self) -> tuple[frozenset, frozenset] | frozenset | None:
        """The field names a saved node must have: ``(children, static)``, all fields (a dataclass), or ``None``."""
        if self.how == "pytree":
            return frozenset(self.cls._leaves), frozenset(self.cls._static)
        if self.how == "namedtuple":
            return frozenset(self.cls._fields), frozenset()
        if self.how == "dataclass":
            return frozenset(f.name for f in dataclasses.fields(self.cls))
        return None

    def build(self, children: dict, static: dict):
        """A node from its fields, without ``__init__`` (JAX's unflatten does the same)."""
        if self.how == "pytree":
            return self.cls._from_fields(**static, **children)
        if self.how == "namedtuple":
            return self.cls(**children)
        if self.how == "custom":
            return self.unflatten(children, static)
        obj = object.__new__(self.cls)
        for name, value in {**static, **children}.items():
            object.__setattr__(obj, name, value)
        return obj

    def build_value(self, static: dict):
        """A value type (not a JAX node) from its fields: through its constructor, which validates them."""
        if self.how == "custom":
            return self.unflatten({}, static)
        return self.cls(**static)


_BY_NAME: dict[str, _Type] = {}
_BY_CLS: dict[type, _Type] = {}


def register_checkpoint_type(
    cls: type, name: str | None = None, *, flatten: Callable | None = None, unflatten: Callable | None = None,
    check: Callable | None = None,
) -> type:  # fmt: skip
    """Let :func:`save` and :func:`load` take ``cls`` (a pytree node, or a value type held in static fields).

    Arguments:
        cls: a dataclass (``jax.tree_util.register_dataclass``, an Equinox module, a frozen config), a
            namedtuple, or any class when ``flatten`` and ``unflatten`` are given.
        name: the stable name files record (default ``f"{cls.__module__}.{cls.__qualname__}"``): pass one to
            keep files loadable after the class moves. Names under ``blocksparse.`` are the library's.
        flatten: ``obj -> (children, static)``, two dicts keyed by field name: the children are subtrees
            (saved as tensors), the static values go to the header.
        unflatten: ``(children, static) -> obj``, the inverse.
        check: ``(obj, where) -> None``, run on every loaded node; raise ``ValueError`` for invalid fields.

    Dataclass nodes are rebuilt from their fields without running ``__init__`` (as JAX unflattens them); value
    types (classes JAX sees as leaves, e.g. a frozen config in a static field) through their constructor. Before
    writing, :func:`save` checks that every node comes back from its fields with the same tree structure.
    Registering a class again under its name is a no-op; another class under a taken name raises.

    Returns:
        ``cls``, so that it also works as a decorator: ``@functools.partial(bs.register_checkpoint_type,
        name="mylib.Block")``.
    """
    if not isinstance(cls, type):
        raise TypeError(f"Expected a class to register. Got {cls!r} of type {type(cls).__name__}.")
    if (flatten is None) != (unflatten is None):
        raise TypeError(f"Expected both flatten= and unflatten= for {cls.__qualname__}, or neither. Got only one.")
    if flatten is not None:
        how = "custom"
    elif issubclass(cls, Pytree) and cls._static != ("self",):
        how = "pytree"
    elif issubclass(cls, tuple) and hasattr(cls, "_fields"):
        how = "namedtuple"
    elif dataclasses.is_dataclass(cls):
        how = "dataclass"
    else:
        raise TypeError(
            f"Expected a dataclass, a namedtuple or a blocksparse Pytree with fields to register. Got "
            f"{cls.__qualname__}; pass flatten=(obj -> (children, static)) and unflatten=((children, static) -> obj)."
        )
    if name is None:
        name = f"{cls.__module__}.{cls.__qualname__}"
        if "<locals>" in name:
            raise ValueError(f"Expected name= for {cls.__qualname__}, a class defined inside a function. Got none.")
    if not isinstance(name, str) or not name:
        raise TypeError(f"Expected name as a non-empty string. Got {name!r}.")
    if name.startswith("blocksparse.") and not cls.__module__.startswith("blocksparse"):
        raise ValueError(f"Expected a name outside 'blocksparse.' (the library's types). Got {name!r}.")
    same = _BY_NAME.get(name)
    if same is not None and same.cls is not cls and _qualified(same.cls) != _qualified(cls):  # a reload may re-register
        raise ValueError(f"Expected a free checkpoint name. Got {name!r}, taken by {_qualified(same.cls)}.")
    other = _BY_CLS.get(cls)
    if other is not None and other.name != name:
        raise ValueError(
            f"{_qualified(cls)} is registered for checkpoints as {other.name!r}. Got a second name {name!r}."
        )
    entry = _Type(cls, name, how, flatten, unflatten, check)
    if same is not None:
        _BY_CLS.pop(same.cls, None)
    _BY_NAME[name] = entry
    _BY_CLS[cls] = entry
    return cls


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _str_dict(d) -> bool:
    return isinstance(d, dict) and all(isinstance(k, str) for k in d)


def _is_node(obj) -> bool:
    """Whether JAX flattens ``obj`` (a pytree node: it has children, perhaps none) rather than keeping it as a leaf."""
    leaves = jax.tree.leaves(obj, is_leaf=lambda x: x is not obj)
    return not (len(leaves) == 1 and leaves[0] is obj)


def _one_level(obj):
    return jax.tree.structure(obj, is_leaf=lambda x: x is not obj)


def _component(key) -> str:
    """A dict key as a path component of a tensor name."""
    return key if isinstance(key, str) else repr(key) if not isinstance(key, int) else str(key)


def _where(path: tuple[str, ...]) -> str:
    return repr(".".join(path)) if path else "the root of the tree"


def _same(a, b) -> bool:
    """Equal values of the same type (NaN equals NaN), recursively through containers."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:  # values without a plain equality
        return False


def _dtype(name) -> np.dtype:
    """A NumPy dtype from its name, refused unless safetensors stores it."""
    try:
        dt = jnp.dtype(name) if isinstance(name, str) else None
    except TypeError:
        dt = None
    if dt is None or dt not in DTYPES.values():
        raise ValueError(f"expected a dtype name among {sorted(d.name for d in DTYPES.values())}. Got {name!r}")
    return dt


# -- the static values ---------------------------------------------------------------------------------------------
class _Codec:
    """Static values (the tree's structure) from JSON, and type names to registered types: what :class:`_Writer`
    (which checks that what it encodes comes back) and :class:`_Reader` share."""

    source = "bs.save"
    patterns: list[BlockPattern]

    def bad(self, where: str, expected: str, got) -> ValueError:
        return ValueError(f"{self.source}: header: {where}: expected {expected}. Got {got!r:.200}.")

    def decode_static(self, v, where: str):
        if v is None or type(v) in (bool, int, float, str):
            return v
        if isinstance(v, dict) and set(v) == {"type", "fields"}:
            entry = self.lookup(v["type"], where)
            if not _str_dict(v["fields"]):
                raise self.bad(where, "a dict of fields", v["fields"])
            fields = {k: self.decode_static(x, f"{where}.{k}") for k, x in v["fields"].items()}
            try:
                return entry.build_value(fields)
            except (TypeError, ValueError) as e:
                raise ValueError(
                    f"{self.source}: header: {where}: {entry.name} refused the saved fields: {e}"
                ) from None
        if not (isinstance(v, dict) and len(v) == 1):
            raise self.bad(where, "a static value (null, a bool, number or string, or a one-key tagged object)", v)
        ((tag, x),) = v.items()
        if tag == "float" and x in ("nan", "inf", "-inf"):
            return float(x)
        if tag in ("tuple", "list") and isinstance(x, list):
            items = [self.decode_static(y, f"{where}[{i}]") for i, y in enumerate(x)]
            return tuple(items) if tag == "tuple" else items
        if tag == "dict" and isinstance(x, list) and all(isinstance(p, list) and len(p) == 2 for p in x):
            out = {}
            for key, y in x:
                k = self.hashable(self.decode_static(key, f"{where} (a key)"), where)
                out[k] = self.decode_static(y, f"{where}[{k!r}]")
            return out
        if tag == "dtype":
            try:
                return _dtype(x)
            except ValueError as e:
                raise ValueError(f"{self.source}: header: {where}: {e}.") from None
        if tag == "scalar" and isinstance(x, list) and len(x) == 2:
            try:
                return _dtype(x[0]).type(self.decode_static(x[1], where))
            except (TypeError, ValueError, OverflowError) as e:
                raise ValueError(
                    f"{self.source}: header: {where}: a NumPy scalar {x!r:.80} that does not load: {e}."
                ) from None
        if tag == "pattern" and type(x) is int:
            if not 0 <= x < len(self.patterns):
                raise self.bad(where, f"a pattern index in [0, {len(self.patterns)})", x)
            return self.patterns[x]
        raise self.bad(where, "a tagged static value: float, tuple, list, dict, dtype, scalar, pattern or type", v)

    def hashable(self, key, where: str):
        try:
            hash(key)
        except TypeError:
            raise self.bad(where, "a hashable dict key", key) from None
        return key

    def lookup(self, name, where: str) -> _Type:
        if not isinstance(name, str):
            raise self.bad(where, "a type name (a string)", name)
        entry = _BY_NAME.get(name)
        if entry is None and name.startswith("blocksparse."):
            # The library's types register themselves when their module is imported: import it, once.
            module = name.rpartition(".")[0]
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as e:
                if not (e.name or "").startswith("blocksparse"):
                    raise  # an optional dependency of that module (Equinox, ...): its own message names the extra
            entry = _BY_NAME.get(name)
        if entry is None:
            short = name.rpartition(".")[2]
            raise TypeError(
                f"{self.source}: {where} holds a {name!r}, a type not registered for checkpoints in this process. "
                f"Import the module that registers it (bs.register_checkpoint_type({short}, name={name!r})) "
                "before bs.load."
            )
        return entry


# -- saving -------------------------------------------------------------------------------------------------------
class _Writer(_Codec):
    def __init__(self):
        self.tensors: dict[str, np.ndarray] = {}
        self.patterns: list[BlockPattern] = []
        self.pattern_entries: list[dict] = []
        self._ids: dict[str, int] = {}

    def add(self, path: tuple[str, ...], array: np.ndarray) -> str:
        """A tensor under the path's name (``a.b.0``), made unique with ``~1``, ``~2``... where two paths meet."""
        base = ".".join(path) or "root"
        name, i = base, 0
        while name in self.tensors or name == "__metadata__":
            i += 1
            name = f"{base}~{i}"
        self.tensors[name] = array
        return name

    def encode_static(self, v, path: tuple[str, ...]):
        t = type(v)
        if v is None or t in (bool, int, str):
            return v
        if t is float:
            return v if math.isfinite(v) else {"float": repr(v)}  # standard JSON has no NaN or infinity
        if t in (tuple, list):
            return {t.__name__: [self.encode_static(x, (*path, str(i))) for i, x in enumerate(v)]}
        if t is dict:
            return {"dict": [[self.encode_static(k, path), self.encode_static(x, (*path, _component(k)))]
                             for k, x in v.items()]}  # fmt: skip
        if isinstance(v, np.dtype):
            if v not in DTYPES.values():
                raise TypeError(f"bs.save: the dtype {v} at {_where(path)} is not one safetensors stores.")
            return {"dtype": v.name}
        if isinstance(v, np.generic):
            if v.dtype not in DTYPES.values():
                raise TypeError(f"bs.save: the NumPy scalar {v!r} at {_where(path)} has a dtype safetensors lacks.")
            return {"scalar": [v.dtype.name, self.encode_static(v.item(), path)]}
        if t is BlockPattern:
            return {"pattern": self.pattern(v, path)}
        entry = _BY_CLS.get(t)
        if entry is not None and not _is_node(v):
            _, static = entry.fields(v)
            return {"type": entry.name, "fields": {k: self.encode_static(x, (*path, k)) for k, x in static.items()}}
        raise TypeError(
            f"bs.save: cannot store the static value {v!r:.80} of type {_qualified(t)} at {_where(path)}. A tree's "
            "static fields may hold None, bool, int, float, str, tuples, lists and dicts of them, NumPy dtypes and "
            "scalars, BlockPatterns and registered value types: bs.register_checkpoint_type(cls, name)."
        )

    def pattern(self, p: BlockPattern, path: tuple[str, ...]) -> int:
        i = self._ids.get(p.fingerprint)
        if i is None:  # each distinct pattern once, under the path of its first holder
            i = self._ids[p.fingerprint] = len(self.patterns)
            self.patterns.append(p)
            rows, cols = self.add((*path, "rows"), p.rows), self.add((*path, "cols"), p.cols)
            self.pattern_entries.append({
                "shape": list(p.shape), "block_size": list(p.block_size), "nnz_blocks": p.nnz_blocks,
                "rows": rows, "cols": cols, "fingerprint": p.fingerprint,
            })  # fmt: skip
        return i

    def node(self, obj, path: tuple[str, ...]) -> dict:
        if obj is None:
            return {"kind": "none"}
        t = type(obj)
        if t in (tuple, list):
            return {"kind": t.__name__, "items": [self.node(x, (*path, str(i))) for i, x in enumerate(obj)]}
        if t in (dict, OrderedDict):
            items = [[self.encode_static(k, path), self.node(x, (*path, _component(k)))] for k, x in obj.items()]
            return {"kind": "dict" if t is dict else "ordered_dict", "items": items}
        if isinstance(obj, jax.core.Tracer):
            raise TypeError(
                f"bs.save: expected concrete arrays. Got a traced value at {_where(path)}: call bs.save outside jit."
            )
        if isinstance(obj, jax.Array | np.ndarray | np.generic):
            return self.array(obj, path)
        if t is jax.ShapeDtypeStruct:
            return self.abstract(obj, path)
        entry = _BY_CLS.get(t)
        if entry is not None and _is_node(obj):
            return self.pytree_node(obj, entry, path)
        if entry is not None or t in (bool, int, float, str, BlockPattern) or isinstance(obj, np.dtype):
            value = self.encode_static(obj, path)
            if not _same(self.decode_static(value, _where(path)), obj):
                raise TypeError(f"bs.save: the {_qualified(t)} at {_where(path)} does not come back from its fields.")
            return {"kind": "value", "value": value}
        if _is_node(obj) and t.__module__.startswith("blocksparse"):
            raise TypeError(
                f"bs.save: cannot save the {_qualified(t)} at {_where(path)}: this library type has no checkpoint "
                "form. Save the arrays and matrices it holds instead (a layer's weight and bias; see "
                "docs/checkpoints.md)."
            )
        if _is_node(obj):
            raise TypeError(
                f"bs.save: cannot save the {_qualified(t)} at {_where(path)}: its type is not registered for "
                f"checkpoints. Register it once, e.g. bs.register_checkpoint_type({t.__qualname__}, "
                f"name={_qualified(t)!r}) (a dataclass, a namedtuple, or pass flatten= and unflatten=)."
            )
        raise TypeError(
            f"bs.save: cannot save the leaf {obj!r:.80} of type {_qualified(t)} at {_where(path)}. Leaves may be "
            "arrays (jax, NumPy), Python scalars and strings, BlockPatterns, NumPy dtypes, or registered value "
            "types (bs.register_checkpoint_type)."
        )

    def array(self, x, path: tuple[str, ...]) -> dict:
        where = _where(path)
        out = {"kind": "array"}
        if isinstance(x, jax.Array):
            if not x.is_fully_addressable:
                raise TypeError(
                    f"bs.save: the array at {where} spans several processes; save each process's shards (e.g. with "
                    "orbax, docs/checkpoints.md) or gather it first."
                )
            if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
                host, kind = np.asarray(jax.random.key_data(x)), "key"
                out["impl"] = str(jax.random.key_impl(x))
            else:
                host, kind = np.asarray(x), "jax"
                if x.weak_type:
                    # Only a Python scalar's array can be made weak again (jnp.asarray(value)).
                    if x.ndim != 0 or jnp.asarray(host.item()).dtype != x.dtype:
                        raise TypeError(
                            f"bs.save: the array at {where} is weakly typed ({x.dtype}{list(x.shape)}); only a 0-d one "
                            "of the default dtype comes back weak. Give it a dtype first: jnp.asarray(x, x.dtype)."
                        )
                    out["weak"] = True
        elif isinstance(x, np.ndarray):
            host, kind = x, "numpy"
        else:
            host, kind = np.asarray(x), "numpy_scalar"
        try:
            dtype_name(host.dtype)
        except TypeError as e:
            raise TypeError(f"bs.save: the array at {where}: {e}") from None
        out.update(tensor=self.add(path, host), dtype=host.dtype.name, shape=list(host.shape), type=kind)
        return out

    def abstract(self, x: jax.ShapeDtypeStruct, path: tuple[str, ...]) -> dict:
        """A shape and dtype without values (``jax.eval_shape``'s leaves): in the header only, no tensor."""
        if x.sharding is not None:
            raise TypeError(
                f"bs.save: the ShapeDtypeStruct at {_where(path)} has a sharding, which checkpoints do not keep. "
                "Drop it first: jax.ShapeDtypeStruct(s.shape, s.dtype, weak_type=s.weak_type)."
            )
        try:
            dtype_name(x.dtype)
        except TypeError as e:
            raise TypeError(f"bs.save: the ShapeDtypeStruct at {_where(path)}: {e}") from None
        return {"kind": "abstract", "dtype": np.dtype(x.dtype).name, "shape": list(x.shape), "weak": x.weak_type}

    def pytree_node(self, obj, entry: _Type, path: tuple[str, ...]) -> dict:
        children, static = entry.fields(obj)
        encoded = {k: self.encode_static(v, (*path, k)) for k, v in static.items()}
        out = {"kind": "node", "type": entry.name, "static": encoded,
               "children": {k: self.node(v, (*path, k)) for k, v in children.items()}}  # fmt: skip
        # The node must come back from exactly this: the same type and static data as JAX sees them.
        decoded = {k: self.decode_static(v, f"{_where(path)}.{k}") for k, v in encoded.items()}
        if _one_level(entry.build(children, decoded)) != _one_level(obj):
            raise TypeError(
                f"bs.save: the {entry.name} at {_where(path)} does not come back from its fields (children "
                f"{sorted(children)}, static {sorted(static)}) with the same tree structure; register it with "
                "flatten= and unflatten= that capture all of it."
            )
        return out


def _matrices(node) -> list[dict]:
    """The static matrices of a (validated) header tree: ``{"data": tensor, "pattern": index}`` in tree order."""
    out = []
    if node["kind"] in ("tuple", "list"):
        for x in node["items"]:
            out += _matrices(x)
    elif node["kind"] in ("dict", "ordered_dict"):
        for _, x in node["items"]:
            out += _matrices(x)
    elif node["kind"] == "node":
        data = node["children"].get("data")
        if node["type"] == _MATRIX and data is not None and data["kind"] == "array":
            out.append({"data": data["tensor"], "pattern": node["static"]["pattern"]["pattern"]})
        for x in node["children"].values():
            out += _matrices(x)
    return out


def save(path: str | os.PathLike, tree: Any) -> Path:
    """Write ``tree`` (matrices, layers, models, arrays, containers) to ``path`` as one safetensors file.

    Arguments:
        path: the file to write (conventionally ``*.safetensors``); its directory must exist. Written to a
            temporary file beside it and renamed, so an interrupted save leaves the old file, or none.
        tree: any pytree of the types this module lists; its arrays must be concrete (outside ``jit``).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Every array is stored bit for bit in its dtype; every pattern once (its block coordinates as int32); the
    structure, the static fields and the patterns' shapes in the header. ``bs.load(path)`` gives back a tree
    with the same tree structure (so a function jitted for ``tree`` runs on it without tracing again) and equal
    leaves and patterns. A type that cannot be saved raises a ``TypeError`` before anything is written.

    Example::

        >>> import jax, tempfile, os, blocksparse as bs
        >>> W = bs.random(jax.random.key(0), (64, 32), 16, density=0.5)
        >>> path = bs.save(os.path.join(tempfile.mkdtemp(), "w.safetensors"), {"W": W})
        >>> bs.load(path)["W"].pattern == W.pattern
        True
    """
    w = _Writer()
    tree_doc = w.node(tree, ())
    doc = {"format": FORMAT, "version": VERSION, "tree": tree_doc, "patterns": w.pattern_entries,
           "matrices": _matrices(tree_doc)}  # fmt: skip
    return write(path, w.tensors, {METADATA_KEY: json.dumps(doc, separators=(",", ":"), allow_nan=False)})


# -- loading ------------------------------------------------------------------------------------------------------
class _Reader(_Codec):
    def __init__(self, path: Path, tensors: dict[str, np.ndarray], doc: dict):
        self.source = str(path)
        self.tensors = tensors
        self.used: set[str] = set()
        self.patterns = []
        entries = doc.get("patterns")
        if not isinstance(entries, list):
            raise self.bad("patterns", "a list", entries)
        for i, e in enumerate(entries):
            self.patterns.append(self.read_pattern(i, e))

    def field(self, node: dict, key: str, kind, where: str):
        if key not in node:
            raise ValueError(f"{self.source}: header: {where}: expected a field {key!r}. It is missing.")
        v = node[key]
        if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
            raise self.bad(f"{where}.{key}", f"a {getattr(kind, '__name__', kind)}", v)
        return v

    def ints(self, node: dict, key: str, where: str, length: int | None = None) -> list[int]:
        v = self.field(node, key, list, where)
        if (length is not None and len(v) != length) or not all(type(i) is int and i >= 0 for i in v):
            size = f"{length} " if length is not None else ""
            raise self.bad(f"{where}.{key}", f"a list of {size}non-negative ints", v)
        return v

    def dtype(self, node: dict, where: str) -> np.dtype:
        name = self.field(node, "dtype", str, where)
        try:
            return _dtype(name)
        except ValueError as e:
            raise ValueError(f"{self.source}: header: {where}.dtype: {e}.") from None

    def tensor(self, name, where: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        if not isinstance(name, str):
            raise self.bad(where, "a tensor name (a string)", name)
        if name not in self.tensors:
            raise ValueError(
                f"{self.source}: missing tensor {name!r}: expected {dtype.name} {list(shape)} for {where}. The file "
                f"holds {len(self.tensors)} tensors, not this one."
            )
        a = self.tensors[name]
        if a.dtype != dtype or a.shape != shape:
            raise ValueError(
                f"{self.source}: tensor {name!r} ({where}): expected {dtype.name} {list(shape)}. "
                f"Got {a.dtype.name} {list(a.shape)}."
            )
        self.used.add(name)
        return a

    def read_pattern(self, i: int, e) -> BlockPattern:
        where = f"patterns[{i}]"
        if not isinstance(e, dict):
            raise self.bad(where, "a pattern object", e)
        shape, block = self.ints(e, "shape", where, 2), self.ints(e, "block_size", where, 2)
        n = self.field(e, "nnz_blocks", int, where)
        fingerprint = self.field(e, "fingerprint", str, where)
        names = self.field(e, "rows", str, where), self.field(e, "cols", str, where)
        rows, cols = (self.tensor(t, f"{where}.{k}", np.dtype(np.int32), (n,))
                      for t, k in zip(names, ("rows", "cols"), strict=True))  # fmt: skip
        try:
            p = BlockPattern(tuple(shape), tuple(block), np.array(rows), np.array(cols))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{self.source}: pattern {i} (tensors {names[0]!r}, {names[1]!r}): {err}") from None
        if not (np.array_equal(p.rows, rows) and np.array_equal(p.cols, cols)):
            j = int(np.flatnonzero((p.rows != rows) | (p.cols != cols))[0])
            raise ValueError(
                f"{self.source}: pattern {i} (tensors {names[0]!r}, {names[1]!r}): expected block coordinates in "
                f"row-major order, as bs.save writes them (the block values follow that order). Got block "
                f"({rows[j]}, {cols[j]}) at position {j}, where ({p.rows[j]}, {p.cols[j]}) belongs."
            )
        if p.fingerprint != fingerprint:
            raise ValueError(
                f"{self.source}: pattern {i} (tensors {names[0]!r}, {names[1]!r}): expected the fingerprint "
                f"{fingerprint} (the header's). Got {p.fingerprint}: the pattern changed after it was saved."
            )
        return p

    def node(self, n, path: tuple[str, ...]):
        where = _where(path)
        if not isinstance(n, dict) or n.get("kind") not in _NODE_KINDS:
            raise self.bad(where, f"a node object whose kind is one of {_NODE_KINDS}", n)
        kind = n["kind"]
        if kind == "none":
            return None
        if kind in ("tuple", "list"):
            items = [self.node(x, (*path, str(i))) for i, x in enumerate(self.field(n, "items", list, where))]
            return tuple(items) if kind == "tuple" else items
        if kind in ("dict", "ordered_dict"):
            out = {} if kind == "dict" else OrderedDict()
            for pair in self.field(n, "items", list, where):
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise self.bad(f"{where}.items", "[key, node] pairs", pair)
                key = self.hashable(self.decode_static(pair[0], f"{where} (a key)"), where)
                out[key] = self.node(pair[1], (*path, _component(key)))
            return out
        if kind == "array":
            return self.array(n, path)
        if kind == "abstract":
            weak = self.field(n, "weak", bool, where)
            return jax.ShapeDtypeStruct(tuple(self.ints(n, "shape", where)), self.dtype(n, where), weak_type=weak)
        if kind == "value":
            if "value" not in n:
                raise ValueError(f"{self.source}: header: {where}: expected a field 'value'. It is missing.")
            return self.decode_static(n["value"], where)
        return self.pytree_node(n, path)

    def array(self, n: dict, path: tuple[str, ...]):
        where = _where(path)
        dtype = self.dtype(n, where)
        shape = tuple(self.ints(n, "shape", where))
        kind = self.field(n, "type", str, where)
        if kind not in _ARRAY_TYPES:
            raise self.bad(f"{where}.type", f"one of {_ARRAY_TYPES}", kind)
        a = self.tensor(n.get("tensor"), where, dtype, shape)
        if kind == "numpy":
            return np.array(a)  # a copy: writable, and independent of the file
        if kind == "numpy_scalar":
            if shape != ():
                raise self.bad(f"{where}.shape", "[] for a NumPy scalar", list(shape))
            return np.array(a)[()]
        if kind == "key":
            impl = self.field(n, "impl", str, where)
            try:
                return jax.random.wrap_key_data(jnp.asarray(a), impl=impl)
            except (TypeError, ValueError) as e:
                raise ValueError(f"{self.source}: tensor {n['tensor']!r} ({where}): not {impl} key data: {e}") from None
        x = jnp.asarray(a)
        if n.get("weak") is True and shape == ():
            weak = jnp.asarray(a.item())  # a Python scalar's array: weakly typed, as it was saved
            x = weak if weak.dtype == x.dtype else x
        return x

    def pytree_node(self, n: dict, path: tuple[str, ...]):
        where = _where(path)
        entry = self.lookup(self.field(n, "type", str, where), where)
        static, children = self.field(n, "static", dict, where), self.field(n, "children", dict, where)
        expected = entry.expected()
        got = (frozenset(children), frozenset(static))
        ok = (expected is None or (got == expected if isinstance(expected, tuple)
              else got[0] | got[1] == expected and not got[0] & got[1]))  # fmt: skip
        if not ok:
            want = (f"children {sorted(expected[0])} and static {sorted(expected[1])}" if isinstance(expected, tuple)
                    else f"the fields {sorted(expected)}")  # fmt: skip
            raise ValueError(
                f"{self.source}: header: {where}: expected {want} for a {entry.name}. Got children "
                f"{sorted(children)} and static {sorted(static)}."
            )
        s = {k: self.decode_static(v, f"{where}.{k}") for k, v in static.items()}
        c = {k: self.node(v, (*path, k)) for k, v in children.items()}
        obj = entry.build(c, s)
        if entry.check is not None:
            try:
                entry.check(obj, ".".join(path) or "root")
            except ValueError as e:
                raise ValueError(f"{self.source}: {e}") from None
        return obj


def load(path: str | os.PathLike) -> Any:
    """The tree :func:`save` wrote to ``path``.

    Arrays come back as they went in (``jax.Array`` on the default device, ``np.ndarray``, NumPy scalars, PRNG
    keys), bit for bit in their dtypes; matrices with equal patterns (the same fingerprint); the tree structure
    equal to the saved tree's, so a function jitted for the saved tree runs on the loaded one without tracing
    again. Node types are found by the name the file records: the library's are imported on demand, a user's
    must be registered (:func:`register_checkpoint_type`) before loading.

    Raises:
        FileNotFoundError, IsADirectoryError: ``path`` is missing or a directory.
        ValueError: the file is not a checkpoint of a version this library reads, or its tensors do not match its
            header (a missing tensor, a dtype or shape that differs, a pattern out of range, duplicated or
            changed): the message names the tensor or the header field, the expected and the actual value.
        TypeError: the file names a type not registered in this process.
    """
    path = Path(path)
    tensors, metadata = read(path)
    if METADATA_KEY not in metadata:
        raise ValueError(
            f"{path}: expected a blocksparse checkpoint (written by bs.save), whose safetensors metadata holds "
            f"{METADATA_KEY!r}. Got metadata keys {sorted(metadata)}; read plain safetensors files with "
            "blocksparse.models.read_safetensors."
        )
    try:
        doc = json.loads(metadata[METADATA_KEY])
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{path}: header: expected JSON in __metadata__[{METADATA_KEY!r}]. It is corrupt ({e})."
        ) from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: header: expected a JSON object. Got {type(doc).__name__}.")
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path}: header: expected format {FORMAT!r}. Got {doc.get('format')!r}.")
    version = doc.get("version")
    if type(version) is not int or not 1 <= version <= VERSION:
        newer = " (written by a newer blocksparse? upgrade to read it)" if type(version) is int and version > 1 else ""
        raise ValueError(f"{path}: header: expected format version {VERSION}, the one this library reads. Got "
                         f"{version!r}{newer}.")  # fmt: skip
    reader = _Reader(path, tensors, doc)
    if "tree" not in doc:
        raise ValueError(f"{path}: header: expected a field 'tree'. It is missing.")
    tree = reader.node(doc["tree"], ())
    index = _matrices(doc["tree"])
    if doc.get("matrices") != index:
        raise ValueError(
            f"{path}: header: expected the matrices index {index!r:.200} (the tree's static matrices). "
            f"Got {doc.get('matrices')!r:.200}."
        )
    unused = sorted(set(tensors) - reader.used)
    if unused:
        raise ValueError(f"{path}: expected only the tensors its header names. Got {len(unused)} more: {unused[:5]}.")
    return tree


# -- the matrices ---------------------------------------------------------------------------------------------------
def _is_array(x) -> bool:
    """An array or an abstract one (its shape and dtype are checked alike)."""
    return isinstance(x, jax.Array | np.ndarray | jax.ShapeDtypeStruct)


def _check_matrix(W: BlockSparseMatrix, where: str) -> None:
    p, data = W.pattern, W.data
    if not isinstance(p, BlockPattern):
        raise ValueError(f"{where}: expected a BlockPattern as the pattern. Got {type(p).__name__}.")
    if _is_array(data):
        want = (p.nnz_blocks, *p.block_size)
        if data.ndim < 3 or tuple(data.shape[-3:]) != want:
            raise ValueError(
                f"{where}.data: expected block values of shape (..., {', '.join(map(str, want))}) ({p.nnz_blocks} "
                f"blocks of {p.block_size[0]} x {p.block_size[1]}, the pattern's). Got {tuple(data.shape)}."
            )
        if not jnp.issubdtype(data.dtype, jnp.floating):
            raise ValueError(f"{where}.data: expected floating-point block values. Got {data.dtype}.")


def _check_dynamic(D: DynamicBlockSparseMatrix, where: str) -> None:
    try:
        bh, bw = check_block_size(D.shape, D.block_size)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None
    if not all(_is_array(getattr(D, n)) for n in D._leaves):
        return
    if D.data.ndim < 3 or tuple(D.data.shape[-2:]) != (bh, bw) or not jnp.issubdtype(D.data.dtype, jnp.floating):
        raise ValueError(
            f"{where}.data: expected floating-point blocks of shape (..., capacity, {bh}, {bw}). Got "
            f"{D.data.dtype} {tuple(D.data.shape)}."
        )
    lead = tuple(D.data.shape[:-2])
    for name, shape in (("rows", lead), ("cols", lead), ("nnz", lead[:-1])):
        a = getattr(D, name)
        if a.dtype != jnp.int32 or tuple(a.shape) != shape:
            raise ValueError(f"{where}.{name}: expected int32 {shape}. Got {a.dtype} {tuple(a.shape)}.")


_MATRIX = "blocksparse.BlockSparseMatrix"
register_checkpoint_type(BlockSparseMatrix, _MATRIX, check=_check_matrix)
register_checkpoint_type(DynamicBlockSparseMatrix, "blocksparse.DynamicBlockSparseMatrix", check=_check_dynamic)
