"""`distil.Distiller`: a run from Python, the same run `distil train` makes from the command
line (the CLI calls this class), with models, tokenizers and data given as objects as well
as paths, and callbacks.

    import distil
    d = distil.Distiller("configs/qwen3_8b_to_qwen3_0.6b.yaml", {"train.max_steps": 50},
                         student=model, student_tokenizer=tok, train_data=dataset)
    d.validate()                 # `distil config validate`: ConfigError listing every problem
    print(distil.plan.render(d.plan()))  # `distil plan`
    result = d.train()           # `distil train`: result.metrics, result.final_model

Every error a user can cause is raised as a `DistilError` subclass (`ConfigError`,
`DataError`, ...) whose message says what was wrong and the fix; nothing is printed for it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distil.api.inputs import ConfigLike, Overrides, make_config
from distil.api.run_inputs import StagedInputs
from distil.errors import ConfigError
from distil.ranks import is_first_rank


@dataclass
class TrainResult:
    """What `Distiller.train` returns: the last step's metrics (those of metrics.jsonl, with
    the last evaluation's eval/* values when one ran then), the final model's directory (a
    plain transformers model with its model card) and, with train.push_to_hub, the Hub URL."""

    metrics: dict[str, Any]
    final_model: Path
    run_dir: Path
    hub_url: str | None = None


class Distiller:
    """A distillation run: its config (`.config`, validated) and the objects given for it.

    `config`: a YAML file or run directory, a dict of sections or a `DistilConfig`;
    `overrides`: ["train.max_steps=200", ...] as on the command line, or
    {"train.max_steps": 200}. `student`/`teacher`: a path or hub id, or a model already loaded
    (then `student_tokenizer`/`teacher_tokenizer` too, an object or a path): it is trained
    (the student) or scored with (the teacher) in place. `train_data` (data.train) and
    `eval_data` (eval.data, the problems of the in-training evaluation): a path or hub id, a
    `datasets.Dataset` or a list of dicts. Arguments given win over the config's values.
    `callbacks`: `distil.Callback` objects (or functions of (step, metrics)), called on each
    step's metrics, after each evaluation and after each checkpoint; any can stop the run.

    Objects are written as files (api/inputs.py) into a temporary directory, which `validate`
    and `plan` read; `train` moves them into output_dir/inputs under the run lock, where
    `.config` points (api/run_inputs.py).
    """

    def __init__(
        self,
        config: ConfigLike = None,
        overrides: Overrides = (),
        *,
        student: Any = None,
        student_tokenizer: Any = None,
        teacher: Any = None,
        teacher_tokenizer: Any = None,
        train_data: Any = None,
        eval_data: Any = None,
        callbacks: Iterable[Any | Callable] = (),
    ) -> None:
        self._staged = StagedInputs()  # objects as files: in output_dir/inputs at train()
        self._checked, self.models = make_config(
            config,
            overrides,
            models={
                "student": (student, student_tokenizer),
                "teacher": (teacher, teacher_tokenizer),
            },
            data={"data.train": train_data, "eval.data": eval_data},
            root=self._staged.root,
        )
        self.config = self._staged.run_config(self._checked)  # the paths the run will use
        self.callbacks = list(callbacks)

    def validate(self):
        """`distil config validate`: every check `train` makes before its first step that
        needs no weights. Returns the `Validation` (its notes, the tokenizers and first rows it
        read); raises ConfigError listing every problem."""
        return validate(self._checked, name="the config")

    def plan(self, device: str = "h100", **options: Any):
        """`distil plan`: `distil.plan(self.config, device=..., gpus=, fsdp=, gpu_memory=,
        tflops=, bandwidth=, context_tokens=)`, the memory and time of a step per device and
        phase (a `distil.plan.Plan`; `distil.plan.render(plan)` is the command's text)."""
        from distil.plan import plan

        return plan(self._checked, device=device, **options)

    def train(self) -> TrainResult:
        """`distil train`: run to the end (or resume), save the final model with its model
        card, push it when train.push_to_hub; the same steps, losses and files as the CLI."""
        from distil.train.loop import train

        cfg = self.config
        if cfg.train.push_to_hub:
            from distil.hub import check_token

            check_token(cfg.train.hub_model_id)  # before training, not after it
        metrics = train(cfg, models=self.models, callbacks=self.callbacks, prepare=self._publish)
        out = Path(cfg.train.output_dir)
        url = None
        if cfg.train.push_to_hub and is_first_rank():
            url = _push(out, cfg.train.hub_model_id, cfg.train.hub_private)
        return TrainResult(metrics, out / "final", out, url)

    def _publish(self) -> None:
        """Under the run lock, before anything is built: the objects' files into
        output_dir/inputs (the main process; a resume on other train rows refused), then every
        process waits for them (a run of paths only: nothing to do)."""
        if self._staged.empty:
            return
        if is_first_rank():
            self._staged.publish(self.config)
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            import torch
            from accelerate import PartialState

            PartialState(cpu=not torch.cuda.is_available()).wait_for_everyone()


def _push(out: Path, repo: str, private: bool) -> str:
    """The trained run's upload; any failure a HubError that says the model is saved and how
    to upload it again (a failure of the upload never hides the training's result)."""
    from distil.hub import HubError, push_run

    try:
        return push_run(out, repo, private=private)
    except Exception as exc:  # HubError, or whatever else the Hub client raised
        reason = str(exc) if isinstance(exc, HubError) else f"{type(exc).__name__}: {exc}"
        raise HubError(
            f"training finished and saved {out / 'final'}, but the upload failed: "
            f"{reason.rstrip('.')}. "
            f"Once fixed: distil push {out} --repo {repo}"
        ) from exc


def validate(cfg, *, name: str, notes: Callable[[str], Any] | None = None):
    """The checks of `distil config validate` on a built config (`preflight.validation`),
    each note handed to `notes` first; ConfigError naming `name` when the config is valid but
    cannot train."""
    from distil.preflight import validation

    v = validation(cfg)
    for note in v.notes if notes else ():
        notes(note)
    if v.problems:
        raise ConfigError(v.problems, header=f"{name} is valid but cannot train")
    return v
