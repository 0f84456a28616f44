"""One re-entrant lock per model module, held by whatever changes the module for a while or
must not see it changed.

The student's training step swaps its output head for an identity, and turns off what its
forward applies after the head (`models.logits.after_head_off`), while its forward runs
(`data.packing.head_bypassed`: the forward goes through the DDP-wrapped module, and the chunked
loss applies the head); a generate call on that module in between would read hidden states as
logits. Both hold `module_lock(model)`: the step for the swap and its forward, a generator for
its call, so one waits for the other. Teachers never swap: they score through their decoder
(`model_forward(hidden=True)`), so a teacher that also writes seq-KD completions in the
background (`generation.async`) scores without waiting for its writer. Uncontended (every
synchronous run) the lock costs nothing that shows (1.2 us a round trip, bench/RESULTS.md).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_GUARD = threading.Lock()


def module_lock(model: Any) -> threading.RLock:
    """The lock of `model` (made on first use; gone with the module)."""
    with _GUARD:
        lock = _LOCKS.get(model)
        if lock is None:
            lock = _LOCKS[model] = threading.RLock()
        return lock
