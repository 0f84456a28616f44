"""Every data format docs/data.md names reads as the page says, and prompts reach each model as
the user meant: a conversation is split at its last assistant turn (never the answer inside
the prompt), plain text becomes one user turn of a chat template (data.text_prompts), and
data.chat_template_kwargs reach every template call.

The examples of docs/data.md are read from the page itself, so the page and the loader cannot
drift apart."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest
from hub_fakes import REAL

from distil.config import build_config
from distil.data.datasets import load_examples
from distil.errors import ConfigError, DataError
from distil.models.answers import answer_prefix, answer_strips
from distil.models.tokenizers import (
    EncodedPrompts,
    PromptFormat,
    completion_rows,
    encode_prompts,
    render_prompt,
    turn_end_id,
    unused_template_kwargs,
)
from distil.tasks.prompts import config_examples

DOC = Path(__file__).resolve().parents[2] / "docs" / "data.md"
SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "What is 2+3?"}
ANSWER = {"role": "assistant", "content": "5"}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def doc_examples() -> dict[str, list[dict]]:
    """docs/data.md's examples: each ```jsonl block after a '### NAME' heading, by NAME."""
    text = DOC.read_text()
    out = {}
    pattern = r"^### ([^\n]+)\n(?:(?!^#).)*?```jsonl\n(.*?)```"  # no heading in between
    for name, block in re.findall(pattern, text, re.M | re.S):
        out[name.strip()] = [json.loads(line) for line in block.strip().splitlines()]
    return out


# what each documented format reads as: (prompt, completion) of its first row
DOCUMENTED = {
    "Prompt only, text": ("What is 2+3?", None),
    "Prompt only, chat messages": ([SYSTEM, USER], None),
    "Prompt and completion, text": ("What is 2+3?", "5"),
    "Prompt and completion, chat messages": ([USER], "5"),
    "A conversation": ([SYSTEM, USER], "5"),
}


def test_the_page_documents_every_format_with_a_five_line_example():
    found = doc_examples()
    assert set(found) == set(DOCUMENTED)
    assert all(len(rows) == 5 for rows in found.values())


@pytest.mark.parametrize("name", list(DOCUMENTED))
def test_each_documented_format_reads_as_the_page_says(tmp_path, name):
    rows = doc_examples()[name]
    path = write_jsonl(tmp_path / "data.jsonl", rows)
    examples = load_examples(str(path))
    assert len(examples) == 5
    prompt, completion = DOCUMENTED[name]
    assert (examples[0].prompt, examples[0].completion) == (prompt, completion)
    for e in examples:  # the answer is never inside a prompt
        turns = e.prompt if isinstance(e.prompt, list) else []
        assert all(m["role"] != "assistant" for m in turns[-1:])


def test_a_conversation_is_cut_at_its_last_assistant_turn(tmp_path):
    """Multi-turn: every turn before the last assistant turn is the prompt, earlier answers
    included; that last turn is the completion."""
    convo = [SYSTEM, USER, ANSWER, {"role": "user", "content": "And 5+5?"}]
    last = {"role": "assistant", "content": "10"}
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": [*convo, last]}])
    (e,) = load_examples(str(path))  # data.prompt_field left at "prompt": 'messages' is read
    assert e.prompt == convo and e.completion == "10"
    (named,) = load_examples(str(path), prompt_field="messages")
    assert named.prompt == convo and named.completion == "10"


def test_a_conversation_ending_with_a_user_turn_is_a_prompt(tmp_path):
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": [SYSTEM, USER]}])
    (e,) = load_examples(str(path))
    assert e.prompt == [SYSTEM, USER] and e.completion is None


