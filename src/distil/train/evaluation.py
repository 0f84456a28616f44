"""The evaluation inside a training run: eval.task on its problems, every train.eval_every
steps and after the last, with the run's own sampler over the live weights (main process; the
RNG left untouched, so evaluating never changes what training samples)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from distil.config import DistilConfig
from distil.eval.runner import run_template
from distil.train.async_gen import AsyncWindows
from distil.train.fsdp import full_weights, is_sharded
from distil.train.setup import Components


def eval_set(cfg: DistilConfig):
    """(task, problems) of the periodic evaluation, built once per run; the prompts use the
    training data's template (`run_template`) unless eval.template names one."""
    from distil.eval.runner import load_problems
    from distil.tasks import make_task

    template = cfg.eval.template or run_template(cfg)
    task = make_task(cfg.eval.model_copy(update={"template": template}))
    return task, load_problems(task)


def evaluate(c: Components, cfg: DistilConfig, eval_set) -> dict[str, Any]:
    """The eval.task verdicts of the current student (main process; RNG left untouched)."""
    acc = c.accelerator
    result: dict[str, Any] = {}
    with full_weights(c.unwrapped):  # FSDP: every rank gathers, the main process generates
        if acc.is_main_process:
            result = _evaluate_main(c, cfg, *eval_set)
    acc.wait_for_everyone()
    return result


def _evaluate_main(c: Components, cfg: DistilConfig, task, problems) -> dict[str, Any]:
    from distil.eval.runner import eval_metrics, evaluate_model

    devices = [c.accelerator.device] if c.accelerator.device.type == "cuda" else []
    if isinstance(c.buffer, AsyncWindows) or is_sharded(c.unwrapped):
        # async: its generator samples from the weight snapshot; FSDP: the weights are gathered
        # above. The eval builds its own generator for the live weights (once nothing samples
        # in the background).
        if isinstance(c.buffer, AsyncWindows):
            c.buffer.settle()
        generator = None
    else:
        generator = c.buffer.student.generator  # the run's backend samples the eval
        generator.sync_weights(c.unwrapped)
    scratch = generator.scratch_caches() if generator else contextlib.nullcontext()
    with torch.random.fork_rng(devices=devices), scratch:  # no KV cache kept after the eval
        r = evaluate_model(
            cfg.train.output_dir,
            task,
            name="student",
            problems=problems,
            progress=False,
            model=c.unwrapped,
            tokenizer=c.tokenizer,
            generator=generator,
            template_kwargs=cfg.data.chat_template_kwargs,
        )
    return eval_metrics(r.summary)
