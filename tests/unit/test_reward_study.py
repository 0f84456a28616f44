"""The reward study's manifest and configs (`distil demo --study reward`), read without training:
each panel's three arms differ only in the loss, the teacher and the lr (each arm's own, from
the grid), share start, data, sampling and schedule, and are compared on their own slice;
--tune scores each run on its slice's dev split. The end-to-end smoke run is
tests/integration/test_demo_studies.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from distil.config import load_config
from distil.demo.presets import CONFIG_DIR
from distil.demo.run import DemoRun
from distil.demo.stages import _config, moved_paths
from distil.demo.studies import study_manifest
from distil.demo.study_report import compared_on
from distil.demo.tune import dev_split, grid_manifest, grid_of

m = study_manifest("reward")
runs = {r.key: r for r in m.runs}
# the manifest tuning every config over the one grid (as at 7f71169, before lr_grids and
# tune_configs named the char configs)
shared = replace(m, analysis=replace(m.analysis, lr_grids={}, tune_configs=()))
PANELS = [(s, four) for s in ("bpe", "char") for four in ("", "4")]


def resolved(run: DemoRun, key: str):
    """The run's config as the study trains it (paths moved, the manifest's overrides)."""
    r = runs[key]
    values = {**moved_paths(run, _config(r.config)), **r.overrides, **moved_paths(run, r.overrides)}
    return load_config(CONFIG_DIR / f"{r.config}.yaml", [f"{k}={v}" for k, v in values.items()])


@pytest.fixture
def run(tmp_path):
    return DemoRun(tmp_path, "smoke", m.presets["smoke"], m, 2, tmp_path / "cache")


@pytest.mark.parametrize(("student", "four"), PANELS)
def test_each_panels_arms_differ_only_in_loss_and_teacher(run, student, four):
    opd, grpo, both = (resolved(run, f"study_rw{four}_{arm}_{student}")
                       for arm in ("opd", "grpo", "both"))  # fmt: skip
    assert (grpo.loss.name, both.loss.reward_weight, opd.loss.reward_weight) == ("grpo", 1.0, 0.0)
    assert opd.loss.name == both.loss.name == ("forward_kl" if student == "bpe" else "aligned_kl")
    assert opd.reward.log and opd.train.lambda_ == 1.0
    teacher = run.out / "models" / ("teacher_four" if four else "teacher")
    assert opd.teacher.path == both.teacher.path == str(teacher) and grpo.teacher.path is None
    data = run.paths["data"] / ("four/prompts.jsonl" if four else "prompts.jsonl")
    for cfg in (opd, grpo, both):
        assert cfg.data.train == str(data) and cfg.generation == opd.generation
        assert cfg.generation.num_generations == 8 and cfg.generation.temperature == 0.7
        assert cfg.student.path == opd.student.path and cfg.reward == opd.reward.model_copy(
            update={"log": cfg.reward.log}
        )
        sched = ("schedule", "warmup_steps", "decay_fraction", "per_device_batch_size")
        assert all(getattr(cfg.train, k) == getattr(opd.train, k) for k in sched)
        assert cfg.train.lr in grid_of(m, runs[f"study_rw_opd_{student}"])  # chosen on dev
        assert cfg.eval.data == str(run.paths["data"] / ("four" if four else "") / "dev.jsonl")
    # equal compute: the reward arms get the distillation arm's student FLOPs
    keys = [f"study_rw{four}_{arm}_{student}" for arm in ("opd", "grpo", "both")]
    assert runs[keys[0]].steps and [runs[k].cost_of for k in keys[1:]] == [keys[0]] * 2


def test_comparisons_and_tuning_read_each_runs_own_slice(run):
    assert len(m.comparisons) == 12 and m.analysis is not None and m.analysis.seeds >= 3
    for a, b in m.comparisons:
        assert compared_on("reward", runs[a]) == compared_on("reward", runs[b])
    slices = {k: compared_on("reward", r) for k, r in runs.items()}
    assert sorted(set(slices.values())) == ["3 numbers", "4 numbers"]
    for key, column in slices.items():
        want = run.paths["data"] / ("four" if column == "4 numbers" else "") / "dev.jsonl"
        assert Path(dev_split(run, runs[key])) == want
    # tuned per config: each arm's config at each lr on its first (three-number) run; a
    # cost_of at its own lr's distillation arm
    assert m.analysis.tune_per_config
    grid = grid_manifest(shared)
    assert sorted(r.key for r in grid.runs) == sorted(
        f"study_rw_{arm}_{s}@lr{lr:g}" for arm in ("opd", "grpo", "both") for s in ("bpe", "char")
        for lr in m.analysis.lr_grid
    )  # fmt: skip
    both = next(r for r in grid.runs if r.key == "study_rw_both_char@lr0.002")
    assert both.cost_of == "study_rw_opd_char@lr0.002" and both.overrides["train.lr"] == 2e-3
    assert Path(dev_split(run, both)) == run.paths["data"] / "dev.jsonl"
    every = per_run()  # every run at each lr, each on its own slice's dev split
    grid = grid_manifest(every)
    assert len(grid.runs) == 12 * len(m.analysis.lr_grid)
    both = next(r for r in grid.runs if r.key == "study_rw4_both_char@lr0.002")
    assert both.cost_of == "study_rw4_opd_char@lr0.002" and both.overrides["train.lr"] == 2e-3
    assert Path(dev_split(run, both)) == run.paths["data"] / "four" / "dev.jsonl"


def per_run():
    """The manifest with every run tuned on its own (tune_per_config false)."""
    return replace(shared, analysis=replace(shared.analysis, tune_per_config=False))


def test_per_config_tuning_refuses_a_cost_of_that_is_not_tuned():
    from dataclasses import replace

    from distil.demo.tune import tuned_runs
    from distil.errors import ConfigError

    assert [r.key for r in tuned_runs(shared)] == [r.key for r in m.runs[:6]]
    # a four-number GRPO run listed first would read the (untuned) four-number distillation's
    # compute
    order = [runs["study_rw4_grpo_bpe"], *(r for r in m.runs if r.key != "study_rw4_grpo_bpe")]
    with pytest.raises(ConfigError, match="study_rw4_opd_bpe, which is not tuned"):
        tuned_runs(replace(shared, runs=order))


def test_each_curve_starts_from_its_start_on_its_own_dev_problems(run, monkeypatch, countdown_dir):
    """The curves' first points: each run's start evaluated as the run evaluates during training
    (its recorded eval section: the dev split of its slice), once per start and problems; the
    test split is never read (the table reads it, once per model)."""
    import shutil

    from distil.config import to_yaml
    from distil.demo import study_plot
    from distil.eval import runner

    dev3, dev4 = run.paths["data"] / "dev.jsonl", run.paths["data"] / "four" / "dev.jsonl"
    dev4.parent.mkdir(parents=True)
    shutil.copy(countdown_dir / "test.jsonl", dev3)
    shutil.copy(countdown_dir / "train.jsonl", dev4)  # (any Countdown rows: a second file)
    for key in runs:  # each run's config.yaml, as training records it
        (run.paths["runs"] / key).mkdir(parents=True)
        (run.paths["runs"] / key / "config.yaml").write_text(to_yaml(resolved(run, key)))
    calls = []

    def fake_evaluate(model_path, task, *, name, problems, progress):
        calls.append((Path(model_path).name, Path(task.cfg.data), len(problems)))
        result = type("R", (), {})()
        result.summary = {"accuracy": len(calls) / 10}
        return result

    monkeypatch.setattr(runner, "evaluate_model", fake_evaluate)
    starts = study_plot.start_points([run])
    n = {d: min(resolved(run, "study_rw_opd_bpe").eval.n, len(d.read_text().splitlines()))
         for d in (dev3, dev4)}  # fmt: skip
    assert sorted(calls) == sorted(
        (f"student_{s}_start", dev, n[dev]) for s in ("bpe", "char") for dev in (dev3, dev4)
    )  # one evaluation per start and dev split, never a test split
    for key, r in runs.items():
        dev = Path(resolved(run, key).eval.data)
        i = calls.index((f"student_{r.student}_start", dev, n[dev]))
        assert starts[(0, key)] == (i + 1) / 10  # the run's start on the run's own dev problems


def test_a_runs_curve_keeps_its_evaluations_a_thinned_reward_curve_and_its_signal(tmp_path):
    import json

    from distil.demo.study_report import CURVE_POINTS, curve

    n = 3 * CURVE_POINTS + 2  # windows, each with its reward; every 100th evaluated
    m = [{"step": i + 1, "cost/student_flops": float(i + 1), "reward/mean": i / n,
          "reward/share/correct": 0.25, "reward/skipped_flat": int(i % 2 == 0),
          **({"eval/accuracy": 0.5} if (i + 1) % 100 == 0 else {})} for i in range(n)]  # fmt: skip
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in m))
    c = curve(path)
    assert c["evals"] == [(float(k), 0.5) for k in range(100, n + 1, 100)]
    flops = [x for x, _ in c["rewards"]]
    assert len(flops) <= CURVE_POINTS + 1 and flops[0] == 1.0 and flops[-1] == float(n)
    assert flops == sorted(set(flops)) and all(y == (x - 1) / n for x, y in c["rewards"])
    assert (c["windows"], c["reward_windows"], c["skipped_flat"]) == (n, n, (n + 1) // 2)
    assert c["reward_means"]["reward/share/correct"] == 0.25
    assert c["reward_means"]["reward/mean"] == pytest.approx(sum(x["reward/mean"] for x in m) / n)
    assert curve(tmp_path / "none.jsonl")["evals"] == []  # a run not trained: no curve


def test_tuning_chooses_each_runs_best_lr_and_says_where_it_goes():
    from distil.demo.tune import choose, lr_key, tuning_table

    m = per_run()
    grid = m.analysis.lr_grid  # 5e-4, 1e-3, 2e-3
    accuracy = {lr_key(r, lr): 0.5 for r in m.runs for lr in grid}
    accuracy[lr_key(runs["study_rw_grpo_bpe"], 2e-3)] = 0.6  # a clear best
    accuracy[lr_key(runs["study_rw4_grpo_bpe"], 1e-3)] = 0.7  # the four-number run: its own
    chosen = choose(m, accuracy)
    assert chosen["study_rw_grpo_bpe"]["lr"] == 2e-3 and chosen["study_rw4_grpo_bpe"]["lr"] == 1e-3
    assert chosen["study_rw_opd_char"]["lr"] == 5e-4  # a tie: the smaller rate
    rows = {
        line.split(" | ")[0].strip("| "): line.split(" | ")
        for line in tuning_table(m, chosen, {r.key: 1e-3 for r in m.runs}).splitlines()[2:]
    }
    assert len(rows) == len(m.runs) == 12
    three, four = rows["study_rw_grpo_bpe"], rows["study_rw4_grpo_bpe"]
    assert three[2:] == [
        "50.0%",
        "50.0%",
        "**60.0%**",
        "0.002",
        "0.001",
        "study_rw_grpo_bpe.yaml |",
    ]
    # the four-number run shares study_rw_grpo_bpe.yaml, which holds one lr: its choice goes
    # into its own overrides in the manifest
    assert four[2:] == ["50.0%", "**70.0%**", "50.0%", "0.001", "0.001",
                        "the manifest: study_rw4_grpo_bpe's overrides |"]  # fmt: skip


def test_per_config_tuning_sets_each_configs_lr_for_both_slices():
    from distil.demo.tune import choose, lr_key, tuning_table

    accuracy = {lr_key(r, lr): 0.5 for r in m.runs[:6] for lr in m.analysis.lr_grid}
    accuracy[lr_key(runs["study_rw_grpo_bpe"], 2e-3)] = 0.6
    chosen = choose(shared, accuracy)
    assert sorted(chosen) == sorted(r.key for r in m.runs[:6])
    assert chosen["study_rw_grpo_bpe"]["lr"] == 2e-3 and chosen["study_rw_opd_bpe"]["lr"] == 5e-4
    rows = tuning_table(shared, chosen, {r.key: 1e-3 for r in m.runs}).splitlines()[2:]
    grpo = next(line for line in rows if line.startswith("| study_rw_grpo_bpe |"))
    assert grpo.endswith("| study_rw_grpo_bpe.yaml (also study_rw4_grpo_bpe) |")


def test_a_study_over_several_days_says_where_each_seed_ran_and_whether_teachers_agree():
    from distil.demo.study_report import provenance

    def seed(k, day, teacher="a"):
        return {"key": {"seed": k}, "date": day, "machine": "AMD EPYC", "teachers": {"t": teacher}}

    assert provenance([seed(0, "2026-12-02"), seed(1, "2026-12-02")]) == ""  # one day, one box
    two_days = provenance([seed(0, "2026-12-02"), seed(1, "2026-12-03")])
    assert "seed 1: 2026-12-03, AMD EPYC" in two_days and "the same teachers" in two_days
    assert "teachers differ" in provenance([seed(0, "2026-12-02"), seed(1, "2026-12-03", "b")])


def test_the_teachers_are_scored_once_for_every_seed(run, monkeypatch, countdown_dir):
    """Each seed's summary scores its own students; a teacher, shared by the seeds, is scored
    once for its weights (out/teacher_scores/) and its scores reused by the next seed."""
    import shutil

    from distil.demo import study_report
    from distil.eval import runner

    for path in study_report.splits("reward", run).values():
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(countdown_dir / "test.jsonl", path)
    calls = []

    def fake_evaluate(model_path, task, *, name, problems):
        calls.append(name)
        result = type("R", (), {})()
        result.summary = {"accuracy": 0.5, "model": str(model_path)}
        return result

    monkeypatch.setattr(runner, "evaluate_model", fake_evaluate)
    seed0, seed1 = run.for_seed(0), run.for_seed(1)
    for r in study_report.rows("reward", seed0)[:2]:  # the teachers' weights (told apart)
        r.model.mkdir(parents=True)
        (r.model / "model.safetensors").write_text(r.label)
        (r.model / "distil_demo_train.json").write_text("{}")
    first = study_report.evaluate("reward", seed0)
    n = len(calls)
    second = study_report.evaluate("reward", seed1)
    teachers = [
        r.label for r in study_report.rows("reward", seed0) if r.label.startswith("teacher")
    ]
    assert len(teachers) == 2 and all(calls.count(t) == 2 for t in teachers), calls  # 2 splits
    assert len(calls) == 2 * n - 2 * len(teachers)  # the second seed: its students only
    assert first[:2] == second[:2] and first[2] != second[2]  # a start is each seed's own


def test_a_teachers_hash_is_its_weights_not_its_training_times(tmp_path):
    from distil.demo.study_report import weights_hash

    a, b = tmp_path / "a", tmp_path / "b"
    for d, seconds in ((a, 1.0), (b, 2.0)):  # bit-identical weights, trained in other times
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"weights")
        (d / "config.json").write_text("{}")
        (d / "distil_demo_train.json").write_text(f'{{"time/train_clock": {seconds}}}')
    assert weights_hash(a) == weights_hash(b) is not None
    (b / "model.safetensors").write_bytes(b"other")
    assert weights_hash(a) != weights_hash(b)
    assert weights_hash(tmp_path / "none") is None


def test_a_seed_summary_is_reused_only_when_its_code_settings_and_rows_match(run):
    import json

    from distil.demo.study_report import SEED_SUMMARY, load_seed_summary, rows, seed_summary_key

    seed = run.for_seed(1)
    path = seed.seed_dir / SEED_SUMMARY
    assert load_seed_summary("reward", seed) is None  # none written
    path.parent.mkdir(parents=True)
    good = {"key": seed_summary_key("reward", seed),
            "rows": [{"label": r.label} for r in rows("reward", seed)]}  # fmt: skip
    path.write_text(json.dumps(good))
    assert load_seed_summary("reward", seed) == good
    assert load_seed_summary("reward", run.for_seed(2)) is None  # another seed's directory
    for change in ({"code": "other"}, {"seed": 0}, {"preset": "full"}):
        path.write_text(json.dumps({**good, "key": {**good["key"], **change}}))
        assert load_seed_summary("reward", seed) is None, change
    path.write_text(json.dumps({**good, "rows": good["rows"][:-1]}))  # another manifest's rows
    assert load_seed_summary("reward", seed) is None


def test_the_next_tuning_runs_the_char_configs_over_their_own_grid():
    """The study's manifest tunes only the char configs (the bpe ones were chosen at 7f71169),
    each arm over the char grid; a control's compute is its distillation's at each lr."""
    from distil.demo.tune import all_lrs, choose, lr_key, tuned_runs, tuning_table
    from distil.errors import ConfigError

    char = [f"study_rw_{arm}_char" for arm in ("opd", "grpo", "both")]
    assert [r.key for r in tuned_runs(m)] == char
    grid = grid_manifest(m)
    lrs = m.analysis.lr_grids["study_rw_opd_char"]
    assert all_lrs(m) == list(lrs) and min(lrs) < min(m.analysis.lr_grid)
    assert sorted(r.key for r in grid.runs) == sorted(f"{k}@lr{lr:g}" for k in char for lr in lrs)
    grpo = next(r for r in grid.runs if r.key == f"study_rw_grpo_char@lr{lrs[0]:g}")
    assert grpo.cost_of == f"study_rw_opd_char@lr{lrs[0]:g}"
    accuracy = {lr_key(runs[k], lr): 0.1 for k in char for lr in lrs}
    chosen = choose(m, accuracy)
    assert {c["lr"] for c in chosen.values()} == {lrs[0]}  # ties: the smaller
    head = tuning_table(m, chosen, {r.key: 1e-3 for r in m.runs}).splitlines()[0]
    assert head.count("| lr ") == len(lrs)
    # a control whose distillation is not tried at one of its rates cannot be matched
    mixed = replace(m, analysis=replace(m.analysis, lr_grids={**m.analysis.lr_grids,
                                                              "study_rw_opd_char": lrs[1:]}))  # fmt: skip
    with pytest.raises(ConfigError, match="lacks that lr"):
        grid_manifest(mixed)
    with pytest.raises(ConfigError, match="not configs of the manifest"):
        tuned_runs(replace(m, analysis=replace(m.analysis, tune_configs=("nope",))))
