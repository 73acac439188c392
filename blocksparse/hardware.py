"""The device's facts: SM count, shared memory, L2, whether it is a Hopper GPU; the one place they live.

Every kernel, plan and dispatch rule asks this module, never ``jax.devices()`` directly, so a test fakes a
device in one place: :func:`fake` (a JAX user context, so part of the ``jit`` cache key: a function traced
under a fake device is traced again outside it).

:func:`current` describes the default device. On a machine without a GPU the description is the CPU's
(``platform="cpu"``); plans made there for a GPU (say to inspect them) take the facts of
:data:`PLANNING_DEFAULT` (an H200) where a GPU fact is needed, through :func:`gpu`.

Example::

    >>> import blocksparse.hardware as hw
    >>> with hw.fake(hw.H200):
    ...     hw.current().is_hopper, hw.current().num_sms
    (True, 132)
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax

__all__ = ["H100", "H200", "PLANNING_DEFAULT", "Device", "current", "fake", "gpu", "hopper_problem", "kind"]


@dataclasses.dataclass(frozen=True)
class Device:
    """Facts of one device (hashable: a :func:`fake` device is part of the jit cache key).

    Attributes:
        kind: ``jax.Device.device_kind`` (``"NVIDIA H200"``); the key of every tuned-data table.
        platform: ``"gpu"``, ``"cpu"`` or ``"tpu"``.
        compute_capability: ``"9.0"`` on Hopper; ``None`` off NVIDIA GPUs.
        num_sms: streaming multiprocessors (program instances run on these); 0 off GPUs.
        smem_per_sm: shared memory per SM in bytes.
        smem_per_block: shared memory one CTA may use (227 KiB on Hopper).
        l2_bytes: L2 cache size.
        hbm_bytes_per_s: datasheet memory bandwidth.
        bf16_flops: datasheet dense bf16 tensor-core rate (no sparsity).
    """

    kind: str
    platform: str = "gpu"
    compute_capability: str | None = None
    num_sms: int = 0
    smem_per_sm: int = 0
    smem_per_block: int = 0
    l2_bytes: int = 0
    hbm_bytes_per_s: float = 0.0
    bf16_flops: float = 0.0

    @property
    def is_gpu(self) -> bool:
        return self.platform == "gpu"

    @property
    def is_hopper(self) -> bool:
        """Compute capability 9.x: wgmma and TMA (the Mosaic GPU kernels)."""
        return self.is_gpu and str(self.compute_capability or "").split(".")[0] == "9"


# Sources: NVIDIA H200 datasheet (141 GB HBM3e at 4.8 TB/s; the GH100 die of the H100 SXM: 132 SMs, 228 KiB of
# shared memory per SM of which 227 KiB for one CTA, 50 MB L2 (60 MB as PyTorch reports it), dense bf16 989.5
# TFLOP/s); NVIDIA's Hopper tuning guide for the shared memory.
H200 = Device(
    kind="NVIDIA H200",
    compute_capability="9.0",
    num_sms=132,
    smem_per_sm=228 * 1024,
    smem_per_block=227 * 1024,
    l2_bytes=50 * 1024 * 1024,
    hbm_bytes_per_s=4.8e12,
    bf16_flops=989.5e12,
)
# H100 SXM: the same die, 80 GB of HBM3 at 3.35 TB/s (NVIDIA datasheet).
H100 = dataclasses.replace(H200, kind="NVIDIA H100 80GB HBM3", hbm_bytes_per_s=3.35e12)

#: The GPU whose facts plans made off a GPU assume (:func:`gpu`).
PLANNING_DEFAULT = H200

# Known facts by device kind, for what a jax.Device does not report (shared memory, L2, datasheet rates).
_KNOWN = {d.kind: d for d in (H200, H100)}

# The fake device of tests (None: the real one). Made at import, as every user context of the package (making
# one later changes JAX's trace context and retraces functions on their next call).
_FAKE = jax.make_user_context(None)


@contextlib.contextmanager
def fake(device: Device):
    """Run this block as if the default device were ``device`` (tests; part of the ``jit`` cache key)."""
    if not isinstance(device, Device):
        raise TypeError(f"Expected a blocksparse.hardware.Device. Got {type(device).__name__}.")
    with _FAKE(device):
        yield device


def _read() -> Device:
    try:
        dev = jax.devices()[0]
    except RuntimeError:  # no backend initialised
        return Device(kind="none", platform="none")
    kind = str(getattr(dev, "device_kind", dev.platform))
    if dev.platform != "gpu":
        return Device(kind=kind, platform=dev.platform)
    cc = getattr(dev, "compute_capability", None)
    known = _KNOWN.get(kind)
    sms = int(getattr(dev, "core_count", 0) or 0)  # a MIG slice or an H100 PCIe has fewer SMs than the SXM part
    if known is not None:
        return dataclasses.replace(known, compute_capability=str(cc) if cc else known.compute_capability,
                                   num_sms=sms or known.num_sms)  # fmt: skip
    return Device(kind=kind, platform="gpu", compute_capability=str(cc) if cc else None, num_sms=sms,
                  smem_per_sm=PLANNING_DEFAULT.smem_per_sm, smem_per_block=PLANNING_DEFAULT.smem_per_block,
                  l2_bytes=PLANNING_DEFAULT.l2_bytes)  # fmt: skip


_REAL: list[Device] = []  # read once: the default device does not change within a process


def current() -> Device:
    """The default device's facts (a :func:`fake` one inside that block)."""
    if (faked := _FAKE.value) is not None:
        return faked
    if not _REAL:
        _REAL.append(_read())
    return _REAL[0]


def gpu() -> Device:
    """The GPU facts plans use: :func:`current` on a GPU, else :data:`PLANNING_DEFAULT` (plans made on a CPU)."""
    dev = current()
    return dev if dev.is_gpu and dev.num_sms else PLANNING_DEFAULT


def kind() -> str:
    """The default device's kind, the key of the tuned-data tables."""
    return current().kind


def hopper_problem() -> str | None:
    """Why a Mosaic GPU (wgmma + TMA) kernel cannot run on the default device, or ``None`` on a Hopper GPU."""
    dev = current()
    if dev.platform == "none":
        return "no device"
    if not dev.is_gpu:
        return f"no GPU (default device is {dev.platform!r}: {dev.kind})"
    if not dev.is_hopper:
        return (
            f"requires a Hopper GPU (compute capability 9.x: wgmma and TMA); got {dev.kind} "
            f"(compute capability {dev.compute_capability})"
        )
    return None
