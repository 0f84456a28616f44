"""A mixture of teachers writing seq-KD completions (generation/mixture.py): each token drawn
from M = sum_i w_i T_i. References: the log-prob recorded for every written token equals log M
computed by hand from each teacher's full forward over the finished row (also when a teacher's
own generation config asks for a repetition penalty); a teacher mixed with itself, or alone
with weight 1, writes exactly what that teacher writes alone (transformers' generate)."""

from __future__ import annotations

import math

import pytest
import torch

from distil.generation.base import SamplingParams
from distil.generation.hf import HFGenerator
from distil.generation.mixture import mixture_generator
from distil.models.load import load_model
from distil.models.tokenizers import stop_token_ids


@pytest.fixture(scope="module")
def teachers(pair_dirs, second_teacher):
    return [load_model(str(pair_dirs[0])).eval(), load_model(str(second_teacher)).eval()]


@pytest.fixture(scope="module")
def prompts(bpe_tokenizer):
    texts = ["Use 3 5 7 to make 22.", "Numbers: 12 4", "Target 100 from 25 4 1 3 and more words"]
    return [bpe_tokenizer(t)["input_ids"] for t in texts]  # three lengths: left padding


def write(gen, prompts, **kw):
    params = SamplingParams(max_new_tokens=12, **{"temperature": 1.0, "n": 2, "seed": 5, **kw})
    return gen.generate(prompts, params)


def log_mixture(models, weights, ids: list[int]) -> torch.Tensor:
    """log M at every position of one unpadded row, from each teacher's full forward."""
    total = sum(weights)
    rows = min(m.get_output_embeddings().weight.shape[0] for m in models)
    terms = []
    for m, w in zip(models, weights, strict=True):
        with torch.no_grad():
            logits = m(input_ids=torch.tensor([ids])).logits[0, :, :rows].float()
        terms.append(torch.log_softmax(logits, -1) + math.log(w / total))
    return torch.logsumexp(torch.stack(terms), 0)


def test_the_recorded_log_prob_of_each_written_token_is_the_mixtures(
    teachers, prompts, bpe_tokenizer
):
    pad, stops = bpe_tokenizer.pad_token_id, stop_token_ids(bpe_tokenizer, teachers[0])
    config = teachers[0].generation_config
    own, config.repetition_penalty = (
        config.repetition_penalty,
        3.0,
    )  # a model's own generation config does not touch M
    try:
        out = write(mixture_generator(teachers, [3.0, 1.0], pad_id=pad, stop_ids=stops), prompts)
    finally:
        config.repetition_penalty = own
    assert out.completion_mask_B_C.sum() > 20
    for r, i in enumerate(out.prompt_index):
        c = out.completion_mask_B_C[r].sum().item()
        row = list(prompts[i]) + out.completion_ids_B_C[r, :c].tolist()
        lm = log_mixture(teachers, [3.0, 1.0], row)
        p = len(prompts[i])
        want = lm[p - 1 : p - 1 + c].gather(1, torch.tensor(row[p:])[:, None])[:, 0]
        torch.testing.assert_close(out.logprobs_B_C[r, :c], want, rtol=0, atol=2e-4)
        alone = [log_mixture([m], [1.0], row)[p - 1 : p - 1 + c] for m in teachers]
        for lp in alone:  # neither teacher alone gives these log-probs
            assert not torch.allclose(
                lp.gather(1, torch.tensor(row[p:])[:, None])[:, 0], want, atol=1e-2
            )


@pytest.mark.parametrize("weights", [[1.0, 0.0], [0.3, 0.7]], ids=["alone", "with_itself"])
def test_one_teacher_mixed_alone_or_with_itself_writes_as_it_does_alone(
    teachers, prompts, bpe_tokenizer, weights
):
    a = teachers[0]
    models = [a, teachers[1]] if weights[1] == 0 else [a, a]
    pad, stops = bpe_tokenizer.pad_token_id, stop_token_ids(bpe_tokenizer, a)
    for kw in ({}, {"temperature": 0.7, "top_k": 20}, {"temperature": 0.0}):
        want = write(HFGenerator(a, pad_id=pad, stop_ids=stops), prompts, **kw)
        got = write(mixture_generator(models, weights, pad_id=pad, stop_ids=stops), prompts, **kw)
        assert torch.equal(got.completion_ids_B_C, want.completion_ids_B_C), kw
        torch.testing.assert_close(got.logprobs_B_C, want.logprobs_B_C, rtol=0, atol=1e-5)


def test_weights_are_checked():
    with pytest.raises(ValueError, match="one weight >= 0 per teacher"):
        mixture_generator([object()], [0.0], pad_id=0, stop_ids=[1])


def test_a_row_cap_writes_what_one_call_writes_and_holds_only_its_rows(
    teachers, prompts, bpe_tokenizer
):
    """max_batch=2 over 6 rows: three decodes of at most 2 rows each (every teacher's KV cache
    holds 2 rows), the same greedy completions and log-probs as one decode of all 6; sampled
    parts draw from seeds of their own (a prompt repeated in two parts is not written twice
    from the same noise)."""
    pad, stops = bpe_tokenizer.pad_token_id, stop_token_ids(bpe_tokenizer, teachers[0])
    rows_seen = []
    hooks = [
        m.register_forward_pre_hook(lambda _, a, kw: rows_seen.append(kw["input_ids"].shape[0]),
                                    with_kwargs=True)
        for m in teachers
    ]  # fmt: skip
    try:
        one = mixture_generator(teachers, [1.0, 2.0], pad_id=pad, stop_ids=stops, max_batch=None)
        capped = mixture_generator(teachers, [1.0, 2.0], pad_id=pad, stop_ids=stops, max_batch=2)
        want = write(one, prompts, temperature=0.0)
        assert max(rows_seen) == 6
        rows_seen.clear()
        got = write(capped, prompts, temperature=0.0)
        assert max(rows_seen) == 2
    finally:
        for h in hooks:
            h.remove()
    assert torch.equal(got.completion_ids_B_C, want.completion_ids_B_C)
    torch.testing.assert_close(got.logprobs_B_C, want.logprobs_B_C, rtol=0, atol=1e-5)
    same = [prompts[0]] * 4
    sampled = write(capped, same, n=1)
    ids = sampled.completion_ids_B_C
    assert not torch.equal(ids[0], ids[2]) and not torch.equal(ids[1], ids[3])
