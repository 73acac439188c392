"""Row normalisations of a model's residual stream: :func:`rms_norm`, with the residual add folded in."""

from .rms import rms_norm, rms_norm_reference

__all__ = ["rms_norm", "rms_norm_reference"]
