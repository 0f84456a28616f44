"""Config loading: overrides, unknown keys with suggestions, collected errors, resolve, diff."""

from pathlib import Path

import pytest
import yaml
from hang_guard import finishes

from distil.config import (
    DistilConfig,
    diff,
    flatten,
    leaf_fields,
    load_config,
    save_resolved,
    to_dict,
)
from distil.errors import ConfigError

# distil presets (configs/accelerate/ holds accelerate launcher configs, tested in test_fsdp_launch)
CONFIGS = sorted(
    p
    for p in (Path(__file__).parents[2] / "configs").rglob("*.yaml")
    if "accelerate" not in p.parts
)


def write(tmp_path, data, name="cfg.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def problems_of(fn, *args):
    with pytest.raises(ConfigError) as info:
        fn(*args)
    return info.value.problems


def test_defaults_live_in_the_classes_and_resolve_fills_derived_values():
    cfg = load_config(None)
    assert cfg.train.lr == DistilConfig().train.lr
    # derived: generation_batch_size = per_device * accum / num_generations
    cfg = load_config(
        None,
        [
            "train.per_device_batch_size=4",
            "train.grad_accum_steps=3",
            "generation.num_generations=2",
        ],
    )
    assert cfg.generation.generation_batch_size == 6
    assert cfg.logging.run_name == "default"
    cfg = load_config(None, ["student.path=/models/s"])
    assert cfg.student.tokenizer == "/models/s"


def test_yaml_then_overrides_with_yaml_typed_values(tmp_path):
    path = write(tmp_path, {"train": {"lr": 0.001, "max_steps": 7}, "loss": {"name": "jsd"}})
    cfg = load_config(
        path,
        [
            "train.max_steps=9",
            "loss.beta=0.25",
            "train.lambda=0.5",
            "train.bf16=true",
            "logging.trackers=[tensorboard]",
        ],
    )
    assert cfg.train.lr == 0.001
    assert cfg.train.max_steps == 9
    assert cfg.loss.beta == 0.25
    assert cfg.train.lambda_ == 0.5
    assert cfg.train.bf16 is True
    assert cfg.logging.trackers == ["tensorboard"]
    # scientific notation that YAML 1.1 reads as a string is still a float
    assert load_config(None, ["train.lr=1e-4"]).train.lr == pytest.approx(1e-4)


def test_unknown_keys_suggest_the_nearest_valid_key():
    problems = problems_of(load_config, None, ["train.lrr=1", "trian.lr=1", "train.beta=0.1"])
    text = "\n".join(problems)
    assert "unknown key 'train.lrr' in section 'train': did you mean 'train.lr'?" in text
    assert "unknown key 'trian' in the top level: did you mean 'train'?" in text
    # a key of another section is pointed to where it lives
    assert "unknown key 'train.beta' in section 'train': did you mean 'loss.beta'?" in text
    assert len(problems) == 3


def test_unknown_key_far_from_everything_says_remove_it():
    (problem,) = problems_of(load_config, None, ["train.zzzzqqq=1"])
    assert problem == "unknown key 'train.zzzzqqq' in section 'train': remove it"


def test_all_problems_reported_together_with_value_and_fix():
    problems = problems_of(
        load_config,
        None,
        [
            "train.lr=abc",
            "eval.number_usage=some",
            "train.bf16=true",
            "train.fp16=true",
            "train.max_steps=0",
            "nope",
        ],
    )
    assert len(problems) == 5
    text = "\n".join(problems)
    assert "'train.lr' = 'abc'" in text and "Fix: set train.lr to a value like 1e-05" in text
    assert "'eval.number_usage' = 'some'" in text and "one of 'exact', 'subset'" in text
    assert "'train.max_steps' = 0" in text and "greater than 0" in text
    assert "train.bf16 and train.fp16 are both true" in text
    assert "override 'nope' is not key=value" in text


def test_window_invariant_shows_numbers_and_valid_settings():
    (problem,) = problems_of(
        load_config,
        None,
        [
            "train.per_device_batch_size=4",
            "train.grad_accum_steps=2",
            "generation.num_generations=4",
            "generation.generation_batch_size=3",
        ],
    )
    assert "3 * 4 != 4 * 2 = 8" in problem
    assert "divisor of 8 (1, 2, 4, 8)" in problem


def test_group_straddling_slices_rejected_when_lambda_mixes():
    (problem,) = problems_of(
        load_config,
        None,
        [
            "train.per_device_batch_size=3",
            "train.grad_accum_steps=2",
            "generation.num_generations=2",
            "train.lambda=0.5",
        ],
    )
    assert "multiple of generation.num_generations (2)" in problem
    # with lambda at 0 or 1 every slice has the same policy: allowed
    load_config(
        None,
        [
            "train.per_device_batch_size=3",
            "train.grad_accum_steps=2",
            "generation.num_generations=2",
            "train.lambda=1.0",
        ],
    )


def test_semantic_rule_on_a_key_with_a_type_error_is_not_reported_twice():
    problems = problems_of(load_config, None, ["generation.num_generations=x"])
    assert len(problems) == 1 and "'generation.num_generations' = 'x'" in problems[0]


def test_hybrid_weights_go_together():
    problems = problems_of(load_config, None, ["loss.matched_weight=0.5"])
    assert any("loss.matched_weight (0.5) and loss.unmatched_weight (None)" in p for p in problems)


def test_bad_yaml_files_are_config_errors(tmp_path):
    missing = tmp_path / "nope.yaml"
    assert "does not exist" in problems_of(load_config, missing)[0]
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    assert "not valid YAML" in problems_of(load_config, bad)[0]
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    assert "must hold a mapping" in problems_of(load_config, listy)[0]
    sec = write(tmp_path, {"train": 5}, "sec.yaml")
    assert any("'train' = 5" in p for p in problems_of(load_config, sec))


def test_resolved_config_round_trips_through_the_run_directory(tmp_path):
    cfg = load_config(None, ["train.output_dir=" + str(tmp_path / "run"), "loss.beta=0.1"])
    path = save_resolved(cfg, tmp_path / "run")
    text = path.read_text()
    # every value is written, defaults included
    for key in leaf_fields():
        section, name = key.split(".", 1)
        assert name.split(".")[0] in yaml.safe_load(text)[section], key
    again = load_config(tmp_path / "run")
    assert to_dict(again) == to_dict(cfg)


def test_diff_shows_only_differing_keys_and_skips_location():
    a = load_config(None, ["train.output_dir=runs/a"])
    b = load_config(None, ["train.output_dir=runs/b", "train.bf16=true"])
    assert diff(a, b) == [("train.bf16", False, True)]
    rows = diff(a, b, include_location=True)
    keys = [r[0] for r in rows]
    assert keys == ["train.output_dir", "train.bf16", "logging.run_name"]


def test_flatten_uses_aliases():
    flat = flatten(to_dict(load_config(None)))
    assert "train.lambda" in flat and "train.lambda_" not in flat


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_every_preset_loads(path):
    load_config(path)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "value", ["!!timestamp x", "!!bool maybe", "2001-13-45", "!!float x", "[", "{a: 1", "&x [*x]"]
)
def test_values_pyyaml_cannot_build_are_config_errors(tmp_path, value):
    path = tmp_path / "c.yaml"
    path.write_text(f"train:\n  lr: {value}\n")
    (file_problem,) = problems_of(load_config, path)
    assert str(path) in file_problem
    (override_problem,) = problems_of(load_config, None, [f"train.lr={value}"])
    assert override_problem.startswith(f"override 'train.lr={value}'")


