"""One re-entrant lock per model module, held by whatever changes the module for a while or
must not see it changed.

A teacher that writes seq-KD completions is also the one that scores: with
`generation.async` the buffer writes the next window on a background thread while the training
thread scores the current one, and scoring swaps the output head for an identity while it runs
(`data.packing.head_bypassed`). A generate call in between would read hidden states as logits.
Both hold `module_lock(model)`: scoring for the swap and its forward, a generator for its call,
so one waits for the other. Uncontended (every synchronous run) the lock costs nothing that
shows; the student's own sampler in an async run reads a snapshot, another module, and never
waits for it.
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
