"""The Python API against the command line: the same config gives bit-identical losses whether
it runs as `distil train`, as `distil.Distiller(path)`, or with the models, tokenizers and data
passed as objects; its errors are DistilError subclasses, never an exit."""

from __future__ import annotations

import json

import pytest
import yaml
from transformers import AutoModelForCausalLM

import distil
from distil.cli import main
from distil.errors import ConfigError, DataError, DistilError
from distil.testing import load_tokenizer, read_metrics

LOSS_KEYS = ("loss", "kl", "grad_norm", "loss/on_policy", "loss/off_policy")


def _losses(run_dir):
    return [{k: m[k] for k in LOSS_KEYS if k in m} for m in read_metrics(run_dir)]


@pytest.fixture
def config_file(tmp_path, make_train_config):
    raw = make_train_config(train={"max_steps": 3})
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_cli_and_api_give_bit_identical_losses(tmp_path, config_file, capsys):
    """Both against the training loop called on the loaded config (how `distil train` ran
    before the API existed): the CLI calls the API, so comparing those two alone would
    compare the API with itself."""
    from distil.config import load_config
    from distil.train.loop import train

    train(load_config(config_file, [f"train.output_dir={tmp_path / 'loop'}"]))
    assert main(["train", str(config_file), f"train.output_dir={tmp_path / 'cli'}"]) == 0
    result = distil.Distiller(config_file, {"train.output_dir": str(tmp_path / "api")}).train()
    reference = _losses(tmp_path / "loop")
    cli, api = _losses(tmp_path / "cli"), _losses(tmp_path / "api")
    assert len(reference) == 3 and cli == reference and api == reference  # exact, every step
    assert result.metrics["loss"] == cli[-1]["loss"]
    assert result.final_model == tmp_path / "api" / "final"
    assert (result.final_model / "model.safetensors").is_file()
    assert f"final model: {tmp_path / 'cli' / 'final'}" in capsys.readouterr().out


def test_objects_give_the_same_losses_as_paths(tmp_path, config_file, pair_dirs, countdown_dir):
    """Models and tokenizers loaded in Python, data as a list of dicts: the same run."""
    teacher_dir, student_dir = pair_dirs
    distil.Distiller(config_file, {"train.output_dir": str(tmp_path / "paths")}).train()
    rows = [json.loads(x) for x in (countdown_dir / "train.jsonl").read_text().splitlines()]
    student = AutoModelForCausalLM.from_pretrained(student_dir)
    d = distil.Distiller(
        config_file,
        ["train.output_dir=" + str(tmp_path / "objects")],
        student=student,
        student_tokenizer=load_tokenizer(student_dir),
        teacher=AutoModelForCausalLM.from_pretrained(teacher_dir),
        teacher_tokenizer=load_tokenizer(teacher_dir),
        train_data=rows,
    )
    inputs = tmp_path / "objects" / "inputs"
    assert d.config.student.path == str(inputs / "student") == d.config.student.tokenizer
    assert d.config.data.train == str(inputs / "train.jsonl")
    assert d.models["student"] is student  # trained in place, not copied
    before = {k: v.clone() for k, v in student.state_dict().items()}
    d.train()
    assert _losses(tmp_path / "objects") == _losses(tmp_path / "paths")
    assert any((before[k] != v).any() for k, v in student.state_dict().items())
    card = (tmp_path / "objects" / "final" / "README.md").read_text()
    assert f"| student | `{student_dir}` |" in card  # the name it was loaded from
    assert f"distil train distil_config.yaml student.path={student_dir} teacher.path=" in card


def test_callbacks_see_every_step_evaluation_and_checkpoint(tmp_path, make_train_config):
    seen = {"step": [], "eval": [], "checkpoint": []}

    class Recorder(distil.Callback):
        def on_step(self, step, metrics):
            seen["step"].append((step, metrics["loss"]))
            metrics["loss"] = -1.0  # a copy: the log keeps the real value

        def on_evaluate(self, step, metrics):
            seen["eval"].append((step, metrics["eval/accuracy"]))

        def on_checkpoint(self, step, path):
            seen["checkpoint"].append((step, path.name))

    raw = make_train_config(train={"max_steps": 4, "eval_every": 2, "save_every": 3})
    distil.Distiller(raw, callbacks=[Recorder()]).train()
    logged = read_metrics(tmp_path / "run")
    assert seen["step"] == [(m["step"], m["loss"]) for m in logged]
    assert seen["eval"] == [
        (m["step"], m["eval/accuracy"]) for m in logged if "eval/n" in m or "eval/accuracy" in m
    ]
    assert [s for s, _ in seen["eval"]] == [2, 4]
    assert seen["checkpoint"] == [(3, "step-00000003"), (4, "step-00000004")]


