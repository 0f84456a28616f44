"""A chat template whose turns end with a token other than EOS (Llama 3 closes an assistant turn
with <|eot_id|> while its EOS is <|end_of_text|>): generation stops on the turn end, dataset
completions after chat prompts end with it, and `config validate` / `inspect pair` name both."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from distil.align.vocab_map import role_map, vocab_bytes
from distil.config import load_config
from distil.models.tokenizers import (
    PromptFormat,
    completion_rows,
    generation_defaults,
    stop_token_ids,
    turn_end_id,
)
from distil.preflight import preflight
from distil.testing import build_model_dir, train_tokenizer
from distil.types import Example

LLAMA3_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{{- message['content'] | trim }}{{- '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
)
LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]


@pytest.fixture(scope="module")
def llama3_dir(tmp_path_factory):
    """A tiny Llama whose tokenizer is shaped like Llama 3's as shipped: EOS <|end_of_text|>,
    turns closed by <|eot_id|>, and a generation_config naming the EOS only."""
    tok = train_tokenizer("bpe")
    tok.add_special_tokens({"additional_special_tokens": LLAMA3_SPECIALS})
    tok.bos_token, tok.eos_token = "<|begin_of_text|>", "<|end_of_text|>"
    tok.chat_template = LLAMA3_TEMPLATE
    path = build_model_dir(tmp_path_factory.mktemp("llama3"), tokenizer=tok)
    eos = tok.convert_tokens_to_ids("<|end_of_text|>")
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return path


def ids(tok, *names):
    return [tok.convert_tokens_to_ids(n) for n in names]


def test_the_turn_end_is_found_and_stops_generation(llama3_dir):
    tok = AutoTokenizer.from_pretrained(llama3_dir)
    eos, eot = ids(tok, "<|end_of_text|>", "<|eot_id|>")
    assert tok.eos_token_id == eos and turn_end_id(tok) == eot
    model = AutoModelForCausalLM.from_pretrained(llama3_dir)
    assert model.generation_config.eos_token_id == eos  # the model alone never stops at eot
    assert stop_token_ids(tok, model) == [eos, eot]
    assert stop_token_ids(tok, generation_defaults(str(llama3_dir))) == [eos, eot]
    assert generation_defaults("meta-llama/Llama-3.2-1B") is None  # a hub id is never read


def test_a_completion_ends_as_its_prompt_asks(llama3_dir):
    tok = AutoTokenizer.from_pretrained(llama3_dir)
    eos, eot = ids(tok, "<|end_of_text|>", "<|eot_id|>")
    chat = Example(id=0, prompt=[{"role": "user", "content": "2+2?"}], completion="4")
    plain = Example(id=1, prompt="2+2?", completion="4")
    rows = completion_rows(tok, [chat, plain], max_tokens=16)
    # plain text to a tokenizer with a chat template is one user turn (data.text_prompts=auto)
    assert rows[0][-1] == eot and rows[1][-1] == eot
    verbatim = completion_rows(tok, [chat, plain], max_tokens=16, fmt=PromptFormat("verbatim"))
    assert verbatim[0][-1] == eot and verbatim[1][-1] == eos  # the text as it is: EOS
    # what the template itself writes after an assistant turn
    text = tok.apply_chat_template(
        [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
        tokenize=False,
    )
    assert tok(text, add_special_tokens=False)["input_ids"][-1] == eot


def test_a_template_whose_eos_ends_turns_changes_nothing(bpe_tokenizer):
    assert turn_end_id(bpe_tokenizer) == bpe_tokenizer.eos_token_id
    assert stop_token_ids(bpe_tokenizer) == [bpe_tokenizer.eos_token_id]


def test_the_turn_end_pairs_with_the_other_sides_eos(llama3_dir, bpe_tokenizer):
    tok = AutoTokenizer.from_pretrained(llama3_dir)
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    student = vocab_bytes(tok)
    assert student.turn_end == eot and student.specials[eot] == "eos"
    teacher = vocab_bytes(bpe_tokenizer)
    assert role_map(student, teacher)[bpe_tokenizer.eos_token_id] == eot


def test_validate_and_inspect_name_the_turn_end_and_the_stops(
    llama3_dir, make_train_config, tmp_path
):
    raw = make_train_config(student={"path": str(llama3_dir)})
    raw["teacher"]["path"] = str(llama3_dir)
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    _, notes = preflight(load_config(cfg_path))
    said = [n for n in notes if n.startswith("student:")]
    assert said and "a turn ends with <|eot_id|>" in said[0]
    assert "<|end_of_text|>" in said[0].split("stops at")[1]
    pair = [f"--student={llama3_dir}", f"--teacher={llama3_dir}"]
    out = subprocess.run(
        [sys.executable, "-m", "distil", "inspect", "pair", *pair],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.count("a turn ends with <|eot_id|>") == 2
    assert "Countdown" not in out and "<answer>" not in out
