"""A guard for tests whose failure mode is a hang (a quadratic scan, an unbounded draw loop, a
power that never finishes): the call runs in a forked child and the test fails if it has not
returned within a limit that is orders of magnitude above its normal cost. The limit is a
watchdog, not a timing assertion: the outcome does not depend on the processor or the load, and a
hang inside C code (big-integer arithmetic, the regex engine) is caught too, which a signal or a
thread in the same process cannot interrupt."""

from __future__ import annotations

import multiprocessing
import traceback

HANG_LIMIT_S = 120.0


def _child(conn, fn, args, kwargs):
    try:
        conn.send(("ok", fn(*args, **kwargs)))
    except BaseException as exc:  # sent back and raised in the parent
        conn.send(("raised", (exc, traceback.format_exc())))
    finally:
        conn.close()


def finishes(fn, *args, limit_s: float = HANG_LIMIT_S, **kwargs):
    """fn(*args, **kwargs) run in a forked child; its result, or its exception re-raised here.

    Fails the test when the call has not returned after `limit_s` seconds."""
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, fn, args, kwargs), daemon=True)
    proc.start()
    send.close()
    got = recv.poll(limit_s)
    if not got:
        proc.kill()
        proc.join()
        raise AssertionError(
            f"{fn.__name__}{args!r:.80} did not return in {limit_s:.0f} s (a hang)"
        )
    status, value = recv.recv()
    proc.join()
    if status == "raised":
        exc, _ = value
        raise exc
    return value
