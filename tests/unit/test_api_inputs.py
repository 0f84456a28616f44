"""The files of the objects a Distiller is given: written into output_dir/inputs only when it
trains, under the run lock (making one, validate and plan leave a run directory alone, also
one another process trains in); a resume from the same objects continues the run exactly,
and one given other train rows is refused."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM

import distil
from distil.errors import DataError
from distil.testing import load_tokenizer, read_metrics
from distil.train.rundir import RunLock, RunLockedError

LOSS_KEYS = ("loss", "kl", "grad_norm", "loss/on_policy", "loss/off_policy")


def _losses(run_dir):
    return [{k: m[k] for k in LOSS_KEYS if k in m} for m in read_metrics(run_dir)]


@pytest.fixture
def rows(countdown_dir):
    return [json.loads(x) for x in (countdown_dir / "train.jsonl").read_text().splitlines()]


def _objects(pair_dirs, rows):
    teacher, student = pair_dirs
    return {
        "student": AutoModelForCausalLM.from_pretrained(student),
        "student_tokenizer": load_tokenizer(student),
        "teacher": AutoModelForCausalLM.from_pretrained(teacher),
        "teacher_tokenizer": load_tokenizer(teacher),
        "train_data": rows,
    }


def _files(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_resume_from_the_same_objects_continues_the_run_exactly(
    tmp_path, make_train_config, pair_dirs, rows
):
    raw = make_train_config(train={"max_steps": 4, "save_every": 1})
    whole = {"train.output_dir": str(tmp_path / "whole")}
    distil.Distiller(raw, whole, **_objects(pair_dirs, rows)).train()
    objects = _objects(pair_dirs, rows)

    def stop_at_two(step, metrics):
        return step == 2

    distil.Distiller(raw, callbacks=[stop_at_two], **objects).train()
    run = tmp_path / "run"
    assert [m["step"] for m in read_metrics(run)] == [1, 2]
    record = json.loads((run / "inputs" / "inputs.json").read_text())
    assert set(record) == {"train.jsonl"} and len(record["train.jsonl"]) == 64
    distil.Distiller(raw, **objects).train()  # the same objects (the student trained in place)
    assert len(_losses(run)) == 4 and _losses(run) == _losses(tmp_path / "whole")

    other = rows[1:] + rows[:1]  # the same rows in another order: other data for the steps
    with pytest.raises(DataError, match="not those it trained on") as err:
        distil.Distiller(raw, {"train.max_steps": 6}, **{**objects, "train_data": other}).train()
    assert "train.output_dir" in str(err.value)
    assert record == json.loads((run / "inputs" / "inputs.json").read_text())
    assert [m["step"] for m in read_metrics(run)] == [1, 2, 3, 4]  # nothing trained
    fresh = {"train.max_steps": 1, "train.resume": "never"}
    distil.Distiller(raw, fresh, **{**objects, "train_data": other}).train()  # starts over
    lines = (run / "inputs" / "train.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == other


def test_making_validating_and_planning_leave_a_run_directory_alone(
    tmp_path, make_train_config, pair_dirs, rows
):
    raw = make_train_config(train={"max_steps": 1})
    distil.Distiller(raw, **_objects(pair_dirs, rows)).train()
    run = tmp_path / "run"
    before = _files(run)
    assert "inputs/train.jsonl" in before and "inputs/student/config.json" in before
    other = _objects(pair_dirs, rows[:5])
    with RunLock(run):  # another process trains there
        d = distil.Distiller(raw, {"train.max_steps": 2}, **other)
        assert d.config.data.train == str(run / "inputs" / "train.jsonl")  # where it will be
        d.validate()
        d.plan()
        with pytest.raises(RunLockedError):
            d.train()
        assert _files(run) == before  # nothing replaced, nothing added
    d = distil.Distiller(raw, {"train.resume": "never"}, **other)
    assert _files(run) == before
    d.train()
    written = (run / "inputs" / "train.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in written] == rows[:5]
