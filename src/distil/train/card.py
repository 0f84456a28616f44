"""The model card of a trained student (README.md of `output_dir/final`, and of a Hub repo
`distil push` or `train.push_to_hub` uploads): who taught whom with which loss, lambda and
data, the steps and compute spent, the final evaluation, and the command that reproduces the
run from the resolved config saved beside it (`distil_config.yaml`).

Everything on the card is read from the config and the run's metrics (metrics.jsonl), so the
card of a run directory is the same whether it is written at the end of training or later.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import yaml

from distil.config import DistilConfig
from distil.paths import looks_local

CONFIG_FILE = "distil_config.yaml"  # the resolved config, saved beside the final weights
INPUT_FILE = "distil_input.json"  # what the Python API records of a model passed loaded


def model_card(cfg: DistilConfig, rows: list[dict[str, Any]], *, title: str | None = None) -> str:
    """The card's Markdown (YAML front matter for the Hub, then the text) of a run with config
    `cfg` whose logged steps are `rows`; `title` defaults to logging.run_name."""
    version = distil_version()
    last = rows[-1] if rows else {}
    table = [
        ("student", f"`{model_name(cfg.student.path)}`"),
        ("teacher", teacher_text(cfg)),
        ("loss", f"`{cfg.loss.name}` (beta {cfg.loss.beta}, temperature {cfg.loss.temperature})"),
        ("lambda (share of on-policy slices)", f"{cfg.train.lambda_}{_seq_kd(cfg)}"),
        ("data", data_text(cfg)),
        ("steps", steps_text(cfg, last)),
        ("compute", compute_text(last)),
        ("final loss", f"{last['loss']:.4f} (step {last['step']})" if "loss" in last else "-"),
    ]
    lines = [
        front_matter(cfg),
        f"# {title or cfg.logging.run_name}",
        "",
        f"A student distilled from a teacher's next-token distributions with distil {version}.",
        "",
        "| | |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in table),
        "",
        "## Final evaluation",
        "",
        *evaluation_lines(cfg, rows),
        "",
        "## Reproduce",
        "",
        *reproduce_lines(cfg, version),
    ]
    return "\n".join(lines) + "\n"


def reproduce_lines(cfg: DistilConfig, version: str) -> list[str]:
    """The command that trains the run again from the saved config. A model passed to the
    Python API already loaded left its side's path pointing at `output_dir/inputs/<side>`
    (its config.json, no weights): the command then sets that path to the name the model was
    loaded from, and a note says so."""
    loaded = [
        (side, section.path, recorded_name(section.path))
        for side, section in (("student", cfg.student), ("teacher", cfg.teacher))
        if section.path and (Path(section.path) / INPUT_FILE).is_file()
    ]
    fixes = "".join(f" {shlex.quote(f'{side}.path={name}')}" for side, _, name in loaded if name)
    lines = [
        "```bash",
        f"distil train {CONFIG_FILE}{fixes}    # distil {version}",
        "```",
        "",
        f"`{CONFIG_FILE}` is the run's resolved config (every value, defaults included); "
        "the local paths in it are those of the machine it ran on.",
    ]
    for side, path, name in loaded:
        then = (
            f"the command sets `{side}.path` to the name it was loaded from (`{name}`); if "
            "its weights were changed after loading, set it to a copy of the weights it "
            "started from instead"
            if name
            else f"set `{side}.path=` to a directory or hub id of the weights it started from"
        )
        lines += [
            "",
            f"The {side} was passed to distil's Python API already loaded, so `{side}.path` "
            f"in `{CONFIG_FILE}` is `{path}`, which holds its config.json but not its "
            f"weights: {then}.",
        ]
    return lines


def distil_version() -> str:
    """The installed distil's version (the package metadata: distil/__init__.py is above this
    layer)."""
    from importlib import metadata

    try:
        return metadata.version("distil")
    except metadata.PackageNotFoundError:
        return "unknown"


def front_matter(cfg: DistilConfig) -> str:
    """The Hub's metadata block: base_model and datasets only where they are hub ids."""
    meta: dict[str, Any] = {}
    student = model_name(cfg.student.path)
    if student and not looks_local(student):
        meta["base_model"] = student
    if cfg.data.train and not looks_local(cfg.data.train):
        meta["datasets"] = [cfg.data.train]
    meta.update(
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=["distil", "distillation"],
    )
    return f"---\n{yaml.safe_dump(meta, sort_keys=False)}---\n"


