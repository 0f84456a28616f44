"""Progress with ETA, and the console distil prints to.

On a terminal: a rich progress bar. Elsewhere (a job under SLURM or nohup, its stderr in a log
file) a bar would draw nothing, so a plain line is printed every `DISTIL_PROGRESS_EVERY`
seconds (default 30) and once at the end: what is done, the rate since the start and the time
left at that rate. Both go to stderr, so that tables and reports on stdout stay clean for pipes.
`DISTIL_PROGRESS=1` forces the bar.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console(stderr=True, highlight=False)
LINE_EVERY_S = 30.0  # seconds between two progress lines in a log


class _Bar:
    def __init__(self, progress: Progress | None, task: int | None):
        self._progress, self._task = progress, task

    def advance(self, n: float = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def skip(self, n: float) -> None:
        """Count `n` items done before this run (a resume): shown, not in the rate."""
        self.advance(n)

    def update(self, **fields: object) -> None:
        """Set the bar's extra text, e.g. update(info='loss 0.31 | 5.2k tok/s')."""
        if self._progress is not None:
            self._progress.update(self._task, **fields)


class LineProgress(_Bar):
    """Progress as a plain line every `every` seconds (and one at the end), for logs:
    `cache-teacher: 32/64 rows (50%), 0.8 rows/s, eta 0m40s, 0m40s elapsed | shard 2`."""

    def __init__(
        self,
        description: str,
        total: float | None,
        *,
        unit: str = "items",
        every: float = LINE_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        write: Callable[[str], None] | None = None,
    ):
        super().__init__(None, None)
        self.description, self.total, self.unit, self.every = description, total, unit, every
        self.clock = clock
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self.done = self.skipped = 0.0
        self.info = ""
        self.began = self.last = clock()
        self.shown = 0.0  # items done at the last line printed

    def advance(self, n: float = 1) -> None:
        self.done += n
        now = self.clock()
        if now - self.last >= self.every:
            self.last = now
            self.print_line(now)

    def skip(self, n: float) -> None:
        self.done += n
        self.skipped += n

    def update(self, **fields: object) -> None:
        if "info" in fields:
            self.info = str(fields["info"])

    def finish(self) -> None:
        """The last line, unless nothing moved since the one printed."""
        if self.done > self.shown:
            self.print_line(self.clock())

    def print_line(self, now: float) -> None:
        self.shown = self.done
        elapsed = max(now - self.began, 1e-9)
        rate = (self.done - self.skipped) / elapsed
        what = f"{self.done:g}"
        if self.total:
            what += f"/{self.total:g} {self.unit} ({100 * self.done / self.total:.0f}%)"
        else:
            what += f" {self.unit}"
        line = f"{self.description}: {what}, {rate:.3g} {self.unit}/s"
        if self.total and rate > 0:
            line += f", eta {_duration((self.total - self.done) / rate)}"
        line += f", {_duration(elapsed)} elapsed"
        self.write(f"{line} | {self.info}" if self.info else line)


def _duration(seconds: float) -> str:
    s = round(max(seconds, 0.0))
    h, rest = divmod(s, 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"


@contextmanager
def progress_bar(
    description: str, total: float | None, *, enabled: bool = True, unit: str = "items"
) -> Iterator[_Bar]:
    """A bar with elapsed time and ETA on a terminal (or with DISTIL_PROGRESS set); elsewhere
    a `LineProgress` (a line every DISTIL_PROGRESS_EVERY seconds); nothing when disabled."""
    if not enabled:
        yield _Bar(None, None)
        return
    if not (sys.stderr.isatty() or _forced()):
        line = LineProgress(description, total, unit=unit, every=_line_every())
        yield line
        line.finish()
        return
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        transient=False,
    )
    with progress:
        task = progress.add_task(description, total=total, info="")
        yield _Bar(progress, task)


def _forced() -> bool:
    return os.environ.get("DISTIL_PROGRESS", "") not in ("", "0")


def _line_every() -> float:
    try:
        return float(os.environ.get("DISTIL_PROGRESS_EVERY", LINE_EVERY_S))
    except ValueError:
        return LINE_EVERY_S
