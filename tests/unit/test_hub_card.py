"""The model card (its whole text for a known config and log) and the upload of a finished run
to a local stand-in of the Hub's HTTP API (hub_server.FakeHub): `train.push_to_hub` at the
end of `Distiller.train` and `distil push RUN_DIR --repo ID`, every file byte for byte."""

from __future__ import annotations

from pathlib import Path

import hub_server
import pytest

import distil
from distil.cli import main
from distil.config import build_config
from distil.hub import HubError, push_run
from distil.train.card import CONFIG_FILE, distil_version, model_card, run_card


@pytest.fixture
def hub_endpoint(monkeypatch):
    yield from hub_server.serve(monkeypatch)


CONFIG = {
    "student": {"path": "Qwen/Qwen3-0.6B"},
    "teacher": {"path": "Qwen/Qwen3-8B"},
    "data": {"train": "openai/gsm8k", "subset": "main"},
    "loss": {"name": "reverse_kl"},
    "train": {"output_dir": "runs/q", "max_steps": 2, "per_device_batch_size": 4, "lr": 1e-6},
    "generation": {"num_generations": 4},
    "eval": {"task": "gsm8k", "n": 50, "samples": 2},
}
ROWS = [
    {"step": 1, "loss": 0.5},
    {
        "step": 2,
        "loss": 0.25,
        "cost/student_flops": 1.5e15,
        "cost/teacher_flops": 2e16,
        "cost/student_train_tokens": 123456.0,
        "time/train_clock": 90.0,
        "eval/total": 100,
        "eval/accuracy": 0.42,
        "eval/correct": 42,
        "eval/group/x": 1.0,
        "eval/seconds": 3.0,
    },
]


def test_the_card_says_who_taught_whom_how_and_how_to_reproduce():
    version = distil_version()
    expected = f"""---
base_model: Qwen/Qwen3-0.6B
datasets:
- openai/gsm8k
library_name: transformers
pipeline_tag: text-generation
tags:
- distil
- distillation
---

# me/qwen3-distilled

A student distilled from a teacher's next-token distributions with distil {version}.

| | |
|---|---|
| student | `Qwen/Qwen3-0.6B` |
| teacher | `Qwen/Qwen3-8B` |
| loss | `reverse_kl` (beta 0.5, temperature 1.0) |
| lambda (share of on-policy slices) | 1.0 |
| data | `openai/gsm8k` (subset main, split train) |
| steps | 2 optimizer steps of 4 sequences x 1 micro-batches per process, lr 1e-06 (cosine) |
| compute | 1.5e+15 student FLOPs, 2e+16 teacher FLOPs, 123,456 tokens trained on, 1.5 minutes of training |
| final loss | 0.2500 (step 2) |

## Final evaluation

`gsm8k` on `the task's hub dataset` (50 problems, 2 samples each), step 2:

| metric | value |
|---|---|
| total | 100 |
| accuracy | 0.4200 |
| correct | 42 |

## Reproduce

```bash
distil train distil_config.yaml    # distil {version}
```

`distil_config.yaml` is the run's resolved config (every value, defaults included); the local paths in it are those of the machine it ran on.
"""
    assert model_card(build_config(CONFIG), ROWS, title="me/qwen3-distilled") == expected
    local = {**CONFIG, "student": {"path": "./models/s"}, "data": {"train": "d.jsonl"}}
    card = model_card(build_config(local), ROWS[:1])
    assert "base_model" not in card and "datasets" not in card  # local paths: no hub metadata
    assert "# q\n" in card and "No evaluation ran during training" in card


def test_the_card_of_a_run_from_loaded_models_says_which_path_to_set(tmp_path):
    """A model passed loaded leaves student.path at output_dir/inputs/student (config.json,
    no weights): the command sets the path to the name it was loaded from, and says so."""
    import json

    from distil.train.card import INPUT_FILE

    inputs = tmp_path / "inputs"
    for side, name in (("student", "Qwen/Qwen3-0.6B"), ("teacher", "")):
        (inputs / side).mkdir(parents=True)
        record = {"name_or_path": name, "class": "Qwen3ForCausalLM", "weights": "in memory"}
        (inputs / side / INPUT_FILE).write_text(json.dumps(record))
    cfg = {**CONFIG, "student": {"path": str(inputs / "student")}}
    cfg["teacher"] = {"path": str(inputs / "teacher")}
    card = model_card(build_config(cfg), ROWS[:1])
    version = distil_version()
    expected = f"""## Reproduce

```bash
distil train distil_config.yaml student.path=Qwen/Qwen3-0.6B    # distil {version}
```

`distil_config.yaml` is the run's resolved config (every value, defaults included); the local paths in it are those of the machine it ran on.

The student was passed to distil's Python API already loaded, so `student.path` in `distil_config.yaml` is `{inputs / "student"}`, which holds its config.json but not its weights: the command sets `student.path` to the name it was loaded from (`Qwen/Qwen3-0.6B`); if its weights were changed after loading, set it to a copy of the weights it started from instead.

The teacher was passed to distil's Python API already loaded, so `teacher.path` in `distil_config.yaml` is `{inputs / "teacher"}`, which holds its config.json but not its weights: set `teacher.path=` to a directory or hub id of the weights it started from.
"""
    assert card[card.index("## Reproduce") :] == expected
    assert "base_model: Qwen/Qwen3-0.6B" in card  # the name it was loaded from


