"""The training loop, readable top to bottom.

    for each optimizer step:
        window = buffer.next_window()          # ONE generation call for all on-policy slices
        n = loss tokens in the window, all ranks
        for micro in window:                   # gradient accumulation
            targets = teacher.score(micro)     # live teacher forward, full or top-k + rest
            loss = loss_fn(student(micro), targets, mask, num_tokens=n)   # sum / n
            backward                           # (no gradient sync until the last micro-batch)
        clip; skip the step if the loss or gradient is not finite; optimizer step
        evaluate / log / checkpoint on schedule; stop on a signal or a bad streak (guard.py)

Every loss divides by the window's loss-token count over all ranks, so the loss and its
gradient do not depend on grad_accum_steps, per_device_batch_size or the number of processes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from distil.config import DistilConfig, to_yaml
from distil.config.contexts import has_context
from distil.config.rules_reward import GRPO
from distil.eval.runner import run_template
from distil.ranks import is_first_rank
from distil.train import evaluation
from distil.train.async_gen import AsyncWindows
from distil.train.callbacks import Callbacks
from distil.train.card import CONFIG_FILE, metrics_rows, model_card
from distil.train.checkpoint import save_checkpoint, save_final_model
from distil.train.cost import CostMeter
from distil.train.guard import Guard, rank_flags
from distil.train.logging import MetricsLog, ProgressLine, memory_metrics, print_sample
from distil.train.metrics import add_align_metrics, add_metrics, step_metrics
from distil.train.optim import final_weights, fold_grads, grad_params, set_lr
from distil.train.resume import resume
from distil.train.reward import flat_everywhere
from distil.train.rundir import RunLock, record_config
from distil.train.setup import Components, build
from distil.train.signals import StopRequest
from distil.train.step import TEACHER_SUMS, micro_step, score_micro_batch, teacher_names
from distil.train.timing import PhaseClock
from distil.train.trackers import log_metrics, start_trackers


def train(
    cfg: DistilConfig,
    *,
    models: dict[str, Any] | None = None,
    callbacks: Iterable = (),
    prepare: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Run `cfg` to `train.max_steps`, `train.max_minutes` or `train.max_student_flops`
    (resuming if asked), or until a callback asks to stop (`distil.train.callbacks`).

    Returns the last step's metrics. `models`: already-loaded models by side ("student",
    "teacher") trained or used in place of loading `student.path`/`teacher.path` (which then
    hold their config.json and tokenizer: `distil.api`). The training clock
    (`time/train_clock`) counts generation, teacher and student time only: evaluation,
    checkpoints and the printed example are excluded. The output directory is locked for the
    run; SIGINT/SIGTERM end it after a checkpoint (`TrainingInterrupted`, exit code 130/143).
    `prepare`: called on every process under the lock, before anything is built (the Python
    API writes the files of its objects there).
    """
    with RunLock(cfg.train.output_dir, enabled=is_first_rank()):
        if prepare is not None:
            prepare()
        c = build(cfg, models=models) if models else build(cfg)
        if cfg.generation.async_:
            current = cfg.teacher.from_student == "current"  # it writes from the snapshot too
            c.buffer = AsyncWindows(
                c.buffer, c.unwrapped, max_steps=cfg.train.max_steps, teacher_is_student=current
            )
        hooks = Callbacks(callbacks, enabled=c.accelerator.is_main_process)
        ok = False
        try:
            with StopRequest() as stop:
                metrics = _run(c, cfg, stop, hooks)
            ok = True
            return metrics
        finally:  # on an error or a signal, do not wait for a window being sampled
            c.buffer.close(wait=ok)