def test_a_callback_stops_the_run_like_a_finished_one(tmp_path, make_train_config):
    raw = make_train_config(train={"max_steps": 10})
    steps = []

    def stop_at_two(step, metrics):  # a plain function is an on_step callback
        steps.append(step)
        return step == 2

    result = distil.Distiller(raw, callbacks=[stop_at_two]).train()
    assert steps == [1, 2] and result.metrics["step"] == 2
    assert [m["step"] for m in read_metrics(tmp_path / "run")] == [1, 2]
    assert (result.final_model / "config.json").is_file()
    state = tmp_path / "run" / "checkpoints" / "step-00000002" / "trainer_state.json"
    assert json.loads(state.read_text())["step"] == 2


def test_a_stop_asked_after_a_checkpoint_saves_once(tmp_path, make_train_config):
    raw = make_train_config(train={"max_steps": 10, "save_every": 1})
    saved = []

    class StopAfterFirstSave(distil.Callback):
        def on_checkpoint(self, step, path):
            saved.append(step)
            return True

    result = distil.Distiller(raw, callbacks=[StopAfterFirstSave()]).train()
    assert saved == [1] and result.metrics["step"] == 1  # not written twice at step 1


def test_errors_are_distil_errors_with_every_problem(tmp_path, make_train_config, pair_dirs):
    raw = make_train_config()
    raw["train"]["lrr"] = 1
    with pytest.raises(ConfigError) as err:
        distil.Distiller(raw, {"loss.beta": 2, "train.bf16": True, "train.fp16": True})
    text = str(err.value)
    assert "3 problems" in text and "did you mean 'train.lr'" in text and "'loss.beta' = 2" in text
    with pytest.raises(ConfigError, match="without its tokenizer"):
        distil.Distiller(
            make_train_config(), student=AutoModelForCausalLM.from_pretrained(pair_dirs[1])
        )
    with pytest.raises(DataError, match="row 1 is a str"):
        distil.Distiller(make_train_config(), train_data=[{"prompt": "a"}, "b"])
    with pytest.raises(ConfigError, match="got a int"):
        distil.Distiller(3)
    d = distil.Distiller(make_train_config(data={"train": str(tmp_path / "missing.jsonl")}))
    with pytest.raises(ConfigError, match="valid but cannot train") as err:
        d.validate()
    assert "no such local file" in str(err.value)
    with pytest.raises(DistilError):  # train makes the same checks before loading anything
        d.train()