def test_an_answer_in_two_places_names_the_row(tmp_path):
    rows = [{"messages": [USER]}, {"messages": [USER, ANSWER], "completion": "5"}]
    path = write_jsonl(tmp_path / "both.jsonl", rows)
    with pytest.raises(DataError, match=r"both\.jsonl:2.*ambiguous"):
        load_examples(str(path))
    only = write_jsonl(tmp_path / "only.jsonl", [{"messages": [ANSWER]}])
    with pytest.raises(DataError, match=r"only\.jsonl:1.*no prompt before it"):
        load_examples(str(only))


def test_a_role_no_template_knows_is_refused_with_the_row(tmp_path):
    # ShareGPT's roles in OpenAI's keys: Qwen3's template would drop both turns without a word
    rows = [{"messages": [USER, ANSWER]}, {"messages": [{"role": "human", "content": "2+3?"},
                                                         {"role": "gpt", "content": "5"}]}]  # fmt: skip
    path = write_jsonl(tmp_path / "roles.jsonl", rows)
    with pytest.raises(DataError, match=r"roles\.jsonl:2.*message 0: role 'human'.*'user'"):
        load_examples(str(path))
    done = [{"prompt": "2+3?", "completion": [{"role": "bot", "content": "5"}]}]
    with pytest.raises(DataError, match=r"c\.jsonl:1.*column 'completion', message 0: role 'bot'"):
        load_examples(str(write_jsonl(tmp_path / "c.jsonl", done)))


@pytest.mark.parametrize(
    "row",
    [
        {"messages": [USER, {"role": "assistant", "content": ""}]},
        {"prompt": "What is 2+3?", "completion": "  \n"},
        {"prompt": "What is 2+3?", "completion": [{"role": "assistant", "content": ""}]},
    ],
)
def test_an_empty_answer_is_counted_in_a_warning_when_trained_on(
    tmp_path, make_train_config, bpe_tokenizer, row
):
    # trained on, an empty answer teaches the student to stop at once; a teacher's written
    # file can hold a few, so they are read and counted, the first named
    from distil.data.lengths import completion_warnings

    path = write_jsonl(tmp_path / "e.jsonl", [{"messages": [USER, ANSWER]}, row])
    examples = load_examples(str(path))
    assert not examples[1].completion.strip()
    sft = build_config(make_train_config(loss={"name": "sft"}, train={"lambda": 0.0}))
    (warning,) = completion_warnings(sft, examples, bpe_tokenizer)  # ChatML: nothing else
    assert warning.startswith(f"1 of 2 rows have an empty answer (the first: {path}:2)")
    on_policy = build_config(make_train_config(train={"lambda": 1.0}))
    assert completion_warnings(on_policy, examples, bpe_tokenizer) == []  # never read


def test_a_blank_prompt_and_a_tool_call_turn_are_refused_with_the_reason(tmp_path):
    blank = write_jsonl(tmp_path / "b.jsonl", [{"prompt": "   ", "completion": "5"}])
    with pytest.raises(DataError, match=r"b\.jsonl:1.*non-empty string"):
        load_examples(str(blank))
    call = {"role": "assistant", "content": None, "tool_calls": [{"name": "add"}]}
    tools = write_jsonl(tmp_path / "t.jsonl", [{"messages": [USER, call, ANSWER]}])
    with pytest.raises(DataError, match=r"t\.jsonl:1.*message 1 \(assistant\) has no text "
                                        r"'content' \(tool calls are not trained on"):  # fmt: skip
        load_examples(str(tools))