def _run(c: Components, cfg: DistilConfig, stop: StopRequest, hooks: Callbacks) -> dict[str, Any]:
    acc, out = c.accelerator, Path(cfg.train.output_dir)
    step, state, last_good = _resume(c, cfg, out)
    clock = state.get("train_seconds", 0.0)
    cost = CostMeter.for_components(c, state.get("cost"))  # tokens and FLOPs spent so far
    log = MetricsLog(out, enabled=acc.is_main_process, resume_step=step if state else None)
    progress = _progress_line(cfg, acc, step, clock, cost)
    eval_set = evaluation.eval_set(cfg) if cfg.train.eval_every else None
    # grpo learns from the reward alone: a window whose groups are all flat has no gradient
    guard = Guard(cfg.train, state, last_good, reward_only=cfg.loss.name == GRPO)
    metrics: dict[str, Any] = {}
    first, saved_at, stopped = step, None, False

    def save(step: int) -> Path:
        trainer_state = {**_trainer_state(step, c, guard, clock), "cost": cost.totals}
        return save_checkpoint(
            acc, out, step, trainer_state, cfg.train.keep_last,
            model=c.model, optimizer=c.optimizer, config_text=to_yaml(cfg),
            extra_tensors=_sampler_tensors(c),
        )  # fmt: skip

    with progress:
        while not (stopped or _done(step, clock, cfg, cost)):
            t_start = time.perf_counter()
            lr = set_lr(c.optimizer, cfg.train, step, clock, cost.student_flops)
            window = c.buffer.next_window()
            t_shown = _maybe_print_example(c, cfg, window) if step == first else 0.0
            logs = (step + 1) % cfg.train.log_every == 0 or step + 1 >= cfg.train.max_steps
            skip = flat_everywhere(cfg, acc, window.metrics)  # grpo: no gradient anywhere
            sums, local_ok, t_teacher, t_train = (
                ({}, True, 0.0, 0.0) if skip else _accumulate(c, cfg, window, diagnostics=logs)
            )
            cost.add_window(window, acc, trained=not skip)
            t0 = time.perf_counter()
            grad_norm, finite = (torch.zeros(()), True) if skip else _update(c, cfg, sums)
            if finite and hasattr(c.teacher, "after_step"):
                c.teacher.after_step(c.unwrapped)  # an EMA teacher follows the student
            step += 1
            t_train += time.perf_counter() - t0
            t_step = time.perf_counter() - t_start - t_shown
            clock += t_step
            metrics = step_metrics(
                step, sums, window, grad_norm, lr, finite, t_teacher, t_train, t_step
            )
            metrics["time/train_clock"] = clock
            if cfg.loss.name == GRPO and cfg.reward.skip_flat:  # the windows skipped
                metrics["reward/skipped_flat"] = int(skip)
                if skip:  # nothing computed, no token trained
                    metrics.update({"loss": 0.0, "tokens/input_local": 0,
                                    "throughput/tokens_per_s": 0.0})  # fmt: skip
            metrics.update(cost.metrics())
            metrics.update(memory_metrics(acc.device, c.planned_peak))
            last = _done(step, clock, cfg, cost)
            if eval_set is not None and (step % cfg.train.eval_every == 0 or last):
                metrics.update(evaluated := evaluation.evaluate(c, cfg, eval_set))
                hooks.evaluated(step, evaluated)
            _log(acc, cfg, log, progress, metrics, last)
            hooks.step(step, metrics)
            flags = rank_flags(acc, stop.signum, guard.time_due(), local_ok, window.metrics,
                               hooks.stop)  # fmt: skip
            stopped = flags["stop"]  # a callback asked: this step is the last
            if guard.after_step(step, finite, metrics, flags, last or stopped):  # bad streaks
                guard.saved(path := save(step))
                saved_at = step
                hooks.checkpoint(step, path)
                stopped = stopped or _any_rank(acc, hooks)
            guard.stop_on_signal(step, flags, last or stopped)  # a stop: saved below
    if guard.healthy and saved_at != step:
        hooks.checkpoint(step, save(step))
    elif not guard.healthy:
        guard.warn_unsaved(step)
    _save_final(c, cfg, step)
    return metrics


def _resume(c: Components, cfg: DistilConfig, out: Path):
    """(step, trainer state, last good checkpoint) of a resumed run, or (0, {}, None); the
    config recorded and the trackers' runs opened (or reopened) either way."""
    step, state, last_good = resume(c, cfg, out)
    if state and hasattr(c.teacher, "load_checkpoint"):
        c.teacher.load_checkpoint(last_good)  # an EMA teacher: the average at that step
    if state and isinstance(c.buffer, AsyncWindows):
        c.buffer.load_sampler(last_good)  # the window in flight is sampled again
    if c.accelerator.is_main_process:
        record_config(cfg, out, step if state else None)
    start_trackers(c.accelerator, cfg, resumed=bool(state))
    return step, state, last_good


