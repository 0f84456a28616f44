"""A model vocabulary padded past its tokenizer (Qwen3: 151,936 rows for 151,669 tokens): no
generator samples a padding row, and an id past the tokenizer that arrives from elsewhere is a
DataError naming its row."""

from __future__ import annotations

import pytest
import torch

from distil.config import build_config
from distil.testing import build_peaked_teacher, read_metrics, save_tokenizer, tiny_llama
from distil.train import loop

PADDING = 384  # rows past the tokenizer: a near-uniform tiny model samples one often


@pytest.fixture(scope="module")
def padded_student(tmp_path_factory, bpe_tokenizer):
    """A tiny Llama whose vocabulary has PADDING rows more than its tokenizer."""
    path = save_tokenizer(bpe_tokenizer, tmp_path_factory.mktemp("padded"))
    model = tiny_llama(len(bpe_tokenizer) + PADDING, tokenizer=bpe_tokenizer, seed=3)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def xtok_teacher(tmp_path_factory, unigram_tokenizer):
    return build_peaked_teacher(tmp_path_factory.mktemp("xteacher"), unigram_tokenizer)


def test_cross_tokenizer_on_policy_with_a_padded_student_vocabulary_trains(
    make_train_config, padded_student, xtok_teacher, bpe_tokenizer
):
    raw = make_train_config(
        student={"path": str(padded_student)},
        teacher={"path": str(xtok_teacher)},
        loss={"name": "aligned_kl"},
        train={"lambda": 1.0, "max_steps": 2},
        generation={"max_new_tokens": 16},
    )
    loop.train(build_config(raw))
    metrics = read_metrics(raw["train"]["output_dir"])
    assert len(metrics) == 2 and all(m["skipped"] == 0 for m in metrics)
    assert all(torch.isfinite(torch.tensor(m["loss"])) for m in metrics)


# ---- every sampler masks the rows past the tokenizer ------------------------------------


def boosted(vocab: int, seed: int = 0):
    """(padded, reference): a tiny Llama of 3 * vocab rows whose padding rows are +-5 x the
    real rows (so the largest logit is always a padding row's: unmasked, greedy picks one at
    every step), and a copy cut to the `vocab` real rows."""
    import copy

    padded = tiny_llama(3 * vocab, tie_word_embeddings=False, seed=seed)
    with torch.no_grad():
        w = padded.lm_head.weight
        w[vocab : 2 * vocab] = 5 * w[:vocab]
        w[2 * vocab :] = -5 * w[:vocab]
    ref = copy.deepcopy(padded)
    ref.resize_token_embeddings(vocab)
    assert ref.lm_head.weight.shape[0] == vocab
    return padded.eval(), ref.eval()


V = 64
PROMPTS = [[3, 9, 12, 40], [7], [22, 23, 24, 25, 26, 27]]


def same_rollouts(got, want) -> None:
    assert torch.equal(got.completion_ids_B_C, want.completion_ids_B_C)
    assert torch.allclose(got.logprobs_B_C, want.logprobs_B_C, atol=1e-5)


def drawn_from_the_cut_model(rollout, ref, prompts, top_k: int) -> None:
    """Every sampled id is a real one, and its recorded log-prob is that of the cut model's
    top-k distribution (a teacher-forced forward over prompt + completion)."""
    ids, mask = rollout.completion_ids_B_C, rollout.completion_mask_B_C
    assert (ids[mask] < V).all()
    for r, p in enumerate(rollout.prompt_index):
        c = ids[r][mask[r]].tolist()
        with torch.no_grad():
            logits = ref(input_ids=torch.tensor([prompts[p] + c])).logits[0].float()
        logits = logits[len(prompts[p]) - 1 : -1]
        kth = logits.topk(top_k, -1).values[:, -1:]
        lp = torch.log_softmax(logits.masked_fill(logits < kth, float("-inf")), -1)
        want = lp.gather(1, torch.tensor(c)[:, None])[:, 0]
        assert torch.allclose(rollout.logprobs_B_C[r][mask[r]], want, atol=1e-4)