def test_anchor_expansion_and_non_string_keys_are_bounded(tmp_path):
    laughs = "a: &a [1,1,1,1,1,1,1,1,1,1]\n" + "".join(
        f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n" for p, n in zip("abcdefg", "bcdefgh")
    )
    path = tmp_path / "c.yaml"
    path.write_text(laughs)
    assert "more than 100000 values" in problems_of(load_config, path)[0]
    path.write_text("train:\n  1: 2\n")
    assert "key 1 (int) is not a name" in problems_of(load_config, path)[0]


def test_warmup_over_max_steps_is_clamped_with_a_notice():
    from distil.config.rules import warmup_notice
    from distil.train.optim import lr_factor

    cfg = load_config(None, ["train.max_steps=20", "train.warmup_steps=200"])  # accepted
    note = warmup_notice(cfg)
    assert "train.warmup_steps (200) > train.max_steps (20)" in note and "over 2 steps" in note
    factors = [lr_factor(s, 0.0, cfg.train) for s in range(20)]
    assert factors[:2] == [0.5, 1.0] and factors[-1] < factors[2]  # warms up, then decays
    fits = load_config(None, ["train.max_steps=10", "train.warmup_steps=10"])  # equal is fine
    assert warmup_notice(fits) is None
    assert [lr_factor(s, 0.0, fits.train) for s in (0, 9)] == [0.1, 1.0]


