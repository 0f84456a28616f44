"""TRL's GOLDTrainer for a few distillation steps; bench/align.py runs it (TRL 1.16.0).

Started by `bench/align.py --part gold` (cross-tokenizer) and `bench/vs_trl.py`
(`--same-tokenizer`) with the TRL virtualenv's python (it imports trl, not distil). It trains
the given student against the given teacher, with `--lmbda` the share of on-policy micro-batches:
cross-tokenizer with extended ULD + hybrid loss ("bayesian" merge); with `--same-tokenizer`
GOLD's plain GKD path (`use_uld_loss=False`: the generalized JSD of Agarwal et al. over the
full shared vocabulary, `--beta` 1 = reverse KL), which is also what TRL's GKDTrainer computes,
with the rollouts buffered per optimizer window (without vLLM, `generate` once per
micro-batch). `--trainer distillation`: TRL's stable DistillationTrainer instead (on-policy,
one tokenizer; one `generate` per window; the teacher's head runs in its chunked loss, so
"teacher" times the teacher's backbone). Every optimizer step is timed with a
TrainerCallback: from `on_step_begin` to `on_step_end` (the step's generation, teacher forward,
loss, backward and AdamW step) and from one `on_step_end` to the next (adds the dataloader's
collation), and the time spent in on-policy generation and in teacher forwards within each
step. Prints one line `RESULT {json}`.

    PYTHONPATH=bench/.trl-site python bench/trl_gold_step.py --student S --student-tokenizer ST \
        --teacher T --teacher-tokenizer TT --data D.jsonl
    PYTHONPATH=bench/.trl-site python bench/trl_gold_step.py --same-tokenizer --lmbda 0 --beta 1 \
        --student S --student-tokenizer ST --teacher T --teacher-tokenizer ST --data D.jsonl

The tokenizers come from directories of their own: next to a qwen2 config.json, transformers 5's
AutoTokenizer would rebuild them as Qwen2Tokenizer (NFC normalizer, Qwen's split regex).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import warnings

if __name__ == "__main__":  # the script: offline and quiet (not when a test imports it)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    warnings.filterwarnings("ignore")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

PROBE = " In 1999 there were 4521 cats, e\u0303 <answer>(12+7)*3</answer>"


class StepClock(TrainerCallback):
    """Wall-clock marks at the start and end of every optimizer step, and the calls to time
    inside them: (start, seconds) per call of each wrapped function."""

    def __init__(self, device: str = "cpu") -> None:
        self.begins: list[float] = []
        self.ends: list[float] = []
        self.calls: dict[str, list[tuple[float, float]]] = {}
        self.sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def now(self) -> float:
        self.sync()  # on a GPU: the queued kernels belong to the phase that queued them
        return time.perf_counter()

    def on_step_begin(self, args, state, control, **kwargs):
        self.begins.append(self.now())

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(self.now())

    def wrap(self, name: str, fn):
        calls = self.calls.setdefault(name, [])

        def timed(*args, **kwargs):
            t0 = self.now()
            out = fn(*args, **kwargs)
            calls.append((t0, self.now() - t0))
            return out

        return timed

    def per_step(self, name: str) -> list[float]:
        """Seconds spent in `name` within each step."""
        return [
            sum(s for t0, s in self.calls.get(name, []) if b <= t0 < e)
            for b, e in zip(self.begins, self.ends, strict=True)
        ]


def record_lengths(trainer, lengths: list[float]):
    """The trainer's loss, recording the mean completion length of each micro-batch (on- and
    off-policy: the tokens its labels train on)."""
    compute_loss = trainer.compute_loss

    def recorded(model, inputs, *args, **kwargs):
        if "labels" in inputs:  # GOLD: completion tokens up to the first EOS; the rest is -100
            trained = (inputs["labels"] != -100).sum(dim=1)
        else:  # DistillationTrainer: the completion mask
            trained = inputs["completion_mask"].sum(dim=1)
        lengths.append(float(trained.float().mean()))
        return compute_loss(model, inputs, *args, **kwargs)

    return recorded


def messages(path: str) -> list[dict]:
    """The chat rows of bench/align.py's data file, as TRL `messages` conversations."""
    with open(path) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [
        {"messages": [*r["prompt"], {"role": "assistant", "content": r["completion"]}]}
        for r in rows
    ]


def shared_settings(args: argparse.Namespace, out_dir: str) -> dict:
    """The settings both TRL trainers get: batch, steps, constant lr, sampling at T=1, no
    logging or saving beyond the step records, fp32, seeded."""
    return {
        "output_dir": out_dir,
        "per_device_train_batch_size": args.batch,
        "gradient_accumulation_steps": args.ga,
        "max_steps": args.steps,
        "learning_rate": args.lr,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "max_completion_length": args.new_tokens,
        "beta": args.beta,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": args.device == "cpu",
        "bf16": False,
        "gradient_checkpointing": False,
        "dataloader_drop_last": True,
        "seed": 0,
    }


def gold_config(args: argparse.Namespace, out_dir: str):
    from trl.experimental.gold import GOLDConfig

    if args.same_tokenizer:  # GOLD's GKD path: generalized JSD over the shared vocabulary
        loss = {"use_uld_loss": False}
    else:
        loss = {
            "use_uld_loss": True,
            "use_extended_uld": True,
            "uld_use_hybrid_loss": True,
            "uld_token_merge_strategy": "bayesian",
            "teacher_tokenizer_name_or_path": args.teacher_tokenizer,
        }
    return GOLDConfig(
        **shared_settings(args, out_dir),
        max_length=args.max_length,
        lmbda=args.lmbda,  # share of on-policy micro-batches
        **loss,
    )


