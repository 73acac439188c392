"""The safetensors file format, read and written with NumPy alone (bfloat16 and float8 through JAX's ``ml_dtypes``).

A file is an 8-byte little-endian header length ``n``, ``n`` bytes of JSON (``{name: {"dtype", "shape",
"data_offsets": [begin, end]}}`` and optionally ``"__metadata__"``, a ``{str: str}`` map), then the tensors' bytes:
little-endian, C order, ``[begin, end)`` counted from the end of the header. The ``safetensors`` package (an
optional extra) reads what :func:`write` writes and the other way round; NumPy's own ``safetensors.numpy`` lacks
bfloat16, which these functions keep.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
from collections.abc import Mapping
from pathlib import Path

import jax.numpy as jnp
import numpy as np

__all__ = ["DTYPES", "dtype_name", "read", "read_safetensors", "write"]

#: safetensors dtype names -> NumPy dtypes (bfloat16 and the float8 types are ``ml_dtypes``' through ``jnp``).
DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": jnp.dtype(jnp.bfloat16), "F8_E4M3": jnp.dtype(jnp.float8_e4m3fn), "F8_E5M2": jnp.dtype(jnp.float8_e5m2),
    "I64": np.dtype(np.int64), "I32": np.dtype(np.int32), "I16": np.dtype(np.int16), "I8": np.dtype(np.int8),
    "U64": np.dtype(np.uint64), "U32": np.dtype(np.uint32), "U16": np.dtype(np.uint16), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}  # fmt: skip
_NAMES = {dtype: name for name, dtype in DTYPES.items()}
#: The bytes the length prefix may announce: the ``safetensors`` package refuses headers over 100 MB.
MAX_HEADER = 100_000_000


def dtype_name(dtype) -> str:
    """The safetensors name of a NumPy dtype (``"BF16"`` for bfloat16); a dtype the format lacks raises."""
    dt = np.dtype(dtype)
    name = _NAMES.get(dt.newbyteorder("=") if dt.byteorder not in "=|" else dt)
    if name is None:
        kinds = ", ".join(str(d) for d in DTYPES.values())
        raise TypeError(f"Expected a dtype that safetensors stores ({kinds}). Got {dt}.")
    return name


def _file(path) -> Path:
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: expected a safetensors file. Got a directory.")
    if not path.exists():
        raise FileNotFoundError(f"{path}: expected a safetensors file. It does not exist.")
    return path


def read(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """``(tensors, metadata)`` of one ``.safetensors`` file.

    The tensors are read-only NumPy views of a memory map (nothing is copied until one is used); ``metadata`` is
    the header's ``__metadata__`` (``{}`` when absent). A file that is not valid safetensors raises a
    ``ValueError`` naming the file and what is wrong (the entry, the expected and the actual values).
    """
    path = _file(path)
    size = path.stat().st_size
    if size < 8:
        raise ValueError(f"{path}: expected a safetensors file (an 8-byte header length first). Got {size} bytes.")
    raw = np.memmap(path, np.uint8, mode="r")
    (n,) = struct.unpack("<Q", raw[:8].tobytes())
    if n > min(size - 8, MAX_HEADER):
        raise ValueError(
            f"{path}: expected a safetensors file; its header is corrupt (a length of {n} bytes, the file holds "
            f"{size - 8} after the length)."
        )
    try:
        header = json.loads(raw[8 : 8 + n].tobytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: expected a safetensors file; its header is corrupt ({e}).") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: expected a JSON object as the header. Got {type(header).__name__}.")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError(f"{path}: expected __metadata__ as a map of strings to strings. Got {metadata!r:.200}.")
    data = raw[8 + n :]
    out = {}
    for name, entry in header.items():
        out[name] = _tensor(path, name, entry, data)
    return out, metadata


def _tensor(path: Path, name: str, entry, data: np.ndarray) -> np.ndarray:
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        raise ValueError(
            f"{path}: tensor {name!r}: expected an entry with dtype, shape and data_offsets. Got {entry!r}."
        )
    kind, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if kind not in DTYPES:
        raise ValueError(f"{path}: tensor {name!r} has dtype {kind!r}, not one of {sorted(DTYPES)}.")

    def ints(v, length=None):
        return (isinstance(v, list) and (length is None or len(v) == length)
                and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in v))  # fmt: skip

    if not ints(shape):
        raise ValueError(f"{path}: tensor {name!r}: expected a shape of non-negative ints. Got {shape!r}.")
    if not ints(offsets, 2) or offsets[0] > offsets[1]:
        raise ValueError(f"{path}: tensor {name!r}: expected data_offsets [begin, end], begin <= end. Got {offsets!r}.")
    dtype = DTYPES[kind]
    lo, hi = offsets
    nbytes = dtype.itemsize * math.prod(shape)
    if hi > data.size or hi - lo != nbytes:
        raise ValueError(
            f"{path}: tensor {name!r} ({kind} {list(shape)}) does not fit its byte range: expected {nbytes} bytes "
            f"within the {data.size} after the header. Got data_offsets [{lo}, {hi}]."
        )
    return data[lo:hi].view(dtype).reshape(shape)


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The tensors of one ``.safetensors`` file as read-only NumPy views of a memory map (bfloat16 through
    ``ml_dtypes``, which NumPy's ``safetensors`` reader lacks). Nothing is copied until a tensor is used."""
    return read(path)[0]


def write(
    path: str | os.PathLike, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None
) -> Path:
    """Write ``tensors`` (name -> array) and ``metadata`` (``__metadata__``, strings) as one safetensors file.

    The tensors keep their dtypes (bfloat16 included) and bytes; they are laid out by decreasing item size, then
    name (so every tensor is aligned to its item size, as the ``safetensors`` package lays them out). The file is
    written next to ``path`` and renamed into place, so a failed write leaves no partial file behind.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: expected a file path to write. Got a directory.")
    if not path.parent.is_dir():
        raise FileNotFoundError(
            f"{path}: expected an existing directory {path.parent} to write into. It does not exist."
        )
    meta = dict(metadata or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise TypeError(f"Expected metadata as a map of strings to strings. Got {meta!r:.200}.")
    arrays = {}
    for name, a in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise ValueError(f"Expected tensor names as strings other than '__metadata__'. Got {name!r}.")
        a = np.asarray(a)
        dtype_name(a.dtype)  # refused before anything is written
        if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and sys.byteorder == "big"):
            a = a.astype(a.dtype.newbyteorder("<"))
        arrays[name] = a if a.flags.c_contiguous else a.copy(order="C")  # not ascontiguousarray: it makes 0-d 1-d
    header, offset = {}, 0
    order = sorted(arrays, key=lambda k: (-arrays[k].dtype.itemsize, k))
    for name in order:
        a = arrays[name]
        header[name] = {
            "dtype": dtype_name(a.dtype),
            "shape": list(a.shape),
            "data_offsets": [offset, offset + a.nbytes],
        }
        offset += a.nbytes
    if meta:
        header = {"__metadata__": meta, **header}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # tensors start 8-byte aligned
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for name in order:
                f.write(arrays[name].reshape(-1).view(np.uint8).data)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path