def generators(kind: str, model, limit, stops=(5,)):
    from distil.generation.hf import HFGenerator
    from distil.generation.static import StaticCacheGenerator

    kw = {"pad_id": 0, "stop_ids": list(stops), "vocab_limit": limit}
    return {"hf": HFGenerator, "hf_static": StaticCacheGenerator}[kind](model, **kw)


@pytest.mark.parametrize("kind", ["hf", "hf_static"])
def test_hf_backends_sample_as_the_model_cut_to_its_tokenizer(kind):
    from distil.generation.base import SamplingParams

    padded, ref = boosted(V)
    greedy = SamplingParams(10, temperature=0.0)
    unmasked = generators(kind, padded, None).generate(PROMPTS, greedy)
    assert (unmasked.completion_ids_B_C[unmasked.completion_mask_B_C] >= V).all()  # control
    same_rollouts(
        generators(kind, padded, V).generate(PROMPTS, greedy),
        generators(kind, ref, None).generate(PROMPTS, greedy),
    )
    for seed in (4, None):  # a call's own generator, and the global RNG
        sampled = SamplingParams(10, temperature=1.0, top_k=20, n=3, seed=seed)
        out = generators(kind, padded, V).generate(PROMPTS * 4, sampled)
        drawn_from_the_cut_model(out, ref, PROMPTS * 4, top_k=20)


def test_the_mixture_writer_samples_as_its_teachers_cut_to_the_tokenizer():
    from distil.generation.base import SamplingParams
    from distil.generation.mixture import mixture_generator

    (a, a_ref), (b, b_ref) = boosted(V, seed=1), boosted(V, seed=2)
    greedy = SamplingParams(10, temperature=0.0)
    got = mixture_generator([a, b], [1.0, 2.0], pad_id=0, stop_ids=[5], vocab_limit=V)
    want = mixture_generator([a_ref, b_ref], [1.0, 2.0], pad_id=0, stop_ids=[5])
    same_rollouts(got.generate(PROMPTS, greedy), want.generate(PROMPTS, greedy))
    sampled = got.generate(PROMPTS * 4, SamplingParams(10, n=2, seed=3))
    assert (sampled.completion_ids_B_C < V).all()
    alone = mixture_generator([a, b], [1.0, 0.0], pad_id=0, stop_ids=[5], vocab_limit=V)
    out = alone.generate(PROMPTS, SamplingParams(10, temperature=0.0))  # an HFGenerator
    assert (out.completion_ids_B_C < V).all()


def test_the_vllm_engine_gets_a_minus_inf_bias_past_the_tokenizer(monkeypatch):
    from vllm_standin import FakeLLM, install, vllm_config

    from distil.generation import vllm as vgen
    from distil.generation.base import SamplingParams

    install(monkeypatch)
    FakeLLM.shuffle = False
    padded, ref = boosted(V)
    gen = vgen.VLLMGenerator.from_config(
        vllm_config(), padded, pad_id=0, stop_ids=[5], vocab_limit=V
    )
    assert gen.logit_bias == dict.fromkeys(range(V, 3 * V), float("-inf"))
    greedy = SamplingParams(10, temperature=0.0)
    out = gen.generate(PROMPTS, greedy)
    want = generators("hf", ref, None).generate(PROMPTS, greedy)
    width = want.completion_ids_B_C.shape[1]
    assert torch.equal(out.completion_ids_B_C[:, :width], want.completion_ids_B_C)
    plain = vgen.VLLMGenerator.from_config(vllm_config(), padded, pad_id=0, stop_ids=[5])
    assert plain.logit_bias == {}
    assert (plain.generate(PROMPTS, greedy).completion_ids_B_C >= V).any()  # control


# ---- ids past the tokenizer from elsewhere: a DataError naming the row ---------------------


