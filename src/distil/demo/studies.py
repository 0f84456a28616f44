"""`distil demo --study NAME`: the CPU studies (several teachers; self-distillation; a task's
reward with the teacher), on the demo's machinery (its data, tokenizers, students' starts and
`distil train` stages), outside the default demo.

- `multi-teacher` (configs/study_multi_teacher.yaml): Countdown in two slices, three-number and
  four-number problems; one teacher trained on each slice; the bpe student's supervised start
  on a labelled mix; then the student distilled from both teachers at once, each row routed by
  its `slice` column (`teachers.column`), against the student distilled from each teacher
  alone and continued SFT at equal student compute. Each model is scored per slice and on the
  mix.
- `self-distill` (configs/study_self_distill.yaml): the demo's data and bpe student, its own
  teacher (`teacher.from_student: initial`, its frozen starting weights) given the row's
  reference answer (privileged context) or worked examples as a system prompt (context distillation), against its start
  and continued SFT on the same labelled problems at equal student compute.
- `reward` (configs/study_reward.yaml): GRPO alone, on-policy distillation alone and both in
  one update, for the bpe student (same tokenizer as the teacher) and the char student (across
  tokenizers), every arm at the distillation arm's student compute; on the demo's
  three-number problems with the demo's teacher, and on four-number problems with a
  four-number teacher (the multi-teacher study's recipe: a weak teacher). The students start
  from labelled problems of both slices (`reward_data`).

Each study is a manifest in demo.yaml's format (students, runs, presets: `smoke` for tests,
`full` for numbers); its runs are ordinary configs in configs/ whose `runs/demo/` paths, also
nested ones such as teachers.models.<name>.path, move under --out. The tables are written by
study_report.py (imports point one way: studies -> study_report).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from distil.demo import stages, teachers
from distil.demo.presets import CONFIG_DIR, Manifest, manifest
from distil.demo.run import DemoRun, code_version, content_hash, settings_key
from distil.demo.study_report import SEED_SUMMARY, SLICE_COLUMN, SLICES, load_seed_summary, report
from distil.errors import ConfigError
from distil.progress import console

STUDIES = {
    "multi-teacher": "study_multi_teacher",
    "self-distill": "study_self_distill",
    "reward": "study_reward",
}


def study_manifest(name: str) -> Manifest:
    if name not in STUDIES:
        raise ConfigError(f"--study {name!r} is not a study. Fix: use one of {', '.join(STUDIES)}")
    return manifest(CONFIG_DIR / f"{STUDIES[name]}.yaml")


def run_study(
    name: str,
    out: str | Path,
    *,
    preset: str = "full",
    threads: int = 2,
    cache_dir: str | Path | None = None,
    command: str = "",
    seeds: int = 1,
    lanes: int = 1,
    resume: bool = False,
    tune: bool = False,
) -> dict[str, Any]:
    """Run one study end to end on seeds 0..seeds-1 (the teachers trained once, the students'
    starts and runs per seed, in `lanes` worker processes); returns its results (also
    out/results.{md,json}). `tune`: instead, every run at each lr of the manifest's
    analysis.lr_grid on its tuning seed, scored on each run's dev split (tune.py)."""
    import torch

    from distil.demo import lanes as lanes_
    from distil.demo.run import default_cache_dir

    m = study_manifest(name)
    if preset not in m.presets:
        raise ConfigError(
            f"--preset {preset!r} is not a preset of the {name} study. Fix: use one of "
            f"{', '.join(m.presets)} (configs/{STUDIES[name]}.yaml)"
        )
    torch.set_num_threads(threads)
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    run = DemoRun(Path(out), preset, m.presets[preset], m, threads, cache, command=command,
                  n_seeds=seeds, lanes=lanes, resume=resume)  # fmt: skip
    run.out.mkdir(parents=True, exist_ok=True)
    if not resume:  # a seed's summary stands for its stages: reused with them or not at all
        for k in range(seeds):
            (run.for_seed(k).seed_dir / SEED_SUMMARY).unlink(missing_ok=True)
    if name == "multi-teacher":
        make_slices(run)
        stages.make_tokenizers(run)
        for slice_name in SLICES:
            train_slice_teacher(run, slice_name)
        train_general_teacher(run)
    elif name == "reward":
        reward_data(run)
        stages.make_tokenizers(run)
        teachers.train_teacher(run)  # three numbers: the demo's teacher (its cache)
        if not tune or _tuning_reads(m, "teacher_four"):
            train_slice_teacher(run, "four")  # four numbers: as the multi-teacher study's
    else:
        stages.make_data(run)
        stages.make_tokenizers(run)
        teachers.train_teacher(run)  # the positive control's: the demo's teacher
        context_start_data(run)
    if tune:
        from distil.demo.tune import run_tuning

        if m.analysis is None:
            raise ConfigError(f"--tune: the {name} study states no analysis.lr_grid to tune over")
        return run_tuning(run, prepared=True)
    seeded = [run.for_seed(k) for k in range(seeds)]
    todo = [s for s in seeded if load_seed_summary(name, s) is None]
    reused = tuple(s.seed for s in seeded if all(s is not t for t in todo))
    for k in reused:
        console.print(f"seed {k}: finished (its summary in {seeded[k].seed_dir}, --resume)")
    if todo:
        lanes_.run_seeds(todo, study=name)
    return report(name, seeded, reused)