def test_push_to_hub_uploads_the_final_model_and_its_card(
    tmp_path, make_train_config, hub_endpoint
):
    raw = make_train_config(
        train={"max_steps": 2, "eval_every": 2, "push_to_hub": True, "hub_model_id": "me/tiny"}
    )
    result = distil.Distiller(raw).train()
    hub = hub_endpoint
    assert result.hub_url == f"{hub.url}/me/tiny"
    (commit,) = hub.commits
    assert commit["repo"] == "me/tiny" and commit["token"] == "Bearer hf_test_token"
    final = tmp_path / "run" / "final"
    local = {p.name: p.read_bytes() for p in final.iterdir()}
    assert hub.repos["me/tiny"]["files"] == local  # every file, byte for byte
    assert {"model.safetensors", "config.json", "tokenizer.json", CONFIG_FILE} <= set(local)
    card = local["README.md"].decode()
    assert card == run_card(tmp_path / "run", title="me/tiny")
    assert "\n---\n\n# me/tiny\n" in card  # the repo id is the title
    assert "| eval/accuracy" not in card and "| accuracy | " in card
    assert hub.repos["me/tiny"]["private"] is False


def test_distil_push_a_run_directory(tmp_path, make_train_config, hub_endpoint, capsys):
    distil.Distiller(make_train_config(train={"max_steps": 1})).train()
    run = tmp_path / "run"
    assert main(["push", str(run), "--repo", "org/student", "--private"]) == 0
    assert f"pushed {run / 'final'} to {hub_endpoint.url}/org/student" in capsys.readouterr().out
    repo = hub_endpoint.repos["org/student"]
    assert repo["private"] is True
    assert "\n# org/student\n" in repo["files"]["README.md"].decode()
    assert repo["files"]["model.safetensors"] == (run / "final" / "model.safetensors").read_bytes()


def test_push_errors_are_one_paragraph(tmp_path, monkeypatch, capsys):
    assert main(["push", str(tmp_path), "--repo", "me/x"]) == 2
    assert "holds no final model" in capsys.readouterr().err
    final = tmp_path / "final"
    final.mkdir()
    (final / "config.json").write_text("{}")
    Path(final / CONFIG_FILE).write_text("train:\n  output_dir: x\n")
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # as the tests run: no network
    with pytest.raises(HubError, match="HF_HUB_OFFLINE=1 forbids uploads"):
        push_run(tmp_path, "me/x")


@pytest.fixture
def closed_port_hub(monkeypatch):
    """huggingface_hub pointed at a local port nobody listens on (online, with a token)."""
    import socket

    import huggingface_hub.constants as constants

    with socket.socket() as s:  # a free port, closed again: connecting to it is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    return port


def test_a_failed_push_keeps_the_trained_model_and_says_how_to_retry(
    tmp_path, make_train_config, monkeypatch
):
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # the upload fails after training
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    raw = make_train_config(train={"max_steps": 1, "push_to_hub": True, "hub_model_id": "me/tiny"})
    with pytest.raises(HubError, match="training finished and saved") as err:
        distil.Distiller(raw).train()
    assert f"distil push {tmp_path / 'run'} --repo me/tiny" in str(err.value)
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()


def test_an_unreachable_hub_is_a_hub_error(tmp_path, make_train_config, closed_port_hub, capsys):
    """A refused connection (httpx2's ConnectError: not an OSError) is a HubError: one
    paragraph from `distil push`, and after training the hint to push again."""
    raw = make_train_config(train={"max_steps": 1, "push_to_hub": True, "hub_model_id": "me/tiny"})
    with pytest.raises(HubError, match="training finished and saved") as err:
        distil.Distiller(raw).train()
    text = str(err.value)
    assert "ConnectError" in text and f"distil push {tmp_path / 'run'} --repo me/tiny" in text
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    with pytest.raises(HubError, match="cannot upload to 'me/tiny' \\(ConnectError"):
        push_run(tmp_path / "run", "me/tiny")
    assert main(["push", str(tmp_path / "run"), "--repo", "me/tiny"]) == 2
    shown = capsys.readouterr().err
    assert "cannot upload to 'me/tiny'" in shown and "Traceback" not in shown


def test_push_to_hub_without_a_token_fails_before_training(
    tmp_path, make_train_config, monkeypatch
):
    import huggingface_hub.constants as constants

    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))
    raw = make_train_config(train={"max_steps": 1, "push_to_hub": True, "hub_model_id": "me/tiny"})
    with pytest.raises(HubError, match="no Hugging Face token is set") as err:
        distil.Distiller(raw).train()
    assert "hf auth login" in str(err.value) and "'me/tiny'" in str(err.value)
    assert not (tmp_path / "run").exists()  # nothing trained
