"""Cross-tokenizer training end to end on tiny models: the teacher's own template and tokens,
alignment in the data path, every cross-tokenizer loss lowers its value in a few steps."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from distil.config import build_config
from distil.data.crosstok import CrossTokenizer
from distil.models.tokenizers import PromptFormat, encode_prompts
from distil.testing import build_peaked_teacher
from distil.train import loop
from distil.types import Sample

XTOK = ["aligned_kl", "gold", "uld", "sampled_chunk_reverse_kl"]


@pytest.fixture(scope="module")
def xtok_teacher(tmp_path_factory, unigram_tokenizer):
    """A tiny teacher of another family: Qwen2 with the unigram tokenizer (Gemma-like turns).

    Its output head is scaled up so that its distributions are peaked like a trained model's:
    a near-uniform random teacher gives sorted-probability losses (uld, gold) almost nothing to
    learn from.
    """
    path = build_peaked_teacher(
        tmp_path_factory.mktemp("xteacher"), unigram_tokenizer, hidden_size=96
    )
    return path


@pytest.mark.parametrize("loss", XTOK)
def test_a_few_cross_tokenizer_steps_lower_the_loss(
    tmp_path, make_train_config, xtok_teacher, loss
):
    # off-policy on 8 fixed examples, so that the loss is measured on the same data each step
    raw = make_train_config(
        teacher={"path": str(xtok_teacher)},
        loss={"name": loss, "beta": 0.5},
        train={
            "lambda": 0.0,
            "max_steps": 20,
            "lr": 1e-2,
            "per_device_batch_size": 8,
            "grad_accum_steps": 1,
            "warmup_steps": 0,
            "schedule": "constant",
        },
        generation={"num_generations": 1},
    )
    data = tmp_path / "eight.jsonl"
    lines = Path(raw["data"]["train"]).read_text().splitlines()[:8]
    data.write_text("\n".join(lines) + "\n")
    raw["data"]["train"] = str(data)
    loop.train(build_config(raw))
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # the sampled loss's value is the chunk KL estimate (signed): its size must shrink
    key = "kl" if loss == "sampled_chunk_reverse_kl" else "loss"
    first, last = abs(metrics[0][key]), abs(sum(m[key] for m in metrics[-3:]) / 3)
    assert last < 0.8 * first, (loss, first, last)
    assert metrics[0]["groups"] > 0 and metrics[0]["skipped"] == 0
    assert metrics[0]["align/bytes"] == metrics[0]["align/bytes_exact"] > 0


def test_teacher_sees_its_own_template_and_only_the_completion_bytes_are_shared(
    bpe_tokenizer, unigram_tokenizer
):
    cross = CrossTokenizer(bpe_tokenizer, unigram_tokenizer)
    prompt = [{"role": "user", "content": "nums: 3 4 5 target: 12"}]
    s_prompt = encode_prompts(bpe_tokenizer, [prompt])[0]
    completion = bpe_tokenizer("<answer>3*4</answer>", add_special_tokens=False)["input_ids"]
    sample = Sample(
        0, list(s_prompt), [*completion, bpe_tokenizer.eos_token_id], "off_policy", prompt=prompt
    )
    batch = cross.collate([sample], bpe_tokenizer.pad_token_id)
    teacher_text = unigram_tokenizer.decode(batch.teacher_input_ids_B_L[0])
    assert "<start_of_turn>user" in teacher_text and "<|im_start|>" not in teacher_text
    assert teacher_text.endswith("<answer>3*4</answer><end_of_turn>")
    student_text = bpe_tokenizer.decode(batch.input_ids_B_L[0])
    assert "<|im_start|>user" in student_text
    a = batch.alignment
    assert a.metrics["bytes"] == a.metrics["bytes_exact"] == len("<answer>3*4</answer>")
    # every completion token (EOS included) is in a group and in the loss
    assert batch.mask_B_T.sum().item() == len(completion) + 1


def test_student_sample_cut_inside_a_character_masks_the_tail(bpe_tokenizer, char_tokenizer):
    """Generation stopped after the first byte of 'é': that token is unalignable, masked and
    counted, and the rest of the completion is aligned."""
    cross = CrossTokenizer(bpe_tokenizer, char_tokenizer)
    prompt = [{"role": "user", "content": "x"}]
    s_prompt = encode_prompts(bpe_tokenizer, [prompt])[0]
    ids = bpe_tokenizer("ab é", add_special_tokens=False)["input_ids"]
    pieces = [cross.student_vb.token_bytes[i] for i in ids]
    assert pieces[-2:] == [b"\xc3", b"\xa9"]  # 'é' is two byte-level tokens here
    cut = ids[:-1]  # ends with the lone lead byte 0xC3
    sample = Sample(0, list(s_prompt), cut, "on_policy", prompt=prompt)
    batch = cross.collate([sample], bpe_tokenizer.pad_token_id)
    a = batch.alignment
    assert a.metrics["unalignable_tokens"] == 1
    assert batch.mask_B_T.sum().item() == len(cut) - 1
    assert char_tokenizer.decode(batch.teacher_input_ids_B_L[0]).endswith("ab ")


@pytest.mark.slow
def test_alignment_in_worker_processes_gives_the_same_run(
    tmp_path, make_train_config, xtok_teacher
):
    """data.num_workers > 0 collates (aligns) micro-batches in spawned processes: same losses."""
    results = []
    for workers in (0, 2):
        raw = make_train_config(
            teacher={"path": str(xtok_teacher)},
            loss={"name": "aligned_kl"},
            data={"num_workers": workers},
            train={"max_steps": 2, "lambda": 0.0, "output_dir": str(tmp_path / f"w{workers}")},
        )
        loop.train(build_config(raw))
        lines = (tmp_path / f"w{workers}" / "metrics.jsonl").read_text().splitlines()
        results.append([(m["loss"], m["groups"]) for m in map(json.loads, lines)])
    assert results[0] == results[1]


def test_trailing_bytes_the_teacher_drops_are_masked_and_the_eos_still_pairs(
    bpe_tokenizer, wordpiece_tokenizer
):
    """A WordPiece teacher drops the completion's final '\\n': the student's '\\n' token is in no
    group (masked, counted), it is never grouped with the teacher's EOS, and the two EOS pair
    by role at the end of the text."""
    cross = CrossTokenizer(bpe_tokenizer, wordpiece_tokenizer)
    prompt = [{"role": "user", "content": "x"}]
    s_prompt = encode_prompts(bpe_tokenizer, [prompt])[0]
    body = bpe_tokenizer("ab cd\n", add_special_tokens=False)["input_ids"]
    assert cross.student_vb.token_bytes[body[-1]] == b"\n"
    ids = [*body, bpe_tokenizer.eos_token_id]
    sample = Sample(0, list(s_prompt), ids, "on_policy", prompt=prompt)
    t_prompt, t_ids, t_ends, _ = cross.teacher_inputs(sample)
    assert t_ids[-1] in cross.teacher_stops and t_ends[-1] == t_ends[-2]  # EOS spells no bytes
    batch = cross.collate([sample], bpe_tokenizer.pad_token_id)
    a = batch.alignment
    newline, eos = len(body) - 1, len(body)
    assert a.metrics["unalignable_tokens"] == 1
    start = len(s_prompt) - 1  # position predicting completion token 0
    assert not batch.mask_B_T[0, start + newline] and batch.mask_B_T[0, start + eos]
    assert batch.mask_B_T.sum().item() == len(ids) - 1
    # a task's reward trains the '\n' too: the completion mask before the alignment
    from distil.data.collate import collate

    plain = collate([sample], bpe_tokenizer.pad_token_id)
    assert torch.equal(batch.completion_mask_B_T, plain.mask_B_T) and plain.num_loss_tokens == len(
        ids
    )
    assert batch.num_completion_tokens == len(ids)
    # the student's EOS is predicted from the teacher's EOS position, alone
    s_pos, t_pos = a.student_pos_G_S[-1], a.teacher_pos_G_T[-1]  # last group: the EOS pair
    assert s_pos[s_pos >= 0].tolist() == [start + eos]
    assert t_pos[t_pos >= 0].tolist() == [len(t_prompt) - 1 + len(t_ids) - 1]


@pytest.mark.parametrize(
    "student, teacher",
    [("bpe", "unigram"), ("unigram", "wordpiece"), ("char", "bpe"), ("bpe", "char")],
)
def test_batched_teacher_inputs_equal_the_per_row_ones(student, teacher, request):
    """`teacher_inputs_batch` (one tokenizer call, the byte ends of all rows in one compiled
    pass) gives every row what `teacher_inputs` gives it alone: rows with and without EOS, a
    completion cut inside a character, an empty one, non-ASCII text, an id outside the
    tokenizer, a prompt whose last token merges with the completion's first, and a prompt cut
    to max_prompt_tokens."""
    s_tok = request.getfixturevalue(f"{student}_tokenizer")
    t_tok = request.getfixturevalue(f"{teacher}_tokenizer")
    cross = CrossTokenizer(s_tok, t_tok, max_prompt_tokens=12)
    eos = s_tok.eos_token_id
    texts = [
        " the answer is 42", "ab é", "", "  spaces\tand\nlines\n", " café 中文 🙂 x²",
        "<answer>3*4</answer>", "b", " 12 + 30 = 42",
    ]  # fmt: skip
    samples = []
    for k, text in enumerate(texts * 2):
        prompt = [{"role": "user", "content": f"question {k}: " + "xy" * (k % 3)}]
        ids = s_tok(text, add_special_tokens=False)["input_ids"]
        if k == 1:
            ids = ids[:-1]  # stopped inside a character
        if k == 4:
            ids = [*ids[:2], s_tok.vocab_size + 5, *ids[2:]]  # an id outside the tokenizer
        if k % 2 == 0:
            ids = [*ids, eos]
        s_prompt = encode_prompts(s_tok, [prompt])[0]
        samples.append(Sample(k, list(s_prompt), ids, "on_policy", prompt=prompt))
    # a raw-text prompt ending where the completion goes on: the seam can fall inside a token
    samples.append(Sample(99, [1, 2], s_tok("cat", add_special_tokens=False)["input_ids"],
                          "off_policy", prompt="the c"))  # fmt: skip
    alone = []
    per_row = cross.teacher_inputs
    cross.teacher_inputs = lambda s: alone.append(s.example_id) or per_row(s)
    got = cross.teacher_inputs_batch(samples)
    cross.teacher_inputs = per_row
    assert len(alone) < len(samples)  # the batch path served the rest
    for sample, row in zip(samples, got, strict=True):
        want = cross.teacher_inputs(sample)
        assert list(row[0]) == list(want[0]) and list(row[1]) == list(want[1])
        assert np.asarray(row[2]).tolist() == np.asarray(want[2]).tolist()
        assert row[3] == want[3]
    assert cross.teacher_inputs_batch([]) == []


def test_a_token_across_the_seam_sends_its_row_to_the_per_row_path(bpe_tokenizer):
    """The prompt's last characters and the completion's first merge into one teacher token:
    that row is tokenized apart (`teacher_inputs`), the others stay batched. (Verbatim prompts:
    a chat template's markers would close the prompt before the completion.)"""
    cross = CrossTokenizer(bpe_tokenizer, bpe_tokenizer, fmt=PromptFormat("verbatim"))
    cat = bpe_tokenizer(" cat", add_special_tokens=False)["input_ids"]
    word = bpe_tokenizer(" the", add_special_tokens=False)["input_ids"]
    assert len(word) == 1  # ' the' is one token: a seam after ' th' falls inside it
    rows = [Sample(0, [1], cat, "off_policy", prompt="say"),
            Sample(1, [1], bpe_tokenizer("e", add_special_tokens=False)["input_ids"],
                   "off_policy", prompt=" th")]  # fmt: skip
    seen = []
    per_row = cross.teacher_inputs
    cross.teacher_inputs = lambda s: seen.append(s.example_id) or per_row(s)
    got = cross.teacher_inputs_batch(rows)
    cross.teacher_inputs = per_row
    assert seen == [1]
    for sample, row in zip(rows, got, strict=True):
        want = cross.teacher_inputs(sample)
        assert list(row[1]) == list(want[1]) and np.asarray(row[2]).tolist() == list(want[2])


@pytest.mark.parametrize("student, teacher", [("bpe", "unigram"), ("char", "bpe")])
def test_rows_known_to_be_prefixes_align_as_when_compared(student, teacher, request):
    """The collator tells the aligner which rows' teacher text is a prefix of the student's
    completion bytes (`PaddedRows.t_prefix_B`), so that it skips comparing them; the flags are
    right (a completion cut inside a character: yes; one with a broken character inside, whose
    text has U+FFFD: no) and the alignment is the same as with every row compared."""
    s_tok = request.getfixturevalue(f"{student}_tokenizer")
    t_tok = request.getfixturevalue(f"{teacher}_tokenizer")
    cross = CrossTokenizer(s_tok, t_tok)
    samples = []
    for k, text in enumerate([" the answer is 42", " café 中文 🙂", "ab é", " 12 + 30"]):
        ids = s_tok(text, add_special_tokens=False)["input_ids"]
        if k == 2:
            ids = ids[:-1]  # stopped inside a character (bpe) or after it (char)
        prompt = [{"role": "user", "content": f"question {k}"}]
        s_prompt = encode_prompts(s_tok, [prompt])[0]
        samples.append(Sample(k, list(s_prompt), [*ids, s_tok.eos_token_id], "on_policy",
                              prompt=prompt))  # fmt: skip
    broken = b"\xa9 x"  # a continuation byte without its lead: invalid UTF-8
    if cross.student_vb.by_bytes.get(b"\xa9") is not None:
        ids = [
            cross.student_vb.by_bytes[b"\xa9"],
            *s_tok(" x", add_special_tokens=False)["input_ids"],
        ]
        samples.append(Sample(9, list(samples[0].prompt_ids), ids, "on_policy",
                              prompt=samples[0].prompt))  # fmt: skip
    rows, prefix = cross._teacher_rows(samples)
    for s, row, flag in zip(samples, rows, prefix.tolist(), strict=True):
        assert flag == cross.student_bytes(s.completion_ids).startswith(row[3])
    if len(samples) == 5:
        assert cross.student_bytes(samples[4].completion_ids) == broken and not prefix[4]
    assert prefix[:4].all()
    import distil.align.batch as align_batch

    plain, taken = align_batch._plain, []
    align_batch._plain = lambda *a: taken.append(plain(*a) is not None) or plain(*a)
    try:
        ascii_rows = [samples[0], samples[3]]  # (the char tokenizer has no 'é', '中', ...)
        cross.collate(ascii_rows, 0)  # builds the tables: the next calls are warm
        got = cross.collate(ascii_rows, 0)
        every_row = cross._teacher_rows
        cross._teacher_rows = lambda rows: (every_row(rows)[0], np.zeros(len(rows), np.bool_))
        want = cross.collate(ascii_rows, 0)
    finally:
        align_batch._plain = plain
    assert taken[-2:] == [True, True]  # both through the one-call path
    for name in ("group_row_G", "student_pos_G_S", "student_tok_G_S", "teacher_pos_G_T",
                 "teacher_tok_G_T", "match_table_G", "proj_row_N", "proj_student_pos_N",
                 "proj_teacher_pos_N", "proj_table_N"):  # fmt: skip
        assert torch.equal(getattr(got.alignment, name), getattr(want.alignment, name)), name
    assert torch.equal(got.mask_B_T, want.mask_B_T)


def test_a_cross_tokenizer_reward_trains_every_sampled_token(
    tmp_path, monkeypatch, make_train_config, xtok_teacher
):
    """aligned_kl + a task's reward (reward_weight 1): the distillation term covers the aligned
    tokens, the reward term every sampled token (unaligned ones too), each a mean over its own
    tokens in the window; the gradient equals the two terms computed apart on the whole window,
    and splitting the window into micro-batches changes nothing."""
    from distil.losses import get_loss
    from distil.train.buffer import Window
    from distil.train.setup import build
    from distil.train.step import score_micro_batch, student_forward

    (tmp_path / "rw_xtok.py").write_text(
        "def score(row, completion):\n    return float(len(completion) % 3)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    raw = make_train_config(
        teacher={"path": str(xtok_teacher)},
        loss={"name": "aligned_kl", "reward_weight": 1.0},
        train={"lambda": 1.0, "max_steps": 1},
        generation={"max_new_tokens": 16},
        reward={"function": "rw_xtok:score"},
    )
    cfg = build_config(raw)
    c = build(cfg)
    window = c.buffer.next_window()
    samples = [s for b in window.micro_batches for s in b.samples]
    whole = c.cross.collate(samples, c.tokenizer.pad_token_id)
    assert len(window.micro_batches) == 2 and whole.completion_mask_B_T is not None
    assert torch.equal(whole.mask_B_T & whole.completion_mask_B_T, whole.mask_B_T)
    n_aligned, n_all = whole.num_loss_tokens, whole.num_completion_tokens
    assert n_all > n_aligned > 0  # some sampled tokens are in no alignment group
    assert window.num_completion_tokens == n_all
    unaligned = whole.completion_mask_B_T & ~whole.mask_B_T
    adv = torch.tensor([s.advantage for s in samples])
    assert (adv[unaligned.nonzero()[:, 0]] != 0).any()  # and they carry a signal

    def grads(w: Window):
        sums = loop._accumulate(c, cfg, w)[0]
        out = {k: p.grad.clone() for k, p in c.model.named_parameters()}
        c.optimizer.zero_grad(set_to_none=True)
        return out, sums

    split, sums = grads(window)
    one, _ = grads(Window([whole], ["on_policy"], window.metrics))
    student = student_forward(c.model, c.unwrapped, whole, chunk_size=c.loss_opts["chunk_size"],
                              vocab_size=c.vocab_size)  # fmt: skip
    targets = score_micro_batch(c.teacher, whole)[0]
    opts = {**c.loss_opts, "labels_B_T": whole.labels_B_T}
    distill = get_loss("aligned_kl")(student, targets, whole.mask_B_T, num_tokens=n_aligned,
                                     alignment=whole.alignment, **opts)  # fmt: skip
    reward = get_loss("grpo")(student, None, whole.completion_mask_B_T, num_tokens=n_all,
                              advantages_B=adv, **opts)  # fmt: skip
    aligned_only = get_loss("grpo")(student, None, whole.mask_B_T, num_tokens=n_aligned,
                                    advantages_B=adv, **opts)  # fmt: skip

    def reference(loss):
        loss.backward(retain_graph=True)
        out = {k: p.grad.clone() for k, p in c.model.named_parameters()}
        c.optimizer.zero_grad(set_to_none=True)
        return out

    ref = reference(distill.loss + reward.loss)
    wrong = reference(distill.loss + aligned_only.loss)  # the reward on aligned tokens only
    assert any(v.abs().sum() > 0 for v in ref.values())
    for k in ref:
        torch.testing.assert_close(one[k], ref[k], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(split[k], ref[k], rtol=1e-4, atol=1e-6)
    assert any(not torch.allclose(split[k], wrong[k], rtol=1e-3, atol=1e-5) for k in ref)
    assert sums["reward_tokens_count"].item() == n_all
    assert sums["tokens_count"].item() == n_aligned
