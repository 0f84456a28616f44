"""The demo's presets and runs, read from configs/demo.yaml (package data): data sizes, model
sizes and budgets in optimizer steps per preset; the students; the distillation and control
runs in table order, each an ordinary config in configs/. A mistake in the file is a
ConfigError naming the entry and the fix."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from distil.errors import ConfigError

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
MANIFEST = CONFIG_DIR / "demo.yaml"
# the paths in the configs that `distil demo` moves under its --out directory
DEMO_ROOT = "runs/demo"


@dataclass(frozen=True)
class Preset:
    """One demo size. `steps`: optimizer steps of the teacher, of each student's start, and of
    every run that names a budget (`steps: cross` reads `steps["cross"]`)."""

    n_train: int
    n_test: int
    n_labelled: int
    n_dev: int  # a second held-out split for recipe choices and in-training curves
    teacher: tuple[int, int, int, int]  # hidden, layers, heads, intermediate
    student: tuple[int, int, int, int]
    steps: dict[str, int]
    eval_every: int | None  # None: the configs' own
    eval_n: int
    bpe_vocab: int = 512
    n_slice: int | None = None  # the reward study's four-number problems (null: n_train)
    # minutes measured on the reference machine (2 cores, 2 threads, 2 lanes): the teacher's
    # training and one seed's students' stages, for the estimate printed before a run
    minutes: dict[str, Any] | None = None  # teacher, seed (floats), machine (text)
    # the default --lanes (None: 2 where --threads is 2 or more). A preset whose stages take
    # seconds sets 1: each lane is a process that imports torch and transformers first
    lanes: int | None = None


@dataclass(frozen=True)
class Student:
    name: str
    tokenizer: str  # bpe | char
    seed: int
    # its supervised start's data.train, prompts as written (data.template null); default: the
    # start config's labelled set, rendered by its template
    start_data: str | None = None


@dataclass(frozen=True)
class Run:
    """A distillation or control run of one student: `steps` (a preset budget name) or
    `cost_of` (the run whose student compute it gets) sets how long it trains."""

    config: str
    student: str
    label: str
    steps: str | None = None
    cost_of: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    name: str | None = None  # its run directory and `cost_of` key (default: the config's name)

    @property
    def key(self) -> str:
        return self.name or self.config


@dataclass(frozen=True)
class Writes:
    """The teacher writing completions for a seed's prompts once: configs/<config>.yaml's
    generation settings, enough rows for the preset's `steps` budget of `batch`-row windows."""

    config: str
    steps: str
    batch: int


@dataclass(frozen=True)
class Analysis:
    """The analysis stated before the runs: how many seeds are reported (none added after the
    results are seen), the seed and learning-rate grid of the tuning runs (scored on dev), and
    the test: each distilled student against each of its equal-compute controls, paired by
    seed, two-sided paired t, Holm-adjusted over every comparison; a win is an adjusted p below
    `alpha` with a positive mean lead."""

    seeds: int
    tune_seed: int
    lr_grid: tuple[float, ...]
    alpha: float = 0.05
    correction: str = "holm"
    tune_per_config: bool = False  # tune each config once, on its first run (tune.tuned_runs)
    # a config's own grid instead of lr_grid, and the configs --tune runs (empty: all)
    lr_grids: dict[str, tuple[float, ...]] = field(default_factory=dict)
    tune_configs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Manifest:
    students: dict[str, Student]
    runs: list[Run]
    presets: dict[str, Preset]
    writes: Writes | None = None
    analysis: Analysis | None = None
    # a study's paired comparisons: (run, other run) keys, the first's lead over the second
    comparisons: tuple[tuple[str, str], ...] = ()


@cache
def manifest(path: str | Path = MANIFEST) -> Manifest:
    """configs/demo.yaml, checked (every problem reported at once)."""
    import yaml

    raw = yaml.safe_load(Path(path).read_text())
    problems: list[str] = []
    students = {
        name: Student(name, s["tokenizer"], int(s["seed"]), s.get("start_data"))
        for name, s in _section(raw, "students", problems).items()
    }
    for name, s in students.items():
        if s.start_data is not None and not str(s.start_data).startswith(DEMO_ROOT + "/"):
            problems.append(
                f"students.{name}.start_data must be a path under {DEMO_ROOT}/ (moved under "
                f"--out), got {s.start_data!r}"
            )
    runs = [_run(i, r, problems) for i, r in enumerate(raw.get("runs") or [])]
    presets = {
        name: _preset(name, p, problems) for name, p in _section(raw, "presets", problems).items()
    }
    writes = _writes(raw.get("writes"), presets, problems)
    analysis = _analysis(raw.get("analysis"), problems)
    comparisons = tuple(tuple(c) for c in raw.get("comparisons") or ())
    keys = {r.key for r in runs}
    for c in comparisons:
        if len(c) != 2 or not set(c) <= keys:
            problems.append(f"comparisons: {list(c)} must name two runs of {sorted(keys)}")
    _cross_check(students, runs, presets, problems)
    if problems:
        raise ConfigError(f"{path}: " + "; ".join(problems))
    return Manifest(students, runs, presets, writes, analysis, comparisons)


