"""Attention of few new tokens on a key/value cache (decoding): :func:`decode_attention`."""

from .decode import CHUNK, decode_attention, decode_attention_reference

__all__ = ["CHUNK", "decode_attention", "decode_attention_reference"]
