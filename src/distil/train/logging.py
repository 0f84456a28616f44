"""What a run tells its user: metrics.jsonl, a progress line, trackers, one rendered example.

`metrics.jsonl` gets one JSON object per optimizer step (loss, per-component losses, KL,
on/off-policy shares, a task's reward (`reward/mean`, `reward/share/<outcome>`,
`reward/no_signal_groups`), grad norm, lr, tokens, with several teachers each one's loss and tokens
(`loss/teacher/<name>`, `tokens/teacher/<name>`), and the seconds spent generating, scoring with
the teacher and training). On resume, lines past the restored step (and a partial last line left
by a kill) are dropped so the file reads as one uninterrupted run.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from rich.text import Text

from distil.progress import console


class MetricsLog:
    def __init__(self, run_dir: str | Path, *, enabled: bool, resume_step: int | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled
        if enabled and resume_step is not None and self.path.exists():
            kept = _lines_up_to(self.path, resume_step)
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(line + "\n" for line in kept))
            tmp.replace(self.path)
        elif enabled and resume_step is None and self.path.exists():
            self.path.unlink()

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as fh:
            fh.write(json.dumps(_plain(record)) + "\n")


def _lines_up_to(path: Path, step: int) -> list[str]:
    """The lines of steps <= step. A line that does not parse (the last one, cut short when the
    process was killed mid-write) is dropped: it belongs to a step past any checkpoint."""
    kept = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(record, dict)
            and isinstance(record.get("step"), int)
            and record["step"] <= step
        ):
            kept.append(line)
    return kept


def _plain(record: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in record.items():
        if isinstance(v, torch.Tensor):
            v = v.item()
        if isinstance(v, float) and not math.isfinite(v):
            v = str(v)
        out[k] = v
    return out


def memory_metrics(device: torch.device, planned_peak: int | None) -> dict[str, int]:
    """The planned peak (`distil plan`) next to the measured one: on CUDA the peak of tensor
    memory (`max_memory_allocated`), on CPU the process's resident high-water mark (VmHWM:
    tensors plus the interpreter and libraries)."""
    out = {} if planned_peak is None else {"memory/planned_peak_bytes": int(planned_peak)}
    if device.type == "cuda":
        out["memory/peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated(device))
        return out
    try:
        with open("/proc/self/status") as fh:
            hwm = next((line.split()[1] for line in fh if line.startswith("VmHWM:")), None)
    except OSError:
        hwm = None
    if hwm is not None:
        out["memory/rss_peak_bytes"] = int(hwm) * 1024
    return out


class ProgressLine:
    """Progress of a run: a live bar with ETA on a terminal, else a status line every `every`
    steps (step, loss, KL, each teacher's loss, on-policy share, a task's reward and its share
    of groups with equal rewards, tokens/s, eval accuracy, elapsed, ETA).

    With a wall-clock or compute budget the run ends at whichever comes first (steps, minutes,
    student FLOPs) and the ETA follows the binding one. Use as a context manager so the bar is
    closed on errors.
    """

    def __init__(
        self,
        total_steps: int,
        start_step: int,
        *,
        every: int,
        enabled: bool,
        max_minutes: float | None = None,
        max_student_flops: float | None = None,
        start_clock: float = 0.0,
        start_flops: float = 0.0,
        title: str = "train",
    ):
        self.total, self.start, self.every, self.enabled = total_steps, start_step, every, enabled
        self.budget = None if max_minutes is None else 60.0 * max_minutes
        self.flops_budget = max_student_flops
        self.start_clock = start_clock
        self.start_flops = start_flops
        self.t0 = time.perf_counter()
        self._bar = None
        if enabled and (sys.stderr.isatty() or os.environ.get("DISTIL_PROGRESS")):
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn(f"[bold]{title}"),
                BarColumn(),
                TextColumn("{task.percentage:>3.0f}%"),
                TimeElapsedColumn(),
                TextColumn("{task.fields[info]}"),
                console=console,
            )
            self._task = self._bar.add_task(title, total=1.0, info="")

    def __enter__(self) -> ProgressLine:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def fraction(self, step: int, clock: float, flops: float = 0.0) -> float:
        done = step / max(self.total, 1)
        if self.budget:
            done = max(done, clock / self.budget)
        if self.flops_budget:
            done = max(done, flops / self.flops_budget)
        return min(1.0, done)

    def update(self, step: int, metrics: dict[str, Any], *, final: bool = False) -> None:
        if not self.enabled:
            return
        clock = float(metrics.get("time/train_clock", 0.0))
        frac = self.fraction(step, clock, float(metrics.get("cost/student_flops", 0.0)))
        start = self.fraction(self.start, self.start_clock, self.start_flops)
        elapsed = time.perf_counter() - self.t0
        eta = elapsed / max(frac - start, 1e-9) * (1.0 - frac)
        parts = [f"step {step}", f"loss {significant(metrics.get('loss', float('nan')))}"]
        if "kl" in metrics:
            parts.append(f"kl {significant(metrics['kl'])}")
        elif "logratio" in metrics:  # cross-tokenizer: log S - log T of the realized text
            parts.append(f"log S/T {significant(metrics['logratio'])}")
        for key, value in metrics.items():  # several teachers: each one's loss
            if key.startswith("loss/teacher/"):
                parts.append(f"loss[{key[len('loss/teacher/') :]}] {significant(value)}")
        parts.append(f"on-policy {100 * metrics.get('policy/on_policy_share', 0):.0f}%")
        if "reward/mean" in metrics:  # a task's reward: its mean, the outcomes, flat groups
            parts.append(f"reward {significant(metrics['reward/mean'], 3)}")
            if shares := outcome_shares(metrics):
                parts.append(shares)
            parts.append(f"flat groups {100 * metrics['reward/no_signal_groups']:.0f}%")
        parts.append(f"{rate(metrics.get('throughput/tokens_per_s', 0))} tok/s")
        if "eval/accuracy" in metrics:
            parts.append(f"eval {100 * metrics['eval/accuracy']:.1f}%")
        if self._bar is not None:
            self._bar.update(
                self._task, completed=frac, info=" | ".join([*parts, f"eta {_clock(eta)}"])
            )
            return
        if step % self.every and not final:
            return
        parts += [f"elapsed {_clock(elapsed)}", f"eta {_clock(eta)}"]
        print(" | ".join(parts), file=sys.stderr, flush=True)


def outcome_shares(metrics: dict[str, Any]) -> str:
    """The window's reward outcomes seen, most frequent first: `correct 38% wrong_value 50%
    missing_answer_tags 12%` (from the `reward/share/<outcome>` metrics; absent ones left out)."""
    prefix = "reward/share/"
    seen = [(v, k[len(prefix) :]) for k, v in metrics.items() if k.startswith(prefix) and v > 0]
    return " ".join(f"{name} {100 * v:.0f}%" for v, name in sorted(seen, key=lambda s: -s[0]))


def significant(x: float, digits: int = 4) -> str:
    """`x` to `digits` significant digits: 0.2105, 3.4e-05, 1.494 (fixed decimals would show a
    loss of 3e-5 as 0.0000)."""
    return f"{x:.{digits}g}"


def rate(per_s: float) -> str:
    """A throughput for the progress line: 2.3k above a thousand, else 3 significant digits
    (a CPU run's 15-60 tokens/s, not 0.0k)."""
    return f"{per_s / 1000:.1f}k" if per_s >= 1000 else f"{per_s:.3g}"


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def render_sample(
    tokenizer, input_ids: list[int], loss_mask: list[bool], *, title: str = "training example"
) -> Text:
    """Prompt tokens dim, loss tokens green, token boundaries shown by alternating shades."""
    text = Text(f"── {title} (dim: prompt/masked, green: trained on) ──\n", style="bold")
    for i, (tid, on) in enumerate(zip(input_ids, loss_mask, strict=True)):
        piece = tokenizer.decode([tid], skip_special_tokens=False)
        if on:
            text.append(piece, style="bold green" if i % 2 else "green")
        else:
            text.append(piece, style="dim" if i % 2 else "grey50")
    n_on = sum(loss_mask)
    text.append(f"\n── {len(input_ids)} tokens, {n_on} in the loss ──")
    return text


def print_sample(tokenizer, batch, row: int = 0, extra: Text | None = None) -> None:
    """Print row `row` of a collated batch with its loss mask (mask shifted back to tokens)."""
    ids = batch.input_ids_B_L[row][batch.attention_mask_B_L[row].bool()].tolist()
    mask = [False, *batch.mask_B_T[row].tolist()]
    console.print(render_sample(tokenizer, ids, mask[: len(ids)]))
    if extra is not None:
        console.print(extra)