def model_name(path: str | None) -> str:
    """A model's name as the card shows it: the hub id or directory, or, for a model passed
    to the Python API already loaded, the name it was loaded from."""
    if not path:
        return "-"
    return recorded_name(path) or path


def recorded_name(path: str | None) -> str:
    """The name a model passed to the Python API loaded was loaded from ("" when `path` is
    not such a model's directory, or the model had no name)."""
    recorded = Path(path or "") / INPUT_FILE
    if not path or not recorded.is_file():
        return ""
    try:
        return str(json.loads(recorded.read_text()).get("name_or_path") or "")
    except (OSError, ValueError, AttributeError):
        return ""


def teacher_text(cfg: DistilConfig) -> str:
    t = cfg.teacher
    if cfg.teachers.models:
        named = [
            f"`{model_name(m.path or m.cache or m.url)}` ({n})"
            for n, m in cfg.teachers.models.items()
        ]
        how = f"mixed by {cfg.teachers.weights}" if cfg.teachers.weights else "routed per row"
        return f"{', '.join(named)}; {how}"
    if t.from_student:
        return f"the student itself (teacher.from_student: {t.from_student})"
    if t.url:
        return f"`{t.path}` served at {t.url}"
    if t.cache:
        return f"`{model_name(t.path)}`, top-k read from the cache {t.cache}"
    return f"`{model_name(t.path)}`" if t.path else "none"


def _seq_kd(cfg: DistilConfig) -> str:
    return "; off-policy slices written by the teacher (seq-KD)" if cfg.train.seq_kd else ""


def data_text(cfg: DistilConfig) -> str:
    d = cfg.data
    if not d.train:
        return "-"
    if looks_local(d.train):
        return f"`{d.train}`"
    subset = f"subset {d.subset}, " if d.subset else ""
    return f"`{d.train}` ({subset}split {d.split})"


def steps_text(cfg: DistilConfig, last: dict[str, Any]) -> str:
    t = cfg.train
    steps = last.get("step", 0)
    return (
        f"{steps} optimizer steps of {t.per_device_batch_size} sequences x "
        f"{t.grad_accum_steps} micro-batches per process, lr {t.lr} ({t.schedule})"
    )


def compute_text(last: dict[str, Any]) -> str:
    if "cost/student_flops" not in last:
        return "-"
    parts = [f"{last['cost/student_flops']:.3g} student FLOPs"]
    if last.get("cost/teacher_flops"):
        parts.append(f"{last['cost/teacher_flops']:.3g} teacher FLOPs")
    if "cost/student_train_tokens" in last:
        parts.append(f"{int(last['cost/student_train_tokens']):,} tokens trained on")
    if "time/train_clock" in last:
        parts.append(f"{last['time/train_clock'] / 60:.1f} minutes of training")
    return ", ".join(parts)


def evaluation_lines(cfg: DistilConfig, rows: list[dict[str, Any]]) -> list[str]:
    """The last evaluation's eval/* values (per-group accuracies left out) as a table."""
    evaluated = [r for r in rows if "eval/accuracy" in r]
    if not evaluated:
        return ["No evaluation ran during training (train.eval_every: 0)."]
    last = evaluated[-1]
    e = cfg.eval
    source = e.data or "the task's hub dataset"
    n = last.get("eval/problems", e.n)
    samples = f"{e.samples} sample{'s' * (e.samples != 1)} each"
    head = f"`{e.task}` on `{source}` ({n} problems, {samples}), step {last['step']}:"
    shown = [
        (k.removeprefix("eval/"), v)
        for k, v in last.items()
        if k.startswith("eval/") and not k.startswith("eval/group/") and k != "eval/seconds"
    ]
    return [
        head,
        "",
        "| metric | value |",
        "|---|---|",
        *(f"| {k} | {_number(v)} |" for k, v in shown),
    ]


def _number(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def metrics_rows(run_dir: str | Path) -> list[dict[str, Any]]:
    """The logged steps of a run directory (metrics.jsonl; [] when there is none)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:  # a line cut short by a kill: past any checkpoint
            continue
    return [r for r in rows if isinstance(r, dict)]


def run_card(run_dir: str | Path, *, title: str | None = None) -> str:
    """The card of a finished run directory: its final model's saved config and the metrics."""
    from distil.config import build_config

    run_dir = Path(run_dir)
    raw = yaml.safe_load((run_dir / "final" / CONFIG_FILE).read_text(encoding="utf-8"))
    return model_card(build_config(raw), metrics_rows(run_dir), title=title)