def _tuning_reads(m: Manifest, model: str) -> bool:
    """Whether a run the tuning grid trains reads models/<model> (a teacher that no tuned run
    reads is not trained for --tune)."""
    from distil.demo.tune import tuned_runs

    return any(f"models/{model}" in str(v) for r in tuned_runs(m) for v in r.overrides.values())


# ----------------------------------------------------------------------------- data


def _interleave(*parts: list[dict]) -> list[dict]:
    """Rows of each part in turn (a0 b0 a1 b1 ...), the longer part's tail at the end."""
    out = []
    for i in range(max(len(p) for p in parts)):
        out += [p[i] for p in parts if i < len(p)]
    return out


def make_slices(run: DemoRun) -> None:
    """Per slice its train, dev and test split (data/<slice>/); for the student, the two slices'
    rows interleaved and tagged with `slice`: labelled.jsonl (n_labelled, half from each,
    with answers), prompts.jsonl (the other train rows, prompts only), dev.jsonl and test.jsonl
    (both slices' dev and test splits); train.jsonl (both train splits) is the tokenizers'
    corpus and the generalist teacher's data."""
    from distil.tasks.countdown import generate_dataset, read_rows

    p, data = run.preset, run.paths["data"]
    with run.timed("Countdown data: one slice per number count") as stage:
        wanted = {"n": p.n_train, "test_n": p.n_test, "dev_n": p.n_dev,
                  "n_labelled": p.n_labelled, "slices": SLICES, "seed": stages.SEED}  # fmt: skip
        meta = data / "study.json"
        if not (meta.exists() and json.loads(meta.read_text()) == wanted):
            parts: dict[str, dict[str, list[dict]]] = {}
            half = p.n_labelled // len(SLICES)
            for name, k in SLICES.items():
                seed = stages.SEED + k
                generate_dataset(data / name, n=p.n_train, test_n=p.n_test, dev_n=p.n_dev,
                                 numbers=(k,), seed=seed, template="countdown_plain")  # fmt: skip
                split = {s: [{**r, SLICE_COLUMN: name} for r in read_rows(data / name / f"{s}.jsonl")]
                         for s in ("train", "dev", "test")}  # fmt: skip
                rows = split["train"]
                keep = ("nums", "target", "prompt", SLICE_COLUMN)
                prompts = [{c: r[c] for c in keep} for r in rows[half:]]
                parts[name] = {**split, "labelled": rows[:half], "prompts": prompts}
                run.commands.append(
                    f"distil countdown generate --n {p.n_train} --test-n {p.n_test} --dev-n "
                    f"{p.n_dev} --numbers {k} --template countdown_plain --seed {seed} --out "
                    f"{data / name}"
                )
            for split in ("train", "labelled", "prompts", "dev", "test"):
                rows = _interleave(*(parts[n][split] for n in SLICES))
                stages._write_jsonl(data / f"{split}.jsonl", rows)
            meta.write_text(json.dumps(wanted))
        stage.note = (
            f"{' and '.join(f'{k}-number' for k in SLICES.values())} problems: {p.n_train} "
            f"train, {p.n_dev} dev and {p.n_test} test each; {p.n_labelled} labelled "
            f"({SLICE_COLUMN} column)"
        )
        console.print(stage.note)