def distillation_config(args: argparse.Namespace, out_dir: str):
    """TRL's stable DistillationTrainer (on-policy only, one tokenizer): the same settings."""
    from trl import DistillationConfig

    if not args.same_tokenizer or args.lmbda != 1.0:
        raise SystemExit("--trainer distillation: on-policy (--lmbda 1) and --same-tokenizer only")
    return DistillationConfig(**shared_settings(args, out_dir))


def build_trainer(args: argparse.Namespace, out_dir: str, rows: list[dict], clock: StepClock):
    """The trainer of `--trainer`, its generation and teacher forwards timed by `clock`."""
    from datasets import Dataset

    common = {
        "model": AutoModelForCausalLM.from_pretrained(args.student),
        "teacher_model": AutoModelForCausalLM.from_pretrained(args.teacher),
        "processing_class": AutoTokenizer.from_pretrained(args.student_tokenizer),
        "callbacks": [clock],
    }
    if args.trainer == "distillation":
        from trl import DistillationTrainer

        prompts = [{"prompt": r["messages"][:-1]} for r in rows]
        trainer = DistillationTrainer(
            args=distillation_config(args, out_dir),
            train_dataset=Dataset.from_list(prompts),
            **common,
        )
        trainer._generate = clock.wrap("generate", trainer._generate)  # once per window
        # the teacher's backbone (its head runs inside TRL's chunked loss, timed as train)
        backbone = trainer.accelerator.unwrap_model(trainer.teacher_model).base_model
        backbone.forward = clock.wrap("teacher", backbone.forward)
        return trainer
    from trl.experimental.gold import GOLDTrainer

    trainer = GOLDTrainer(
        args=gold_config(args, out_dir), train_dataset=Dataset.from_list(rows), **common
    )
    trainer.generate_on_policy_outputs = clock.wrap("generate", trainer.generate_on_policy_outputs)
    teacher = trainer.teacher_model
    teacher.forward = clock.wrap("teacher", teacher.forward)
    return trainer


def settings(trainer) -> dict:
    """What TRL will run with, for the caller to compare with distil's config."""
    a, g = trainer.args, trainer.generation_config
    return {
        "per_device_batch_size": a.per_device_train_batch_size,
        "grad_accum_steps": a.gradient_accumulation_steps,
        "lr": a.learning_rate,
        "schedule": str(getattr(a.lr_scheduler_type, "value", a.lr_scheduler_type)),
        "weight_decay": a.weight_decay,
        "max_grad_norm": a.max_grad_norm,
        "lambda": getattr(trainer, "lmbda", 1.0),  # DistillationTrainer: on-policy only
        "beta": trainer.beta,
        "loss_temperature": trainer.temperature,
        "max_new_tokens": g.max_new_tokens,
        "temperature": g.temperature,
        "top_p": g.top_p,
        "top_k": g.top_k,
        "eos_token_id": g.eos_token_id,
        "use_uld_loss": getattr(trainer, "use_uld_loss", False),
        "device": str(trainer.accelerator.device),
    }


def first_prompt_ids(trainer, rows: list[dict]) -> list[int]:
    """The token ids of the first row's prompt, rendered as TRL's DataCollatorForChatML does."""
    tok = trainer.processing_class
    text = tok.apply_chat_template(
        rows[0]["messages"][:-1], add_generation_prompt=True, tokenize=False
    )
    return tok(text, add_special_tokens=False)["input_ids"]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--student", required=True)
    p.add_argument("--teacher", required=True)
    p.add_argument("--student-tokenizer", required=True, help="a directory with no config.json")
    p.add_argument("--teacher-tokenizer", required=True, help="a directory with no config.json")
    p.add_argument("--data", required=True)
    p.add_argument("--trainer", choices=("gold", "distillation"), default="gold")
    p.add_argument("--same-tokenizer", action="store_true", help="GKD path (no ULD)")
    p.add_argument("--lmbda", type=float, default=1.0, help="share of on-policy micro-batches")
    p.add_argument("--beta", type=float, default=0.5, help="JSD mix: 0 forward, 1 reverse KL")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--ga", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)

    import transformers
    import trl

    clock, lengths = StepClock(args.device), []
    rows = messages(args.data)
    teacher_tok = AutoTokenizer.from_pretrained(args.teacher_tokenizer)
    with tempfile.TemporaryDirectory() as out_dir:
        trainer = build_trainer(args, out_dir, rows, clock)
        if args.same_tokenizer and trainer.processing_class.get_vocab() != teacher_tok.get_vocab():
            raise SystemExit("--same-tokenizer: the student and teacher vocabularies differ")
        trainer.compute_loss = record_lengths(trainer, lengths)
        trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    probe = {  # the ids TRL's tokenizers give, for the caller to compare with distil's
        "student": trainer.processing_class(PROBE, add_special_tokens=False)["input_ids"],
        "teacher": teacher_tok(PROBE, add_special_tokens=False)["input_ids"],
    }
    matched = getattr(getattr(trainer, "uld_loss_fn", None), "_teacher_matched_ids", None)
    result = {
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__},
        "threads": torch.get_num_threads(),
        "step_s": [e - b for b, e in zip(clock.begins, clock.ends, strict=True)],
        "interval_s": [b - a for a, b in zip(clock.ends, clock.ends[1:], strict=False)],
        "generate_s": clock.per_step("generate"),
        "teacher_s": clock.per_step("teacher"),
        "loss": [h["loss"] for h in logs],
        "completion_tokens": sum(lengths) / max(len(lengths), 1),
        "matched_vocab": None if matched is None else len(matched),
        "probe": PROBE,
        "probe_ids": probe,
        "prompt_ids": first_prompt_ids(trainer, rows),
        "settings": settings(trainer),
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