def _save_final(c: Components, cfg: DistilConfig, step: int) -> None:
    """The trained student in Hugging Face format under output_dir/final, with its model card
    and resolved config (train/card.py); trackers closed."""
    final_weights(c.optimizer)  # bf16 weights: the fp32 masters, in student.dtype
    out = Path(cfg.train.output_dir)
    rows = metrics_rows(out) if c.accelerator.is_main_process else []
    save_final_model(
        c.accelerator,
        c.model,
        c.tokenizer,
        out / "final",
        files={"README.md": model_card(cfg, rows), CONFIG_FILE: to_yaml(cfg)},
        template=run_template(cfg),
        chat_template_kwargs=cfg.data.chat_template_kwargs,
        student=cfg.student.path,
        teacher=cfg.teacher.path,
        steps=step,
    )
    if cfg.logging.trackers:
        c.accelerator.end_training()


def _progress_line(cfg: DistilConfig, acc, step: int, clock: float, cost: CostMeter):
    return ProgressLine(
        cfg.train.max_steps,
        step,
        every=cfg.train.log_every,
        enabled=acc.is_main_process and cfg.logging.progress,
        max_minutes=cfg.train.max_minutes,
        max_student_flops=cfg.train.max_student_flops,
        start_clock=clock,
        start_flops=cost.student_flops,
        title=Path(cfg.train.output_dir).name,
    )


def _log(acc, cfg: DistilConfig, log: MetricsLog, progress, metrics: dict, last: bool) -> None:
    """The step's metrics to metrics.jsonl, the trackers and the progress line."""
    log.write(metrics)  # before the checkpoint: a resume drops lines past its step
    if cfg.logging.trackers:
        log_metrics(acc, metrics)
    progress.update(metrics["step"], metrics, final=last)


def _sampler_tensors(c: Components) -> dict | None:
    """generation.async: the weights that sample the window in flight (a resume samples it
    again); an EMA teacher: its average; nothing otherwise."""
    tensors = c.buffer.checkpoint_tensors() if isinstance(c.buffer, AsyncWindows) else {}
    if hasattr(c.teacher, "checkpoint_tensors"):  # an EMA teacher's average
        tensors = {**tensors, **c.teacher.checkpoint_tensors()}
    return tensors or None


def _any_rank(acc, hooks: Callbacks) -> bool:
    """Whether a callback asked to stop (the main process's answer, on every rank)."""
    return rank_flags(acc, 0, False, torch.ones(()), {}, hooks.stop)["stop"]


def _done(step: int, clock: float, cfg: DistilConfig, cost: CostMeter) -> bool:
    budget, flops = cfg.train.max_minutes, cfg.train.max_student_flops
    return (
        step >= cfg.train.max_steps
        or (budget is not None and clock >= 60.0 * budget)
        or (flops is not None and cost.student_flops >= flops)
    )