def test_validate_and_plan_match_the_commands(tmp_path, config_file, capsys):
    assert main(["config", "validate", str(config_file)]) == 0
    cli = capsys.readouterr().out
    v = distil.Distiller(config_file).validate()
    assert [f"note: {n}" for n in v.notes] == [
        x for x in cli.splitlines() if x.startswith("note: ")
    ]
    assert main(["plan", str(config_file), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    from distil.plan import as_dict

    assert as_dict(distil.Distiller(config_file).plan()) == planned
    assert as_dict(distil.plan(config_file)) == planned  # the package, callable
    assert main(["plan", str(config_file), "train.max_steps=7", "--json", "--gpus", "2"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert (
        as_dict(
            distil.plan(yaml.safe_load(config_file.read_text()), {"train.max_steps": 7}, gpus=2)
        )
        == planned
    )
    assert distil.plan.render is not None and distil.plan.make_plan is not None  # a package still


def test_evaluate_a_loaded_model_as_the_cli_evaluates_its_directory(
    tmp_path, pair_dirs, countdown_dir, capsys
):
    student = pair_dirs[1]
    keys = {"n": 4, "max_new_tokens": 8, "template": "countdown_plain"}
    rows = [json.loads(x) for x in (countdown_dir / "test.jsonl").read_text().splitlines()]
    model = AutoModelForCausalLM.from_pretrained(student)
    ours = distil.evaluate(model, "countdown", tokenizer=load_tokenizer(student), data=rows, **keys)
    flags = ["--n", "4", "--max-new-tokens", "8", "--template", "countdown_plain"]
    argv = ["eval", "--model", str(student), "--data", str(countdown_dir / "test.jsonl")]
    assert main([*argv, *flags, "--out", str(tmp_path / "r"), "--no-progress"]) == 0
    lines = (tmp_path / "r" / "verdicts-student.jsonl").read_text().splitlines()
    cli = [s["completion"] for r in map(json.loads, lines) for s in r["samples"]]
    ours_completions = [s["completion"] for r in ours.rows for s in r["samples"]]
    assert len(cli) == 4 and ours_completions == cli  # the same text, problem by problem
    with pytest.raises(ConfigError, match="without its tokenizer"):
        distil.evaluate(model, "countdown", data=rows, **keys)


def test_a_signal_and_a_callback_stop_in_the_same_step_keep_that_step(tmp_path, make_train_config):
    """The step both ask to stop after is saved and the run ends as a stopped one does (no
    TrainingInterrupted naming an older checkpoint)."""
    import os
    import signal

    raw = make_train_config(train={"max_steps": 10, "save_every": 1})

    def ctrl_c_and_stop_at_two(step, metrics):
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)  # recorded by the run, acted on after the step
        return step == 2

    result = distil.Distiller(raw, callbacks=[ctrl_c_and_stop_at_two]).train()
    assert result.metrics["step"] == 2
    state = tmp_path / "run" / "checkpoints" / "step-00000002" / "trainer_state.json"
    assert json.loads(state.read_text())["step"] == 2
    assert (result.final_model / "model.safetensors").is_file()


@pytest.fixture
def foreign_tokenizer(tmp_path, pair_dirs, wordpiece_tokenizer):
    """(a tokenizer directory other than the student's own, the student's weights saved with
    that tokenizer): what a model run with the given tokenizer must equal."""
    import shutil

    tok_dir = tmp_path / "wordpiece"
    wordpiece_tokenizer.save_pretrained(tok_dir)
    reference = tmp_path / "student_with_wordpiece"
    reference.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(pair_dirs[1] / name, reference / name)
    wordpiece_tokenizer.save_pretrained(reference)
    return tok_dir, reference


def test_evaluate_uses_the_tokenizer_given_as_a_path_or_object(
    foreign_tokenizer, pair_dirs, countdown_dir
):
    tok_dir, reference = foreign_tokenizer
    keys = {"n": 3, "max_new_tokens": 8, "template": "countdown_plain"}
    data = str(countdown_dir / "test.jsonl")

    def completions(model, **kw):
        result = distil.evaluate(model, "countdown", data=data, **keys, **kw)
        return [s["completion"] for r in result.rows for s in r["samples"]]

    expected = completions(str(reference))
    assert expected != completions(str(pair_dirs[1]))  # the tokenizer shows in the text
    loaded = AutoModelForCausalLM.from_pretrained(pair_dirs[1])
    assert completions(loaded, tokenizer=str(tok_dir)) == expected
    assert completions(str(pair_dirs[1]), tokenizer=str(tok_dir)) == expected
    assert completions(str(pair_dirs[1]), tokenizer=load_tokenizer(tok_dir)) == expected
    with pytest.raises(ConfigError, match="tokenizer"):
        completions(loaded, tokenizer=str(tok_dir / "missing"))


def test_generate_uses_the_tokenizer_given_as_a_path_or_object(
    tmp_path, foreign_tokenizer, pair_dirs, make_train_config
):
    tok_dir, reference = foreign_tokenizer
    raw = make_train_config(generation={"max_new_tokens": 6, "num_generations": 1})

    def written(name, **kw):
        out = tmp_path / f"{name}.jsonl"
        distil.generate(raw, out=out, n=1, **kw)
        return out.read_text()

    expected = written("reference", model=str(reference))
    assert expected != written("own", model=str(pair_dirs[1]))
    assert written("path", model=str(pair_dirs[1]), tokenizer=str(tok_dir)) == expected
    assert written("obj", model=str(pair_dirs[1]), tokenizer=load_tokenizer(tok_dir)) == expected
    loaded = AutoModelForCausalLM.from_pretrained(pair_dirs[1])
    assert written("loaded", model=loaded, tokenizer=str(tok_dir)) == expected
    loaded = AutoModelForCausalLM.from_pretrained(pair_dirs[1])
    assert written("both", model=loaded, tokenizer=load_tokenizer(tok_dir)) == expected


def _dropout_student(pair_dirs, tmp_path):
    """The student with attention dropout 0.5, saved (the path run) and loaded in train mode
    (the object run): from_pretrained returns eval mode, where dropout does nothing."""
    model = AutoModelForCausalLM.from_pretrained(pair_dirs[1], attention_dropout=0.5)
    saved = tmp_path / "dropout_student"
    model.save_pretrained(saved)
    load_tokenizer(pair_dirs[1]).save_pretrained(saved)
    return saved, model.train()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_loaded_model_trains_as_its_saved_directory(tmp_path, make_train_config, pair_dirs, attn):
    """Dropout off (eval mode, as from_pretrained gives) and student.attn_implementation
    applied: the same losses as the directory the model was saved to."""
    saved, model = _dropout_student(pair_dirs, tmp_path)
    raw = make_train_config(train={"max_steps": 2}, student={"attn_implementation": attn})
    raw["student"]["path"] = str(saved)
    distil.Distiller(raw, {"train.output_dir": str(tmp_path / "path")}).train()
    assert model.training and model.config._attn_implementation == "sdpa"
    distil.Distiller(
        raw,
        {"train.output_dir": str(tmp_path / "object")},
        student=model,
        student_tokenizer=load_tokenizer(saved),
    ).train()
    assert model.config._attn_implementation == attn
    assert _losses(tmp_path / "object") == _losses(tmp_path / "path")


def test_offload_of_a_loaded_teacher_is_refused(make_train_config, pair_dirs):
    teacher = AutoModelForCausalLM.from_pretrained(pair_dirs[0])
    with pytest.raises(ConfigError, match=r"teacher\.offload = true"):
        distil.Distiller(
            make_train_config(),
            {"teacher.offload": True},
            teacher=teacher,
            teacher_tokenizer=load_tokenizer(pair_dirs[0]),
        )
