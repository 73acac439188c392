"""The Mosaic GPU (Hopper: TMA + wgmma) backend of the block-sparse products: ``implementation="mosaic"``.

:mod:`.common` (the shared TMA / wgmma pipeline and operand checks), the kernels :mod:`.dsd` (``W @ x``, static
and dynamic), :mod:`.dds` (``x @ W``), :mod:`.sdd` (the weight gradient), :mod:`.persistent` (one program per SM
for ``dsd`` / ``dds``) and :mod:`.bands` (blocks of 16 and 32), each saying only what it can run; and
:mod:`.backend` (:class:`~.backend.MosaicBackend`: which variant runs), which only the registry of
:mod:`blocksparse.ops.matmul.registry` imports. Imports go down: kernels import :mod:`.common` (and
:mod:`.persistent`), the backend imports the kernels.
"""

from .bands import BandConfig
from .dds import DdsConfig
from .dsd import MosaicConfig
from .sdd import SddConfig

__all__ = ["BandConfig", "DdsConfig", "MosaicConfig", "SddConfig"]