def _accumulate(
    c: Components, cfg: DistilConfig, window, *, diagnostics: bool = True
) -> tuple[dict, Any, float, float]:
    """Teacher targets, loss and backward for every micro-batch of the window; the losses'
    logging-only metrics (kl, entropy) only when `diagnostics` (a step the progress prints)."""
    acc = c.accelerator
    # the loss tokens and the reward term's (every completion token: more when an alignment
    # leaves some out), each over the window on all ranks
    counts = [float(window.num_loss_tokens), float(window.num_completion_tokens)]
    if acc.num_processes > 1:  # one all-reduce (and host read) per step
        local = torch.tensor(counts, device=acc.device)
        counts = acc.reduce(local, reduction="sum").tolist()
    # DDP averages gradients over ranks; scaling the count keeps sum / global count exact.
    num_tokens, reward_tokens = (max(n, 1.0) / acc.num_processes for n in counts)
    zero = torch.zeros((), device=acc.device)  # every teacher's keys on every rank (reduce)
    sums = {f"teacher/{n}/{k}": zero for n in teacher_names(c.teacher) for k in TEACHER_SUMS}
    clock = PhaseClock(acc.device)  # CUDA events, read once below: no sync per micro-batch
    for i, micro in enumerate(window.micro_batches):
        micro = micro.to(acc.device)
        t0 = clock.mark()
        targets, parts, routes = score_micro_batch(c.teacher, micro, acc.autocast)
        t1 = clock.mark()
        last = i == len(window.micro_batches) - 1
        with contextlib.nullcontext() if last else acc.no_sync(c.model):
            with acc.autocast():
                result = micro_step(
                    c.model,
                    c.unwrapped,
                    micro,
                    targets,
                    c.loss_fn,
                    num_tokens=num_tokens,
                    vocab_size=c.vocab_size,
                    packing=cfg.train.packing,
                    pack_length=cfg.train.pack_length,
                    parts=parts,
                    routes=routes,
                    loss_opts={
                        **_loss_opts(c, cfg, window.policies[i]),
                        "diagnostics": diagnostics,
                        "reward_num_tokens": reward_tokens,  # read by a reward term only
                    },
                )
            acc.backward(result.loss)
        if acc.num_processes == 1:  # bf16 weights: add up in fp32 (DDP: after its all-reduce)
            fold_grads(c.optimizer)
        add_metrics(sums, result.metrics, window.policies[i])
        if micro.alignment is not None:  # cross-tokenizer: groups, bytes, unalignable tokens
            add_align_metrics(sums, micro.alignment.metrics, acc.device)
        clock.add("teacher", t0, t1)
        clock.add("train", t1, clock.mark())
        del targets, parts, result  # released before the next micro-batch is scored
    local_ok = torch.isfinite(sums["loss_sum"]).all() if "loss_sum" in sums else True
    sums = {k: acc.reduce(v.detach().float(), reduction="sum") for k, v in sums.items()}
    return sums, local_ok, clock.seconds("teacher"), clock.seconds("train")


def _update(c: Components, cfg: DistilConfig, sums: dict) -> tuple[torch.Tensor, bool]:
    """Clip and step, unless the loss or the gradient is not finite (then skip the step)."""
    max_norm = cfg.train.max_grad_norm or float("inf")
    acc = c.accelerator
    grad_norm = acc.clip_grad_norm_(grad_params(c.optimizer, c.model), max_norm)
    # one reduction and one host read for the gradient norm and every metric of the step
    checked = [torch.as_tensor(grad_norm, device=acc.device).float().reshape(())]
    checked += [v.float().sum().to(acc.device) for v in sums.values()]
    finite = bool(torch.isfinite(torch.stack(checked)).all())
    if finite:
        c.optimizer.step()
    elif getattr(acc, "scaler", None) is not None:
        # fp16: clip_grad_norm_ has unscaled the gradients; the skipped step must still update
        # the scaler (back off its scale, reset its per-optimizer state), else the next
        # step's unscale_ raises and the scale never drops (gpu-readiness finding 8)
        acc.scaler.update()
    c.optimizer.zero_grad(set_to_none=True)
    return grad_norm, finite


def _maybe_print_example(c: Components, cfg: DistilConfig, window) -> float:
    """Print one rendered training example (prompt, completion, loss mask, alignment)."""
    if not (cfg.logging.print_example and c.accelerator.is_main_process):
        return 0.0
    t0 = time.perf_counter()
    batch = window.micro_batches[0]
    extra = None
    if c.cross is not None and batch.alignment is not None:
        from distil.align.inspect import render_batch_row

        extra = render_batch_row(batch, 0, c.tokenizer, c.cross.teacher_tok)
    if has_context(cfg):  # both prompts, side by side
        from rich.console import Group

        from distil.data.context import prompts_side_by_side

        table = prompts_side_by_side(batch, 0, c.tokenizer, c.cross)
        extra = table if extra is None else Group(extra, table)
    print_sample(c.tokenizer, batch, extra=extra)
    return time.perf_counter() - t0


def _loss_opts(c: Components, cfg: DistilConfig, policy: str) -> dict[str, Any]:
    # cross-entropy only on data the student did not write (dataset or teacher completions)
    ce = cfg.loss.ce_weight if policy != "on_policy" else 0.0
    return {**c.loss_opts, "ce_weight": ce}


def _trainer_state(step: int, c: Components, guard: Guard, clock: float) -> dict:
    return {
        "step": step,
        "buffer": c.buffer.state.to_dict(),
        **guard.state(),
        "train_seconds": clock,
    }
