"""Caches that cannot hide a regression: a finished stage is reused by `--resume` only when its
command, config text, the code and every input it reads are the same, and the teacher cache key
changes with the code and with the data the teacher learns from."""

from __future__ import annotations

import pytest

from distil.demo import records, teachers
from distil.demo.presets import manifest
from distil.demo.run import DemoRun, code_version, content_hash


@pytest.fixture
def stage(tmp_path):
    """A finished stage whose command reads a data file and a model directory."""
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "a"}\n')
    model = tmp_path / "start"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    config = tmp_path / "run.yaml"
    config.write_text("train: {lr: 1.0e-3}\n")
    out = tmp_path / "out"
    out.mkdir()
    command = f"distil train {config} data.train={data} student.path={model} train.lr=0.001"
    m = manifest()
    demo = DemoRun(tmp_path, "smoke", m.presets["smoke"], m, 1, tmp_path / "cache", resume=True)
    records.mark_finished(out, command, config)
    return demo, out, command, config, data, model


def test_a_stage_is_reused_when_nothing_it_reads_changed(stage):
    demo, out, command, config, *_ = stage
    assert records.finished(demo, out, command, config)
    assert not records.finished(demo, out, command + " train.seed=1", config)  # another command


def test_a_changed_input_runs_the_stage_again(stage):
    demo, out, command, config, data, _model = stage
    data.write_text('{"prompt": "b"}\n')
    assert not records.finished(demo, out, command, config)


def test_a_remade_start_model_runs_the_stage_again(stage):
    demo, out, command, config, _data, model = stage
    (model / "model.safetensors").write_bytes(b"other weights")
    assert not records.finished(demo, out, command, config)


def test_other_code_runs_the_stage_again(stage, monkeypatch):
    demo, out, command, config, *_ = stage
    monkeypatch.setattr(records, "code_version", lambda: "0" * 16)
    assert not records.finished(demo, out, command, config)


def test_the_config_text_is_part_of_the_record(stage):
    demo, out, command, config, *_ = stage
    config.write_text("train: {lr: 2.0e-3}\n")
    assert not records.finished(demo, out, command, config)


def test_content_hash_of_files_and_model_directories(tmp_path):
    assert content_hash(tmp_path / "missing") is None
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    before = content_hash(tmp_path / "m")
    (tmp_path / "m" / "notes.txt").write_text("not a model file")  # ignored
    assert content_hash(tmp_path / "m") == before
    (tmp_path / "m" / "model.safetensors").write_bytes(b"w")
    assert content_hash(tmp_path / "m") != before
    assert len(code_version()) == 16 and code_version() == code_version()


def test_the_teacher_cache_key_follows_the_code_and_the_data(tmp_path, monkeypatch):
    m = manifest()
    demo = DemoRun(tmp_path, "smoke", m.presets["smoke"], m, 1, tmp_path / "cache")
    for name, text in (("data/train.jsonl", "a\n"), ("data/dev.jsonl", "d\n"),
                       ("tokenizers/bpe/tokenizer.json", "{}")):  # fmt: skip
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    key = teachers.teacher_cache(demo)
    (tmp_path / "data" / "train.jsonl").write_text("b\n")
    assert teachers.teacher_cache(demo) != key
    again = teachers.teacher_cache(demo)
    monkeypatch.setattr(teachers, "code_version", lambda: "f" * 16)
    assert teachers.teacher_cache(demo) != again