@pytest.mark.parametrize("lam", [0.0, 1.0])  # the dataset's completion / a sample
def test_an_id_past_the_tokenizer_is_a_data_error_naming_the_row(lam):
    from buffer_fakes import FakeGenerator, make_buffer

    from distil.errors import DataError

    buffer, _ = make_buffer(lam=lam, generator=FakeGenerator(offset=0))
    for i, e in enumerate(buffer.examples):
        e.meta["_where"] = f"data/train.jsonl:{i + 1}"
    buffer.vocab_limit = 1000
    buffer.next_window()  # every id below 1000 (samples 10 + 100 + i, dataset 300 + i)
    buffer.vocab_limit = 112  # the next window holds an id past it (110 + i, 300 + i)
    with pytest.raises(DataError) as err:
        buffer.next_window()
    e = err.value
    assert e.path == "data/train.jsonl" and e.line is not None
    bad = int(e.message.split("token id ")[1].split(",")[0])
    assert bad >= 112 and f"data row {e.line - 1}:" in e.message
    assert ("dataset's completion" if lam == 0 else "student's sample") in e.message


def test_the_training_run_passes_each_tokenizers_id_rows_to_its_writers(
    make_train_config, padded_student, bpe_tokenizer, monkeypatch
):
    """Same tokenizer, seq-KD: the student's sampler and the teacher's writer stop at the
    tokenizer's id rows (its largest id + 1, which `len` undercounts when the ids have gaps: a
    `len` made smaller shows it is not read), and a padded teacher's writes train a student
    whose model has no padding."""
    from distil.models.tokenizers import id_rows
    from distil.train.setup import build

    raw = make_train_config(
        teacher={"path": str(padded_student)},  # the teacher is padded, the student not
        train={"lambda": 0.0, "seq_kd": True, "max_steps": 2},
    )
    rows = id_rows(bpe_tokenizer)
    with monkeypatch.context() as m:
        m.setattr(type(bpe_tokenizer), "__len__", lambda self: rows - 7)
        c = build(build_config(raw))
    assert c.buffer.student.generator.vocab_limit == rows == len(bpe_tokenizer)
    assert c.buffer.teacher.generator.vocab_limit == rows
    assert c.buffer.vocab_limit == rows
    loop.train(build_config(raw))
    assert [m["skipped"] for m in read_metrics(raw["train"]["output_dir"])] == [0, 0]


# ---- the reward term reads the sampler's log-probs: the same rows on both sides -----------


@pytest.mark.parametrize("loss", ["grpo", "forward_kl"])  # the reward alone, or added
def test_async_reward_ratio_is_one_at_zero_lag_with_a_padded_vocabulary(
    make_train_config, padded_student, tmp_path, monkeypatch, loss
):
    """The sampler draws from the tokenizer's rows only, so its log-probs are normalized over
    them; the learner's log S must be too, else log ρ = log(1 - mass on the padding rows) at
    no lag (about log(1/2) here) and the clip binds on every negative-advantage token."""
    (tmp_path / "rw_padded.py").write_text(
        "def score(row, completion):\n    return float(len(completion) % 3)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    raw = make_train_config(
        student={"path": str(padded_student)},
        teacher={"path": str(padded_student)},  # the same padded rows: no logits kept
        loss={"name": loss, "reward_weight": 0.0 if loss == "grpo" else 1.0},
        train={"lambda": 1.0, "max_steps": 1},
        generation={"async": True, "max_new_tokens": 8},
        reward={"function": "rw_padded:score"},
    )
    if loss == "grpo":
        raw["teacher"] = {}
    loop.train(build_config(raw))
    (m,) = read_metrics(raw["train"]["output_dir"])
    assert m["policy/staleness"] == 0.0 and m["reward/no_signal_groups"] < 1.0
    assert m["ratio_clipped"] == 0.0  # ρ = 1: the clip binds on no token
    part = m["loss"] if loss == "grpo" else m["reward_loss"]
    assert part == pytest.approx(-m["advantage"], abs=1e-6)
