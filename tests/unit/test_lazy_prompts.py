"""EncodedPrompts: the prompt ids training reads, encoded the first time each is read.

They must be exactly `encode_prompts`'s ids, fail at setup where the eager path failed, and a
short run must encode fewer prompts than the dataset holds while training exactly as before.
"""

from __future__ import annotations

import copy

import pytest

from distil.errors import ConfigError
from distil.models.tokenizers import EncodedPrompts, encode_prompts
from distil.testing import build_model_dir, config_with, read_metrics
from distil.train import loop
from distil.train import setup as train_setup

PLAIN = ["12 + 7 = ?", "Use 3, 5 and 8 to make 16.", "", "a much longer prompt " * 6]
CHAT = [[{"role": "user", "content": p}] for p in PLAIN[:2]] + [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 * 21"}]
]


@pytest.mark.parametrize("prompts", [PLAIN, CHAT], ids=["plain", "chat"])
@pytest.mark.parametrize("max_tokens", [None, 5])
def test_lazy_ids_are_the_eager_ones(bpe_tokenizer, prompts, max_tokens):
    want = encode_prompts(bpe_tokenizer, prompts, max_tokens=max_tokens)
    lazy = EncodedPrompts(bpe_tokenizer, prompts, max_tokens=max_tokens)
    # at setup: the first prompt of each shape (plain text; each sequence of roles)
    shapes = {"text" if isinstance(p, str) else tuple(m["role"] for m in p) for p in prompts}
    assert len(lazy) == len(want) and lazy.encoded() == len(shapes) == (
        1 if prompts is PLAIN else 2
    )
    assert lazy[-1] == want[-1] and lazy[1:3] == want[1:3] and lazy[::2] == want[::2]
    assert list(lazy) == want
    assert lazy.encoded() == len(want)
    with pytest.raises(IndexError):
        lazy[len(want)]
    if max_tokens is not None:  # the test can tell: some prompt was cut
        assert want != encode_prompts(bpe_tokenizer, prompts)


def test_chat_prompts_without_a_template_fail_at_setup(bpe_tokenizer):
    tok = copy.deepcopy(bpe_tokenizer)
    tok.chat_template = None
    with pytest.raises(ConfigError, match="no chat template"):
        encode_prompts(tok, [PLAIN[0], CHAT[0]])
    with pytest.raises(ConfigError, match="no chat template"):  # not at the first read of row 1
        EncodedPrompts(tok, [PLAIN[0], CHAT[0]])
    assert EncodedPrompts(tok, PLAIN)[:] == encode_prompts(tok, PLAIN)
    assert len(EncodedPrompts(tok, [])) == 0


@pytest.fixture(scope="module")
def data_200(tmp_path_factory):
    from distil.tasks.countdown import generate_dataset

    out = tmp_path_factory.mktemp("countdown200")
    generate_dataset(out, n=200, test_n=8, template="countdown_plain", seed=0)
    return out


@pytest.fixture(scope="module")
def char_student(tmp_path_factory, char_tokenizer):
    return build_model_dir(tmp_path_factory.mktemp("cs"), tokenizer=char_tokenizer, seed=2)


def _seq_kd_cross(make_train_config, data_200, char_student):
    """The demo's seq-KD control in small: a char student, a bpe teacher, 2 steps, 200 rows."""
    raw = make_train_config(
        data={"train": str(data_200 / "train.jsonl")},
        student={"path": str(char_student)},
        loss={"name": "sft"},
        train={"max_steps": 2, "lambda": 0.0, "seq_kd": True},
        eval={"n": 4, "data": str(data_200 / "test.jsonl")},
    )
    return raw


def test_a_short_run_encodes_only_what_it_reads_and_trains_as_the_eager_path(
    make_train_config, data_200, char_student, tmp_path, monkeypatch
):
    raw = _seq_kd_cross(make_train_config, data_200, char_student)
    made: list[EncodedPrompts] = []

    class Counted(EncodedPrompts):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(train_setup, "EncodedPrompts", Counted)
    loop.train(config_with(raw, train={"output_dir": str(tmp_path / "lazy")}))
    lazy = [m["loss"] for m in read_metrics(tmp_path / "lazy")]
    assert len(lazy) == 2
    assert {len(m) for m in made} == {200} and len(made) == 2  # student and teacher prompts
    assert all(0 < m.encoded() < 200 for m in made), [m.encoded() for m in made]

    def eager(tok, prompts, where=None, **kwargs):
        return encode_prompts(tok, prompts, **kwargs)

    monkeypatch.setattr(train_setup, "EncodedPrompts", eager)
    loop.train(config_with(raw, train={"output_dir": str(tmp_path / "eager")}))
    assert [m["loss"] for m in read_metrics(tmp_path / "eager")] == lazy


def test_routed_writers_prompts_are_lazy_and_the_eager_ones(
    tmp_path, countdown_dir, make_train_config, pair_dirs, bpe_tokenizer
):
    """Routed seq-KD writers: row i's prompt is its teacher's context prompt (teacher a) or the
    student's (teacher b), encoded only when read, the ids the eager path gave."""
    import json

    from distil.config import build_config
    from distil.data.context import context_prompt
    from distil.tasks.prompts import config_examples
    from distil.train.several import routed_writers

    rows = [json.loads(x) for x in (countdown_dir / "train.jsonl").read_text().splitlines()]
    data = tmp_path / "routed.jsonl"
    data.write_text(
        "".join(json.dumps({**r, "src": "ab"[i % 2]}) + "\n" for i, r in enumerate(rows))
    )
    hint = "{prompt} (a solution: {solution})"
    raw = make_train_config(train={"lambda": 0.0, "seq_kd": True}, loss={"name": "forward_kl"})
    raw["data"]["train"] = str(data)
    raw["teacher"] = {}
    raw["teachers"] = {
        "models": {
            "a": {"path": str(pair_dirs[0]), "context": hint},
            "b": {"path": str(pair_dirs[0])},
        },
        "column": "src",
    }
    cfg = build_config(raw)
    examples = config_examples(cfg.data)
    student = EncodedPrompts(bpe_tokenizer, [e.prompt for e in examples], max_tokens=8)
    out, _ = routed_writers(cfg, examples, student, bpe_tokenizer, [], None)
    assert len(out) == len(examples) and student.encoded() == 1  # nothing read yet
    got = out[5]
    assert got.teacher == 1 and got == student[5] and student.encoded() == 2
    want = [
        encode_prompts(bpe_tokenizer, [context_prompt(e, hint, None)])[0]
        if i % 2 == 0
        else encode_prompts(bpe_tokenizer, [e.prompt], max_tokens=8)[0]
        for i, e in enumerate(examples)
    ]
    assert [list(r) for r in out] == want and [r.teacher for r in out] == [
        i % 2 for i in range(len(out))
    ]
    assert want[0] != student[0]  # the test can tell the context prompt from the student's
    assert [list(r) for r in out[2:6]] == want[2:6]