def test_ignored_seq_kd_is_rejected():
    (seq,) = problems_of(load_config, None, ["train.seq_kd=true"])
    assert "train.seq_kd=true" in seq and "train.lambda = 1.0" in seq
    load_config(None, ["train.seq_kd=true", "train.lambda=0.5"])


def test_inf_and_nan_are_not_numbers_here():
    problems = problems_of(load_config, None, ["train.lr=.inf", "loss.beta=.nan"])
    assert any("'train.lr' = inf" in p for p in problems)
    assert any("'loss.beta' = nan" in p for p in problems)


def test_window_hint_for_a_huge_batch_returns_at_once():
    # a divisor search up to 10**11 would not return: the guard fails the test if it hangs
    (msg,) = finishes(
        problems_of,
        load_config,
        None,
        ["train.per_device_batch_size=100000000001", "generation.num_generations=2"],
    )
    assert "a divisor of 100000000001 " in msg
    (small,) = problems_of(
        load_config, None, ["train.per_device_batch_size=12", "generation.num_generations=5"]
    )
    assert "a divisor of 12 (1, 2, 3, 4, 6, 12)" in small


def test_looks_local_sends_only_hub_shaped_names_to_the_hub(tmp_path, monkeypatch):
    from distil.paths import looks_local

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    for local in ["./x", "/abs", "~/x", "a/b/c", "d.jsonl", "org/d.parquet", "data/countdwn"]:
        assert looks_local(local), local
    for hub in ["gsm8k", "openai/gsm8k", "Qwen/Qwen2.5-0.5B"]:
        assert not looks_local(hub), hub


def test_output_dir_and_path_problems(tmp_path):
    from distil.paths import output_dir_problem, path_problem

    (tmp_path / "f").write_text("x")
    assert "is a file" in output_dir_problem(tmp_path / "f", "k")
    assert "sits under" in output_dir_problem(tmp_path / "f" / "a" / "b", "k")
    assert output_dir_problem(tmp_path / "new" / "dir", "k") is None
    assert "NUL byte" in path_problem("a\x00b", "k")
    assert "File name too long" in path_problem("x" * 300, "k")
    assert path_problem(tmp_path / "missing", "k") is None


def test_training_problems_name_the_key_the_user_set(tmp_path):
    from distil.preflight import command_problems

    cfg = load_config(
        None,
        [
            f"student.path={tmp_path}/nope",
            f"teacher.path={tmp_path}",
            f"data.train={tmp_path}/d.jsonl",
        ],
    )
    text = "\n".join(command_problems(cfg, "train"))
    assert f"student.path = '{tmp_path}/nope': no such local directory" in text
    assert "student.tokenizer" not in text
    assert f"data.train = '{tmp_path}/d.jsonl': no such local file" in text