def test_a_missing_prompt_column_lists_the_rows_columns(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": "2+3?", "answer": "5"}])
    with pytest.raises(DataError, match=r"q\.jsonl:1.*'question', 'answer'.*data\.prompt_field"):
        load_examples(str(path))


@pytest.mark.parametrize("field", ["prompt", "messages"])
def test_a_conversation_trains_on_its_prompt_and_its_answer(tmp_path, make_train_config, field):
    """Off-policy slices of a `messages` dataset: the student's prompt ids are the rendered
    turns before the answer (generation prompt included), its completion ids the answer and
    the template's turn end. Before conversations were split, the answer sat in the prompt."""
    from distil.train.setup import build

    rows = [
        {"messages": [USER, {"role": "assistant", "content": f"answer {i}"}]} for i in range(16)
    ]
    path = write_jsonl(tmp_path / "convo.jsonl", rows)
    raw = make_train_config(
        data={"train": str(path), "template": None, "prompt_field": field},
        train={"lambda": 0.0, "max_steps": 1},
    )
    c = build(build_config(raw))
    tok = c.tokenizer
    samples = [s for b in c.buffer.next_window().micro_batches for s in b.samples]
    assert samples
    for s in samples:
        want_prompt = tok(render_prompt(tok, [USER]), add_special_tokens=False)["input_ids"]
        assert list(s.prompt_ids) == want_prompt
        i = int(tok.decode(s.completion_ids, skip_special_tokens=True).split()[-1])
        answer = tok(f"answer {i}", add_special_tokens=False)["input_ids"]
        assert list(s.completion_ids) == [*answer, turn_end_id(tok)]
        assert "answer" not in tok.decode(s.prompt_ids)


# ----------------------------------------------------------------------------- plain text


def test_plain_text_is_one_user_turn_where_a_chat_template_exists(bpe_tokenizer):
    as_chat = render_prompt(bpe_tokenizer, "What is 2+3?")
    assert as_chat == render_prompt(bpe_tokenizer, [USER])  # data.text_prompts=auto
    assert as_chat != "What is 2+3?"
    verbatim = PromptFormat("verbatim")
    assert render_prompt(bpe_tokenizer, "What is 2+3?", fmt=verbatim) == "What is 2+3?"
    assert render_prompt(bpe_tokenizer, [USER], fmt=verbatim) == as_chat  # chat stays chat


def test_plain_text_stays_verbatim_without_a_template_unless_chat_is_asked(bpe_tokenizer):
    import copy

    bare = copy.deepcopy(bpe_tokenizer)
    bare.chat_template = None
    assert render_prompt(bare, "What is 2+3?") == "What is 2+3?"
    with pytest.raises(ConfigError, match=r"no chat template.*data\.text_prompts=chat"):
        render_prompt(bare, "What is 2+3?", fmt=PromptFormat("chat"))


def test_the_setting_reaches_training_prompts(tmp_path, make_train_config, bpe_tokenizer):
    """train.setup tokenizes a text prompt as the setting says."""
    from distil.train.setup import tokenize_examples

    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "What is 2+3?"}])
    for mode, want in (("auto", render_prompt(bpe_tokenizer, [USER])), ("verbatim", None)):
        raw = make_train_config(data={"train": str(path), "template": None, "text_prompts": mode})
        cfg = build_config(raw)
        examples = config_examples(cfg.data)
        ids, _ = tokenize_examples(cfg, examples, bpe_tokenizer)
        text = want or "What is 2+3?"
        assert list(ids[0]) == bpe_tokenizer(text, add_special_tokens=False)["input_ids"]


# ----------------------------------------------------------------------------- template kwargs

