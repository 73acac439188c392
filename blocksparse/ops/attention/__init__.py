"""Attention of few new tokens on a key/value cache (decoding): :func:`decode_attention`, and the whole
attention step of a decoder layer (rotary embedding, cache update, attention): :func:`decode_step_attention`."""

from .decode import (
    CHUNK,
    decode_attention,
    decode_attention_reference,
    decode_step_attention,
    decode_step_attention_reference,
    default_parts,
)

__all__ = [
    "CHUNK",
    "decode_attention",
    "decode_attention_reference",
    "decode_step_attention",
    "decode_step_attention_reference",
    "default_parts",
]