def test_a_union_field_of_the_wrong_type_is_one_problem():
    # found by fuzzing: the error location of a union field names the member (`.str`)
    (problem,) = problems_of(load_config, None, ["student.lora.target_modules=::"])
    assert problem.startswith("'student.lora.target_modules' = {':': None}")
    (problem,) = problems_of(load_config, None, ["logging.trackers=[1]"])
    assert problem.startswith("'logging.trackers' = 1")


# A resolved config (a DistilConfig, a run directory's config.yaml) loaded with overrides: each
# derived value follows the values the overrides change, as it does for a fresh config.
def _resolved(**sections) -> DistilConfig:
    from distil.config import build_config

    base = {
        "student": {"path": "org/student"},
        "teacher": {"path": "org/teacher"},
        "train": {"output_dir": "runs/a", "per_device_batch_size": 4, "grad_accum_steps": 1},
        "generation": {"num_generations": 2},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return build_config(base)


def _loaded_both_ways(cfg: DistilConfig, overrides: dict, tmp_path) -> list[DistilConfig]:
    """`as_config(cfg, overrides)` and `load_config(run_dir, overrides)` of its config.yaml."""
    from distil.config.loading import as_config, override_list

    save_resolved(cfg, tmp_path / "run")
    return [as_config(cfg, overrides), load_config(tmp_path / "run", override_list(overrides))]


def test_a_resolved_config_re_derives_generation_batch_size(tmp_path):
    cfg = _resolved()
    assert cfg.generation.generation_batch_size == 2
    for again in _loaded_both_ways(cfg, {"train.grad_accum_steps": 2}, tmp_path):
        assert again.generation.generation_batch_size == 4  # (4 * 2) / 2
    # the invariant ties it to its derivation in a valid config: a resolved one always follows
    with pytest.raises(ConfigError, match="2 \\* 2 != 4 \\* 3"):  # gbs set with the override
        load_config(
            tmp_path / "run", ["train.grad_accum_steps=3", "generation.generation_batch_size=2"]
        )


def test_a_resolved_config_re_derives_tokenizers(tmp_path):
    cfg = _resolved()
    for again in _loaded_both_ways(
        cfg, {"student.path": "foo/bar", "teacher.path": "t/2"}, tmp_path
    ):
        assert (again.student.tokenizer, again.teacher.tokenizer) == ("foo/bar", "t/2")
    own = _resolved(student={"tokenizer": "org/tok"})
    for again in _loaded_both_ways(own, {"student.path": "foo/bar"}, tmp_path):
        assert again.student.tokenizer == "org/tok"  # a tokenizer of its own is kept


def test_a_resolved_config_re_derives_each_teachers_tokenizer(tmp_path):
    def several(a: str, b: str) -> DistilConfig:
        models = {"a": {"path": a}, "b": {"path": b, "tokenizer": "org/tb"}}
        return _resolved(teacher={"path": None}, teachers={"models": models, "weights": {"a": 1}})

    cfg = several("org/a", "org/b")
    assert cfg.teachers.models["a"].tokenizer == "org/a"
    moved = {"teachers.models.a.path": "x/a", "teachers.models.b.path": "x/b"}
    for again in _loaded_both_ways(cfg, moved, tmp_path):
        assert again.teachers.models["a"].tokenizer == "x/a"
        assert again.teachers.models["b"].tokenizer == "org/tb"  # its own: kept
        assert to_dict(again) == to_dict(several("x/a", "x/b"))


def test_a_resolved_config_re_derives_run_name(tmp_path):
    cfg = _resolved()
    assert cfg.logging.run_name == "a"
    for again in _loaded_both_ways(cfg, {"train.output_dir": "runs/b"}, tmp_path):
        assert again.logging.run_name == "b"
        assert to_dict(again) == to_dict(_resolved(train={"output_dir": "runs/b"}))
    named = _resolved(logging={"run_name": "mine"})
    for again in _loaded_both_ways(named, {"train.output_dir": "runs/b"}, tmp_path):
        assert again.logging.run_name == "mine"
