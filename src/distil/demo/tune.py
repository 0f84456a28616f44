"""`distil demo --tune`: every run of configs/demo.yaml, distillation and controls alike, at each
learning rate of the pre-stated grid (`analysis.lr_grid`), on the tuning seed
(`analysis.tune_seed`, not a reported seed), each model scored on the dev split; the best lr
per run is the recipe's choice (ties: the smaller lr). The test split is never read here.

A control at lr x gets the student compute its distillation spent at lr x. In-training
evaluations are off (the choice reads only each final model's dev accuracy). The choices are
written to tune.md / tune.json; the configs (or the manifest's overrides of a run sharing its
config) carry them in train.lr (docs/LOG.md has the table).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from distil.demo.presets import CONFIG_DIR, Manifest, Run
from distil.demo.run import DemoRun
from distil.errors import ConfigError
from distil.progress import console


def lr_key(run: Run, lr: float) -> str:
    return f"{run.key}@lr{lr:g}"


def tuned_runs(m: Manifest) -> list[Run]:
    """The runs the grid tunes: every run, or with `analysis.tune_per_config` each config's
    first run only (a study's second slice shares its config, and so its lr: the grid costs
    half, and a run's `cost_of` must then be a tuned run)."""
    a = m.analysis
    assert a is not None
    out = list(m.runs)
    if a.tune_per_config:
        out = [r for i, r in enumerate(out) if all(x.config != r.config for x in out[:i])]
    unknown = sorted(set(a.tune_configs) - {r.config for r in m.runs})
    if unknown:
        raise ConfigError(f"analysis.tune_configs: {unknown} are not configs of the manifest's "
                          f"runs. Fix: name some of {sorted({r.config for r in m.runs})}")  # fmt: skip
    if a.tune_configs:
        out = [r for r in out if r.config in a.tune_configs]
    keys = {r.key for r in out}
    for r in out:
        if r.cost_of is not None and r.cost_of not in keys:
            raise ConfigError(
                f"--tune: run {r.key} takes the compute of {r.cost_of}, which is not tuned "
                "(not its config's first run under analysis.tune_per_config, or not in "
                "analysis.tune_configs). Fix: list the run it reads first, or tune its config too"
            )
    return out


def grid_of(m: Manifest, r: Run) -> tuple[float, ...]:
    """The lrs a tuned run is tried at: its config's `analysis.lr_grids`, else `lr_grid`."""
    assert m.analysis is not None
    return m.analysis.lr_grids.get(r.config, m.analysis.lr_grid)


def all_lrs(m: Manifest) -> list[float]:
    """Every lr some tuned run is tried at, ascending."""
    return sorted({lr for r in tuned_runs(m) for lr in grid_of(m, r)})


def grid_manifest(m: Manifest) -> Manifest:
    """`m` with each tuned run (`tuned_runs`) once per lr of the grid (its key suffixed with
    the lr, a control's `cost_of` the same lr's distillation), no in-training evaluation."""
    assert m.analysis is not None
    runs = []
    by_key = {r.key: r for r in m.runs}
    for lr in all_lrs(m):
        for r in (r for r in tuned_runs(m) if lr in grid_of(m, r)):
            if r.cost_of is not None and lr not in grid_of(m, by_key[r.cost_of]):
                raise ConfigError(
                    f"--tune: run {r.key} at lr {lr:g} takes the compute of {r.cost_of}, whose "
                    f"grid {list(grid_of(m, by_key[r.cost_of]))} lacks that lr. Fix: give both "
                    "configs the same grid (analysis.lr_grids)"
                )
            runs.append(
                replace(
                    r,
                    name=lr_key(r, lr),
                    cost_of=None if r.cost_of is None else f"{r.cost_of}@lr{lr:g}",
                    overrides={**r.overrides, "train.lr": lr, "train.eval_every": 0},
                )
            )
    return replace(m, runs=runs)


def choose(m: Manifest, accuracy: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Per run of `m`: its dev accuracy at each lr and the chosen lr (the best; ties: the
    smaller). `accuracy` by the grid run's key."""
    assert m.analysis is not None
    out = {}
    for r in tuned_runs(m):
        by_lr = {lr: accuracy[lr_key(r, lr)] for lr in grid_of(m, r)}
        best = max(by_lr.values())
        out[r.key] = {"dev_accuracy": by_lr, "lr": min(lr for lr, a in by_lr.items() if a == best)}
    return out


def tuning_table(m: Manifest, chosen: dict[str, dict[str, Any]], configured: dict[str, float]):
    """Markdown: one row per run, its dev accuracy per lr (the chosen one in bold), the lr it
    holds now and where to set the choice (`lr_home`)."""
    grid = all_lrs(m)
    head = ["Run", "Student", *(f"lr {lr:g}" for lr in grid), "Chosen", "Config now", "Set it in"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in tuned_runs(m):
        c = chosen[r.key]
        cells = [r.key, r.student]
        for lr in grid:
            if lr not in c["dev_accuracy"]:  # not in this config's grid
                cells.append("")
                continue
            text = f"{100 * c['dev_accuracy'][lr]:.1f}%"
            cells.append(f"**{text}**" if lr == c["lr"] else text)
        cells += [f"{c['lr']:g}", f"{configured[r.key]:g}", lr_home(m, r)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def lr_home(m: Manifest, r: Run) -> str:
    """Where a run's chosen lr goes: its config's train.lr, or, when the manifest already
    overrides it or the run shares its config with an earlier run (a study's second slice),
    the run's `overrides` in the manifest (one config holds one lr). Tuned per config: the
    config, for every run sharing it."""
    first = next(x for x in m.runs if x.config == r.config)
    if m.analysis is not None and m.analysis.tune_per_config and "train.lr" not in r.overrides:
        others = [x.key for x in m.runs if x.config == r.config and x is not r]
        return f"{r.config}.yaml" + (f" (also {', '.join(others)})" if others else "")
    if "train.lr" in r.overrides or first is not r:
        return f"the manifest: {r.key}'s overrides"
    return f"{r.config}.yaml"


def configured_lrs(m: Manifest) -> dict[str, float]:
    """Each run's train.lr as its config (and demo.yaml overrides) hold it now."""
    import yaml

    def lr(r: Run) -> float:
        raw = yaml.safe_load((CONFIG_DIR / f"{r.config}.yaml").read_text())
        return float(r.overrides.get("train.lr", raw["train"]["lr"]))

    return {r.key: lr(r) for r in m.runs}


def dev_split(run: DemoRun, r: Run):
    """The dev split a run's curves read (its config's eval.data, with the manifest's
    overrides, moved under --out): the demo's data/dev.jsonl, or a study slice's."""
    from distil.demo.stages import _config, moved_paths

    values = {**moved_paths(run, _config(r.config)), **moved_paths(run, r.overrides)}
    return values.get("eval.data", run.paths["data"] / "dev.jsonl")


def evaluate_dev(run: DemoRun) -> dict[str, float]:
    """Every grid run's final model on its dev split (greedy, the table's settings)."""
    from distil.config import EvalConfig
    from distil.eval.runner import evaluate_model, load_problems
    from distil.tasks.countdown import Countdown

    splits: dict[str, tuple] = {}
    out = {}
    for r in run.manifest.runs:
        dev = str(dev_split(run, r))
        if dev not in splits:
            task = Countdown(EvalConfig(data=dev, n=run.preset.n_dev, max_new_tokens=32,
                                        batch_size=128, template="countdown_plain"))  # fmt: skip
            splits[dev] = (task, load_problems(task))
        task, problems = splits[dev]
        model = str(run.paths["runs"] / r.key / "final")
        out[r.key] = evaluate_model(model, task, name=r.key, problems=problems).summary["accuracy"]
        console.print(f"{r.key}: {100 * out[r.key]:.1f}% on dev")
    return out


def run_tuning(run: DemoRun, *, prepared: bool = False) -> dict[str, Any]:
    """The grid on the tuning seed (data, tokenizers and teacher as the demo's; `prepared`: a
    study made its own), each run scored on its dev split; writes tune.md and tune.json under
    the run's output directory."""
    from distil.demo import lanes, teachers
    from distil.demo.report import machine

    base = run.manifest
    grid = replace(run, manifest=grid_manifest(base), seed=base.analysis.tune_seed)
    if not prepared:
        teachers.train_teacher(run)
    lanes.run_seeds([grid])
    with run.timed("evaluation of every grid run on the dev split"):
        accuracy = evaluate_dev(grid)
    chosen = choose(base, accuracy)
    table = tuning_table(base, chosen, configured_lrs(base))
    head = (
        f"`{run.command or 'distil demo --tune'}`: lr grid {all_lrs(base)} on seed "
        f"{base.analysis.tune_seed}, {run.preset.n_dev} dev problems of each run's split (greedy, "
        "strict checker), "
        f"{machine()}, {run.threads} threads"
    )
    (run.out / "tune.md").write_text(f"{head}\n\n{table}\n")
    payload = {"command": run.command, "machine": machine(), "chosen": chosen, "dev": accuracy}
    (run.out / "tune.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"\n{head}\n\n{table}\n", flush=True)
    return payload