def reward_data(run: DemoRun) -> None:
    """The reward study's data: the demo's three-number problems (stages.make_data, which the
    demo's teacher reads), four-number problems under data/four/ (train: its teacher's; the
    rows after the labelled ones as prompts.jsonl; dev; test) and labelled_mix.jsonl, the
    students' start: n_labelled labelled problems, half from each slice, interleaved."""
    from distil.tasks.countdown import generate_dataset, read_rows

    stages.make_data(run)
    p, data = run.preset, run.paths["data"]
    four, n, half, seed = data / "four", p.n_slice or p.n_train, p.n_labelled // 2, stages.SEED + 4
    with run.timed("four-number problems; the students' labelled mix of both slices") as stage:
        wanted = {"n": n, "test_n": p.n_test, "dev_n": p.n_dev, "n_labelled": p.n_labelled,
                  "seed": seed, "three": content_hash(data / "labelled.jsonl")}  # fmt: skip
        meta = four / "study.json"
        if not (meta.exists() and json.loads(meta.read_text()) == wanted):
            generate_dataset(four, n=n, test_n=p.n_test, dev_n=p.n_dev, numbers=(4,),
                             seed=seed, template="countdown_plain")  # fmt: skip
            rows = read_rows(four / "train.jsonl")
            prompts = [{k: r[k] for k in ("nums", "target", "prompt")} for r in rows[half:]]
            stages._write_jsonl(four / "prompts.jsonl", prompts)
            three = read_rows(data / "labelled.jsonl")[:half]
            stages._write_jsonl(data / "labelled_mix.jsonl", _interleave(three, rows[:half]))
            meta.write_text(json.dumps(wanted))
        run.commands.append(
            f"distil countdown generate --n {n} --test-n {p.n_test} --dev-n {p.n_dev} --numbers "
            f"4 --template countdown_plain --seed {seed} --out {four}"
        )
        stage.note = (f"{n} four-number problems ({n - half} prompts), {p.n_dev} dev, {p.n_test} "
                      f"test; {2 * half} labelled (half of each slice)")  # fmt: skip
        console.print(stage.note)


def context_start_data(run: DemoRun) -> None:
    """Each student's `start_data` in the self-distillation study: the labelled rows as they are, and again with
    the prompt each run's teacher is shown (its context template filled from the row, its
    system text), interleaved. A start that never saw such prompts reads them worse than none:
    the demo's start scores the reference answer at -11.0 nats with it in context against
    -4.8 without (docs/LOG.md), so its own teacher would only confuse it."""
    from distil.data.context import context_prompt
    from distil.data.datasets import load_examples

    labelled = run.paths["data"] / "labelled.jsonl"
    rows = [json.loads(line) for line in labelled.read_text().splitlines()]
    examples = load_examples(str(labelled))
    parts = [rows]
    for r in run.manifest.runs:
        t = stages._config(r.config).get("teacher") or {}
        if t.get("context") or t.get("system"):
            shown = [context_prompt(e, t.get("context"), t.get("system")) for e in examples]
            parts.append([{**row, "prompt": p} for row, p in zip(rows, shown, strict=True)])
    with run.timed("start data: the labelled rows, also as each teacher sees them") as stage:
        for s in run.manifest.students.values():
            if s.start_data:
                stages._write_jsonl(stages.moved(run, s.start_data), _interleave(*parts))
        stage.note = f"{len(rows)} rows x {len(parts)} prompts (the student's, each teacher's)"


# ----------------------------------------------------------------------------- teachers


def train_slice_teacher(run: DemoRun, name: str) -> None:
    """One slice's teacher: the demo's teacher config on that slice's problems only, cached by
    its settings as the demo's teacher is."""
    data = run.paths["data"] / name
    _study_teacher(run, f"teacher_{name}", f"the {name}-number slice", data / "train.jsonl",
                   data / "dev.jsonl", run.preset.steps["teacher"], stages.SEED + SLICES[name])  # fmt: skip


def train_general_teacher(run: DemoRun) -> None:
    """The generalist: the demo's teacher config on both slices' problems (interleaved), with
    the specialists' total budget (steps.general), the alternative to routing."""
    data = run.paths["data"]
    _study_teacher(run, "teacher_general", "both slices (generalist)", data / "train.jsonl",
                   data / "dev.jsonl", run.preset.steps["general"], stages.SEED)  # fmt: skip


def _study_teacher(run: DemoRun, name: str, what: str, train: Path, dev: Path, steps: int,
                   seed: int) -> None:  # fmt: skip
    """A study's teacher `name` (models/<name>, shared by the seeds) trained on `train` from a
    `seed` init, cached by everything that determines it."""
    p = run.preset
    final = run.out / "models" / name
    tokenizer = run.paths["tokenizers"] / "bpe" / "tokenizer.json"
    key = settings_key(p.teacher, steps, seed, run.threads, p.n_train, name,
                       (CONFIG_DIR / "teacher.yaml").read_text(), content_hash(tokenizer),
                       content_hash(train), content_hash(dev), code_version())  # fmt: skip
    cached = run.cache_dir / f"{name}-{key}-{steps}steps"
    with run.timed(f"teacher of {what} ({steps} steps)") as stage:
        if teachers.use_cached_teacher(cached, final, stage):
            return
        init = stages._init(run, "bpe", run.out / "models" / f"{name}_init", p.teacher, seed)
        out = run.out / "runs" / name
        stages.train_stage(run, "teacher", {"data.train": train, "eval.data": dev,
                                            "student.path": init, "train.output_dir": out,
                                            "train.max_steps": steps})  # fmt: skip
        teachers.keep_teacher(run, out, final, cached, stage)