def _analysis(raw: Any, problems: list[str]) -> Analysis | None:
    if raw is None:
        return None
    try:
        grids = {k: tuple(float(x) for x in v) for k, v in (raw.get("lr_grids") or {}).items()}
        a = Analysis(**{**raw, "lr_grid": tuple(float(x) for x in raw["lr_grid"]),
                        "lr_grids": grids, "tune_configs": tuple(raw.get("tune_configs") or ())})  # fmt: skip
    except (TypeError, KeyError, ValueError) as exc:
        problems.append(f"analysis: {exc} (needs seeds, tune_seed, lr_grid; alpha, correction)")
        return None
    if a.correction != "holm" or not 0 < a.alpha < 1 or a.seeds < 2 or not a.lr_grid:
        problems.append(
            f"analysis: correction must be holm, 0 < alpha < 1, seeds >= 2 and lr_grid not "
            f"empty, got {a}"
        )
    return a


def _writes(raw: Any, presets: dict[str, Preset], problems: list[str]) -> Writes | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != {"config", "steps", "batch"}:
        problems.append(f"'writes' needs exactly config, steps and batch, got {raw!r}")
        return None
    if not (CONFIG_DIR / f"{raw['config']}.yaml").is_file():
        problems.append(f"writes: no config {raw['config']}.yaml in {CONFIG_DIR}")
    if not isinstance(raw["batch"], int) or raw["batch"] <= 0:
        problems.append(f"writes: batch must be a positive int, got {raw['batch']!r}")
    for pname, p in presets.items():
        if raw["steps"] not in p.steps:
            problems.append(f"preset {pname} has no steps.{raw['steps']} (writes uses it)")
    return Writes(str(raw["config"]), str(raw["steps"]), raw["batch"])


def _section(raw: Any, key: str, problems: list[str]) -> dict[str, Any]:
    value = raw.get(key) if isinstance(raw, dict) else None
    if not isinstance(value, dict) or not value:
        problems.append(f"'{key}' must be a non-empty mapping, got {value!r}")
        return {}
    return value


_RUN_KEYS = {"config", "student", "label", "steps", "cost_of", "overrides", "name"}


def _run(i: int, raw: Any, problems: list[str]) -> Run:
    where = f"runs[{i}]"
    if not isinstance(raw, dict) or not {"config", "student", "label"} <= set(raw):
        problems.append(f"{where} needs config, student and label, got {raw!r}")
        return Run("?", "?", "?", steps="?")
    if extra := set(raw) - _RUN_KEYS:
        problems.append(f"{where} has unknown keys {sorted(extra)}; valid: {sorted(_RUN_KEYS)}")
    if ("steps" in raw) == ("cost_of" in raw):
        problems.append(f"{where} ({raw['config']}) needs exactly one of steps and cost_of")
    if not (CONFIG_DIR / f"{raw['config']}.yaml").is_file():
        problems.append(f"{where}: no config {raw['config']}.yaml in {CONFIG_DIR}")
    return Run(**{k: v for k, v in raw.items() if k in _RUN_KEYS})


def _preset(name: str, raw: Any, problems: list[str]) -> Preset:
    try:
        preset = Preset(**raw)
    except TypeError as exc:
        problems.append(f"preset {name}: {exc}")
        return Preset(0, 0, 0, 0, (0, 0, 0, 0), (0, 0, 0, 0), {}, None, 0)
    preset = Preset(**{**raw, "teacher": tuple(raw["teacher"]), "student": tuple(raw["student"])})
    bad = {k: v for k, v in preset.steps.items() if not isinstance(v, int) or v <= 0}
    if bad or not {"teacher", "start"} <= set(preset.steps):
        problems.append(
            f"preset {name}: steps must map teacher, start and each run's budget to positive "
            f"ints, got {preset.steps}"
        )
    return preset


def _cross_check(students, runs, presets, problems: list[str]) -> None:
    names = [r.key for r in runs]
    for i, r in enumerate(runs):
        if r.key in names[:i]:
            problems.append(f"runs[{i}]: a second run named {r.key!r}; give it its own `name:`")
        if r.student not in students:
            problems.append(f"runs[{i}]: student {r.student!r} is not one of {sorted(students)}")
        if r.cost_of is not None and r.cost_of not in names[:i]:
            problems.append(f"runs[{i}]: cost_of {r.cost_of!r} must name a run listed before it")
        for pname, p in presets.items():
            if r.steps is not None and r.steps not in p.steps:
                problems.append(f"preset {pname} has no steps.{r.steps} (runs[{i}] uses it)")


def default_lanes(preset: Preset | None, threads: int) -> int:
    """The lanes a run gets without --lanes: the preset's, else 2 (at most one a thread)."""
    wanted = preset.lanes if preset is not None and preset.lanes else 2
    return max(1, min(wanted, threads))


def budget_steps(preset: Preset, run: Run, scale: float) -> int:
    """Optimizer steps of a `steps:` run: the preset's budget times the distillation scale."""
    assert run.steps is not None
    return max(1, round(preset.steps[run.steps] * scale))