PICKY = (
    "{% if shout is defined %}{{ raise_exception('shout is not supported') }}{% endif %}"
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
    "{% if m['role'] == 'user' and brief is defined and brief %} (briefly){% endif %}"
    "</{{ m['role'] }}>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture
def picky(bpe_tokenizer):
    import copy

    tok = copy.deepcopy(bpe_tokenizer)
    tok.chat_template = PICKY
    return tok


def test_template_kwargs_reach_the_template(picky):
    fmt = PromptFormat(kwargs={"brief": True})
    assert render_prompt(picky, [USER], fmt=fmt) == "<user>What is 2+3? (briefly)</user><assistant>"
    assert render_prompt(picky, "What is 2+3?", fmt=fmt).endswith("(briefly)</user><assistant>")
    ids = encode_prompts(picky, [[USER]], fmt=fmt)[0]
    assert picky.decode(ids) == "<user>What is 2+3? (briefly)</user><assistant>"
    assert unused_template_kwargs(picky, fmt) == []
    assert unused_template_kwargs(picky, PromptFormat(kwargs={"enable_thinking": False})) == [
        "enable_thinking"
    ]


def test_a_template_that_refuses_a_key_is_a_config_error(picky):
    with pytest.raises(ConfigError, match=r"refused data\.chat_template_kwargs \(shout=True\)"):
        render_prompt(
            picky, [USER], name="student tokenizer", fmt=PromptFormat(kwargs={"shout": True})
        )


def test_validate_stops_on_a_refused_key_and_notes_an_ignored_one(
    tmp_path, make_train_config, picky
):
    from distil.preflight import preflight

    picky.save_pretrained(tmp_path / "tok")
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "What is 2+3?"}] * 4)
    base = {"train": str(path), "template": None}
    student = {"tokenizer": str(tmp_path / "tok")}
    bad = make_train_config(data={**base, "chat_template_kwargs": {"shout": True}}, student=student)
    problems, _ = preflight(build_config(bad))
    assert any("refused data.chat_template_kwargs (shout=True)" in p for p in problems), problems
    ok = make_train_config(data={**base, "chat_template_kwargs": {"other": 1}}, student=student)
    problems, notes = preflight(build_config(ok))
    assert problems == []
    assert any(n.startswith("student: its chat template does not read") for n in notes), notes
    assert any("plain-text prompts are rendered as one user turn" in n for n in notes), notes


QWEN3 = REAL / "qwen3"


@pytest.mark.skipif(
    not (QWEN3 / "tokenizer.json").exists(), reason=f"real Qwen3 tokenizer not found at {QWEN3}"
)
def test_qwen3_thinking_is_switched_off_by_a_template_kwarg():
    tok = real_tokenizer("qwen3")
    off = render_prompt(tok, [USER], fmt=PromptFormat(kwargs={"enable_thinking": False}))
    on = render_prompt(tok, [USER])
    assert off == on + "<think>\n\n</think>\n\n"
    assert unused_template_kwargs(tok, PromptFormat(kwargs={"enable_thinking": False})) == []


def real_tokenizer(name: str):
    """A real family's tokenizer (../shared/tokenizers or DISTIL_REAL_TOKENIZERS), loaded once
    per process (Gemma 3's 262k vocabulary takes seconds); the test is skipped without it."""
    if not (REAL / name / "tokenizer.json").exists():
        pytest.skip(f"real {name} tokenizer not found at {REAL / name}")
    return _load_real(name)


@cache
def _load_real(name: str):
    from distil.models.load import load_tokenizer

    return load_tokenizer(str(REAL / name))


VERBATIM = PromptFormat("verbatim")


def test_verbatim_text_starts_as_the_tokenizers_own_encoding_starts(
    unigram_tokenizer, bpe_tokenizer
):
    # a tokenizer that puts <bos> before text (Gemma-like, with SentencePiece's '▁' on the
    # first word): a verbatim prompt's ids are exactly its own encoding with special tokens,
    # the <bos> never written twice; a chat template writes its own
    tok = unigram_tokenizer
    text = "Once upon a time"
    own = tok(text, add_special_tokens=True)["input_ids"]
    assert own[0] == tok.bos_token_id and len(own) > 1
    assert encode_prompts(tok, [text], fmt=VERBATIM) == [own]
    assert EncodedPrompts(tok, [text], fmt=VERBATIM)[0] == own
    # cut to its end, the <bos> kept in front (the model expects it first)
    assert encode_prompts(tok, [text], fmt=VERBATIM, max_tokens=2) == [[own[0], own[-1]]]
    assert EncodedPrompts(tok, [text], fmt=VERBATIM, max_tokens=2)[0] == [own[0], own[-1]]
    assert encode_prompts(tok, [tok.bos_token + text], fmt=VERBATIM)[0].count(tok.bos_token_id) == 1
    chat = encode_prompts(tok, [text], fmt=PromptFormat("chat"))[0]
    assert chat == tok(render_prompt(tok, text), add_special_tokens=False)["input_ids"]
    # one without (byte-level BPE, as Qwen's): the text alone
    assert (
        encode_prompts(bpe_tokenizer, [text], fmt=VERBATIM)[0] == bpe_tokenizer(text)["input_ids"]
    )


