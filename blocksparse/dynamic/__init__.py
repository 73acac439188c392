"""Dynamic sparsity on the device: the jit-able redistributor that fills kernel work lists."""

from .redistribute import TracedSchedule, choose_max_len, execute_dsd, redistribute

__all__ = ["TracedSchedule", "choose_max_len", "execute_dsd", "redistribute"]
