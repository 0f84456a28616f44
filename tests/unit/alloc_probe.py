"""What tensors a piece of code creates, seen with a TorchDispatchMode (sizes, not timings)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class Created(TorchDispatchMode):
    """Records (op name, numel, shape) of every tensor an aten op returns, and keeps each new
    storage alive (so none is reused) to count the distinct allocations."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, int, tuple]] = []
        self.storages: dict[int, torch.UntypedStorage] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.seen.append((str(func.overloadpacket.__name__), t.numel(), tuple(t.shape)))
                self.storages.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage())
        return out

    def allocations(self, nbytes: int) -> int:
        """How many distinct storages of at least `nbytes` the ops made."""
        return sum(s.nbytes() >= nbytes for s in self.storages.values())