@pytest.mark.parametrize("name", ["gemma3", "llama3", "qwen3"])
def test_real_tokenizers_verbatim_prompts_are_their_own_encoding(name):
    tok = real_tokenizer(name)
    text = "Once upon a time"
    (ids,) = encode_prompts(tok, [text], fmt=VERBATIM)
    assert ids == tok(text, add_special_tokens=True)["input_ids"]
    if name == "gemma3":  # Gemma degrades without its <bos>
        assert ids[0] == tok.bos_token_id


ALTERNATING = (  # Gemma's rule: user and assistant turns alternate
    "{% for m in messages %}{% if loop.index0 > 0 and m['role'] == messages[loop.index0 - 1]"
    "['role'] %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}"
    "<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.mark.parametrize("kwargs", [{}, {"brief": True}])
def test_a_conversation_the_template_refuses_stops_at_setup_naming_its_row(
    tmp_path, bpe_tokenizer, kwargs
):
    import copy

    tok = copy.deepcopy(bpe_tokenizer)
    tok.chat_template = ALTERNATING
    user2 = {"role": "user", "content": "And 5+5?"}
    rows = [{"messages": [USER]}, {"messages": [SYSTEM, USER]}, {"messages": [USER, user2, ANSWER]}]
    examples = load_examples(str(write_jsonl(tmp_path / "turns.jsonl", rows * 3)))
    where = [e.meta["_where"] for e in examples]
    # before any step (each shape of conversation is rendered once at setup), naming the first
    # row of the refused shape; a template argument is not blamed for the conversation
    with pytest.raises(DataError, match=r"turns\.jsonl:3: the student tokenizer's chat template "
                                        r"refused a conversation \(roles: user, user\)"):  # fmt: skip
        EncodedPrompts(tok, [e.prompt for e in examples], name="student tokenizer",
                       fmt=PromptFormat(kwargs=kwargs), where=where)  # fmt: skip
    ok = EncodedPrompts(tok, [e.prompt for e in examples[:2]], fmt=PromptFormat(kwargs=kwargs))
    assert ok.encoded() == 2


def test_qwen3_thinking_writes_an_empty_block_before_answers_and_validate_warns(
    tmp_path, make_train_config, capsys
):
    from distil.data.lengths import completion_warnings
    from distil.preflight import preflight

    tok = real_tokenizer("qwen3")
    assert answer_prefix(tok) == "<think>\n\n</think>\n\n"
    off = PromptFormat(kwargs={"enable_thinking": False})
    assert answer_prefix(tok, off) == ""  # the block ends the prompt instead
    for name in ("llama3", "gemma3"):
        assert answer_prefix(real_tokenizer(name)) == ""
    path = write_jsonl(tmp_path / "sft.jsonl", [{"messages": [USER, ANSWER]}] * 4)
    data = {"train": str(path), "template": None}
    sft = {
        "loss": {"name": "sft"},
        "train": {"lambda": 0.0},
        "student": {"tokenizer": str(REAL / "qwen3")},
    }
    cfg = build_config(make_train_config(data=data, **sft))
    examples = load_examples(str(path))
    (warning,) = completion_warnings(cfg, examples, tok)
    assert warning.startswith("student: its chat template writes '<think>\\n\\n</think>\\n\\n'")
    assert "{enable_thinking: false}" in warning
    problems, notes = preflight(cfg)
    assert problems == [] and warning in notes, notes
    from types import SimpleNamespace

    from distil.train.notices import print_completion_warnings

    print_completion_warnings(cfg, examples, tok, SimpleNamespace(is_main_process=True))
    assert capsys.readouterr().err == f"distil: warning: {warning}\n"  # distil train's start
    # thinking off, or a run that never trains on the data's answers: nothing to say
    quiet = {**data, "chat_template_kwargs": {"enable_thinking": False}}
    assert (
        completion_warnings(build_config(make_train_config(data=quiet, **sft)), examples, tok) == []
    )
    # completions that begin with the block: what the template writes, nothing to say
    thinking = write_jsonl(
        tmp_path / "think.jsonl",
        [{"messages": [USER, {**ANSWER, "content": "<think>\n\n</think>\n\n5"}]}],
    )
    with_block = build_config(make_train_config(data={**data, "train": str(thinking)}, **sft))
    assert completion_warnings(with_block, load_examples(str(thinking)), tok) == []
    on_policy = build_config(
        make_train_config(data=data, student=sft["student"], train={"lambda": 1.0})
    )
    assert completion_warnings(on_policy, examples, tok) == []


TRIMMING = (  # Llama 3's and Gemma's way: every turn's content trimmed
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] | trim }}</{{ m['role'] }}>"
    "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_a_completion_loses_the_whitespace_its_template_trims_from_answers(bpe_tokenizer):
    import copy

    from distil.types import Example

    tok = copy.deepcopy(bpe_tokenizer)
    tok.chat_template = TRIMMING
    assert answer_strips(tok) == (" \n\t", " \n\t")
    text = "\n  5 \n"
    rows = [Example(0, [USER], text), Example(1, "What is 2+3?", text)]
    # after a chat prompt (messages, or text as one user turn): the answer as the template
    # renders it, trimmed, then the turn's end
    for ids in completion_rows(tok, rows, 64):
        assert ids[:-1] == tok("5", add_special_tokens=False)["input_ids"]
    # verbatim text is not a chat turn: its completion as it is
    (plain,) = completion_rows(tok, rows[1:], 64, VERBATIM)
    assert plain[:-1] == tok(text, add_special_tokens=False)["input_ids"]
    # a template that keeps whitespace (ChatML as the bpe fixture's): nothing stripped
    assert answer_strips(bpe_tokenizer) == ("", "")
    (kept,) = completion_rows(bpe_tokenizer, rows[:1], 64)
    assert kept[:-1] == bpe_tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize(("name", "strips"), [("llama3", (" \n\t", " \n\t")),
                                              ("gemma3", (" \n\t", " \n\t")),
                                              ("qwen3", ("\n", ""))])  # fmt: skip
def test_real_templates_strip_what_their_answers_lose(name, strips):
    from distil.types import Example

    tok = real_tokenizer(name)
    assert answer_strips(tok) == strips
    text = "\n5 "
    (ids,) = completion_rows(tok, [Example(0, [USER], text)], 64)
    want = text.lstrip(strips[0]).rstrip(strips[1])
    assert ids[:-1] == tok(want, add_special_tokens=False)["input_ids"]


def test_parquet_head_is_the_first_rows(tmp_path):
    """read_rows with a limit reads a parquet file's first rows only (across its row groups),
    the same rows as the whole file's head."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from distil.data.datasets import read_rows

    path = tmp_path / "rows.parquet"
    table = pa.table({"prompt": [f"q{i}" for i in range(20)], "target": list(range(20))})
    pq.write_table(table, path, row_group_size=3)
    whole = [row for _, row in read_rows(str(path))]
    assert len(whole) == 20
    for limit in (0, 1, 3, 4, 8, 20, 25):
        head = read_rows(str(path), limit=limit)
        assert [row for _, row in head] == whole[:limit]
        assert [w["line"] for w, _ in head] == list(range(1, min(limit, 20) + 1))
