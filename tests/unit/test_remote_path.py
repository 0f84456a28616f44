"""teacher.url with teacher.path null: the served model's name comes from the server's
/v1/models when it serves one model, and the messages say what teacher.path means there."""

from __future__ import annotations

import pytest

from distil.config import build_config
from distil.preflight import command_problems
from distil.teacher.remote import _only_served, connect
from distil.teacher.remote_client import RemoteTeacherError, RetryPolicy

FAST = RetryPolicy(tries=2, first_wait_s=0.05, total_s=5.0, timeout_s=60.0)


# the session's served teacher (tests/conftest.py), started once for the modules that use it
pytestmark = pytest.mark.xdist_group("served_teacher")


@pytest.fixture
def server(served_teacher):
    return served_teacher


def test_a_null_path_takes_the_one_served_name(server, make_train_config, bpe_tokenizer, capsys):
    url, teacher = server
    # max_prompt_tokens: the longest sequence fits the served max_model_len (512)
    raw = make_train_config(
        teacher={"path": None, "url": url, "top_k": 5}, data={"max_prompt_tokens": 192}
    )
    raw["teacher"]["tokenizer"] = str(teacher)
    cfg = build_config(raw)
    assert command_problems(cfg, "train") == []
    remote = connect(cfg, bpe_tokenizer, vocab_limit=None, policy=FAST)
    assert remote.model == str(teacher)
    assert f"using {str(teacher)!r}, the model {url} serves" in capsys.readouterr().out


def test_several_served_models_need_a_name():
    with pytest.raises(
        RemoteTeacherError, match=r"serves 2 models \['a', 'b'\].*served model's name"
    ):
        _only_served(["a", "b"], "http://h:1/v1")


def test_a_url_without_any_tokenizer_says_what_path_means(make_train_config):
    raw = make_train_config(teacher={"path": None, "url": "http://127.0.0.1:9/v1", "top_k": 5})
    problems = command_problems(build_config(raw), "train")
    assert len(problems) == 1
    assert "teacher.tokenizer" in problems[0] and "the served model's name" in problems[0]
    assert "model directory or hub id" not in problems[0]
