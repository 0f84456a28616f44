"""Routed teachers, each with everything a teacher has: a micro-batch's loss, gradient and
per-teacher sums equal each teacher alone on its rows (live full next to live top-k; a cache
next to a server), with packing, and across tokenizers (shared and per teacher); the run logs
`loss/teacher/<name>` and `tokens/teacher/<name>`."""

from __future__ import annotations

import json

import pytest
import torch

from distil.config import build_config
from distil.data.collate import collate
from distil.preflight import preflight
from distil.teacher.several import Part, RoutedBatch, _rows
from distil.testing import build_model_dir, config_with, read_metrics
from distil.train import loop
from distil.train.setup import build
from distil.train.step import micro_step, teacher_metrics

K = 4


def routed(make_train_config, data, a: dict, b: dict, **sections) -> dict:
    raw = make_train_config(train={"max_steps": 2, "lambda": 0.0}, **sections)
    raw["data"]["train"] = str(data)
    raw["teacher"] = {}
    map_ = {"small": "a", "big": "b"}
    raw["teachers"] = {"models": {"a": a, "b": b}, "column": "source", "map": map_}
    return raw


def alone(raw: dict, teacher: dict) -> dict:
    """The same run with `teacher` as its only teacher."""
    out = json.loads(json.dumps(raw))
    out.pop("teachers")
    out["teacher"] = teacher
    return out


def mixed_batch(c):
    """The first micro-batch holding rows of both teachers."""
    batches = [b for _ in range(4) for b in c.buffer.next_window().micro_batches]
    return next(
        b for b in batches if len(set(c.teacher.route_of[s.example_id] for s in b.samples)) == 2
    )


def grads(c) -> list[torch.Tensor]:
    out = [p.grad.clone() for p in c.model.parameters() if p.grad is not None]
    c.model.zero_grad(set_to_none=True)
    return out


def loss_of(c, batch, targets=None, **kw):
    opts = {**c.loss_opts, "ce_weight": 0.0}
    n = float(batch.mask_B_T.sum())
    out = micro_step(
        c.model, c.unwrapped, batch, targets, c.loss_fn, num_tokens=n, loss_opts=opts,
        vocab_size=c.vocab_size, **kw,
    )  # fmt: skip
    out.loss.backward()
    return out


def per_row_reference(c, batch, singles: dict, sub_of) -> dict:
    """Each row alone with its teacher alone (`singles[name]`): summed loss and tokens per
    teacher, the total loss and the gradient, all under the micro-batch's token count."""
    n = float(batch.mask_B_T.sum())
    opts = {**c.loss_opts, "ce_weight": 0.0}
    sums, total = {}, 0.0
    for i, s in enumerate(batch.samples):
        name = c.teacher.names[c.teacher.route_of[s.example_id]]
        one = singles[name]
        sub = sub_of(one, batch, i)
        out = micro_step(
            c.model, c.unwrapped, sub, one.teacher.score(sub), c.loss_fn, num_tokens=n,
            loss_opts=opts, vocab_size=c.vocab_size,
        )  # fmt: skip
        out.loss.backward()
        total += out.loss.item()
        loss_sum, tokens = sums.get(name, (0.0, 0.0))
        sums[name] = (
            loss_sum + float(out.metrics["loss_sum"]),
            tokens + float(out.metrics["tokens_count"]),
        )
    return {"sums": sums, "loss": total, "grads": grads(c)}


def same_rows(one, batch, i):
    return _rows(batch, torch.tensor([i]), [i])


def check_against(c, batch, ref, got):
    torch.testing.assert_close(got.loss.item(), ref["loss"], rtol=1e-5, atol=1e-6)
    for g, r in zip(grads(c), ref["grads"], strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)
    for name, (loss_sum, tokens) in ref["sums"].items():
        assert float(got.metrics[f"teacher/{name}/tokens_count"]) == tokens > 0
        torch.testing.assert_close(
            float(got.metrics[f"teacher/{name}/loss_sum"]), loss_sum, rtol=1e-5, atol=1e-6
        )
    sums = {k: float(v) for k, v in got.metrics.items()}
    logged = teacher_metrics(sums)
    for name, (loss_sum, tokens) in ref["sums"].items():  # the hand computation of the log
        assert logged[f"tokens/teacher/{name}"] == tokens
        assert logged[f"loss/teacher/{name}"] == pytest.approx(loss_sum / tokens, rel=1e-5)


def test_a_full_and_a_top_k_teacher_in_one_micro_batch_equal_each_alone_row_by_row(
    make_train_config, pair_dirs, second_teacher, routed_data
):
    a, b = {"path": str(pair_dirs[0])}, {"path": str(second_teacher), "top_k": K}
    raw = routed(make_train_config, routed_data, a, b)
    c = build(build_config(raw))
    singles = {"a": build(config_with(alone(raw, a))), "b": build(config_with(alone(raw, b)))}
    batch = mixed_batch(c)
    parts = c.teacher.score_parts(batch)
    assert [p.name for p in parts] == ["a", "b"]
    assert parts[0].targets.logprobs_B_T_V is not None and parts[1].targets.is_sparse
    want = [c.teacher.names[c.teacher.route_of[s.example_id]] for s in batch.samples]
    assert c.teacher.last_routes == want
    ref = per_row_reference(c, batch, singles, same_rows)
    check_against(c, batch, ref, loss_of(c, batch, parts=parts))
    with pytest.raises(ValueError, match="differ in form"):
        c.teacher.score(batch)  # one (B, T, ...) tensor cannot hold both forms


def fake_server(model, k: int):
    """A stand-in for an OpenAI-compatible server (vLLM's `prompt_logprobs` answer shape):
    each prompt scored by `model`, its top k and the prompt's own token at each position."""

    class Client:
        url = "http://fake/v1"

        def request(self, method, path, body=None, *, hint=""):
            choices = []
            for i, row in enumerate(body["prompt"]):
                with torch.no_grad():
                    lp = torch.log_softmax(model(torch.tensor([row])).logits[0].float(), -1)
                entries = [None]
                for p in range(1, len(row)):
                    order = lp[p - 1].argsort(descending=True).tolist()
                    top = {str(t): {"logprob": float(lp[p - 1, t])} for t in order[:k]}
                    top.setdefault(str(row[p]), {"logprob": float(lp[p - 1, row[p]])})
                    entries.append(top)
                choices.append({"index": i, "prompt_logprobs": entries})
            return {"choices": choices}

    return Client()


@pytest.fixture
def served(monkeypatch, second_teacher):
    """teacher.url answered in-process by the second teacher (no server, no probe)."""
    from distil.models.load import load_model
    from distil.teacher import remote

    model = load_model(str(second_teacher), key="t", dtype="float32").eval()

    def connect(cfg, teacher_tok, *, vocab_limit=None):
        return remote.RemoteTeacher(
            fake_server(model, cfg.teacher.top_k), model="m", top_k=cfg.teacher.top_k,
            vocab_limit=vocab_limit,
        )  # fmt: skip

    monkeypatch.setattr(remote, "connect", connect)


def test_a_cached_and_a_remote_teacher_routed_equal_the_live_top_k_teachers(
    tmp_path, make_train_config, pair_dirs, second_teacher, routed_data, served
):
    from distil.teacher.writer import cache_teacher

    live_a, live_b = {"path": str(pair_dirs[0]), "top_k": K}, {"path": str(second_teacher)}
    live_b["top_k"] = K
    raw = routed(make_train_config, routed_data, live_a, live_b)
    cache = tmp_path / "cache_a"
    cache_teacher(config_with(alone(raw, live_a)), cache, values="fp32", shard_rows=32)
    a, b = {"cache": str(cache), "top_k": K}, {**live_b, "url": "http://fake/v1"}
    c = build(build_config(routed(make_train_config, routed_data, a, b)))
    singles = {
        "a": build(config_with(alone(raw, live_a))),
        "b": build(config_with(alone(raw, live_b))),
    }
    batch = mixed_batch(c)
    parts = c.teacher.score_parts(batch)
    assert [type(t).__name__ for t in c.teacher.teachers] == ["CachedTeacher", "RemoteTeacher"]
    for part in parts:  # each part's targets are its live top-k teacher's on those rows
        want = singles[part.name].teacher.score(part.batch)
        m = part.batch.mask_B_T
        torch.testing.assert_close(
            part.targets.topk_logprobs_B_T_K[m].sort(-1).values,
            want.topk_logprobs_B_T_K[m].sort(-1).values, rtol=1e-5, atol=1e-5,
        )  # fmt: skip
    ref = per_row_reference(c, batch, singles, same_rows)
    check_against(c, batch, ref, loss_of(c, batch, parts=parts))
    # one set of targets for the batch + each row's teacher (a cache that records them)
    merged = c.teacher.score(batch)
    check_against(c, batch, ref, loss_of(c, batch, merged, routes=c.teacher.last_routes))


def test_packed_runs_equal_padded_runs_and_log_each_teachers_loss(
    tmp_path, make_train_config, pair_dirs, second_teacher, routed_data
):
    a, b = {"path": str(pair_dirs[0])}, {"path": str(second_teacher), "top_k": K}
    raw = routed(make_train_config, routed_data, a, b)
    runs = {}
    for packing in (False, True):
        out = tmp_path / f"packing_{packing}"
        loop.train(config_with(raw, train={"packing": packing, "output_dir": str(out)}))
        runs[packing] = read_metrics(out)
    padded, packed = runs[False], runs[True]
    assert len(padded) == len(packed) == 2
    for p, q in zip(padded, packed, strict=True):
        for key in ("loss", "loss/teacher/a", "loss/teacher/b"):
            assert q[key] == pytest.approx(p[key], rel=1e-4), key
        n = p["tokens/teacher/a"] + p["tokens/teacher/b"]
        assert n == p["tokens/loss"] and p["tokens/teacher/a"] > 0 < p["tokens/teacher/b"]
        mean = (
            p["loss/teacher/a"] * p["tokens/teacher/a"]
            + p["loss/teacher/b"] * p["tokens/teacher/b"]
        ) / n
        assert mean == pytest.approx(p["loss"], rel=1e-5)  # the two are the loss, split


@pytest.fixture(scope="module")
def unigram_teachers(tmp_path_factory, unigram_tokenizer):
    root = tmp_path_factory.mktemp("xteachers")
    return [
        build_model_dir(root / f"u{seed}", tokenizer=unigram_tokenizer, arch="qwen2",
                        hidden_size=96, seed=seed)
        for seed in (3, 4)
    ]  # fmt: skip


def cross_rows(one, batch, i):
    """Row i collated alone by that teacher's own cross-tokenizer run."""
    return one.cross.collate([batch.samples[i]], one.tokenizer.pad_token_id)


@pytest.mark.parametrize("shared", [True, False], ids=["shared_tokenizer", "own_tokenizers"])
def test_cross_tokenizer_teachers_routed_equal_each_alone_row_by_row(
    make_train_config, pair_dirs, routed_data, unigram_teachers, shared
):
    a = {"path": str(unigram_teachers[0])}
    b = {"path": str(unigram_teachers[1] if shared else pair_dirs[0])}  # bpe: the student's own
    raw = routed(make_train_config, routed_data, a, b, loss={"name": "aligned_kl"})
    c = build(build_config(raw))
    singles = {"a": build(config_with(alone(raw, a))), "b": build(config_with(alone(raw, b)))}
    batch = mixed_batch(c)
    assert isinstance(batch, RoutedBatch) and set(batch.parts) == {"a", "b"}
    plain = collate(batch.samples, c.tokenizer.pad_token_id)  # a reward term's tokens: all
    assert torch.equal(batch.completion_mask_B_T, plain.mask_B_T)
    parts = c.teacher.score_parts(batch)
    assert all(isinstance(p, Part) and p.batch.alignment is not None for p in parts)
    ref = per_row_reference(c, batch, singles, cross_rows)
    check_against(c, batch, ref, loss_of(c, batch, parts=parts))


def test_validate_names_a_teacher_of_another_vocabulary_and_a_mixture_of_top_k(
    make_train_config, pair_dirs, routed_data, unigram_teachers
):
    a, b = {"path": str(pair_dirs[0])}, {"path": str(unigram_teachers[0])}
    raw = routed(make_train_config, routed_data, a, b)
    problems, _ = preflight(build_config(raw))
    assert any(p.startswith("teachers.models.b: loss.name = 'jsd' compares") for p in problems)
    assert not any("teachers.models.a" in p for p in problems)
    assert preflight(config_with(raw, loss={"name": "aligned_kl"}))[0] == []  # each its own
    mix = config_with(
        raw, loss={"name": "aligned_kl"}, teachers={"column": None, "weights": {"a": 1, "b": 1}}
    )
    assert any("mixes a, b with a cross-tokenizer loss" in p for p in preflight(mix)[0])
    from distil.errors import ConfigError

    with pytest.raises(ConfigError, match=r"teachers\.models\.a in a mixture .* with a cache"):
        config_with(
            raw,
            teachers={"column": None, "weights": {"a": 1}, "models": {"a": {"cache": "x"}, "b": b}},
        )


def test_a_cross_tokenizer_mixture_of_teachers_sharing_a_tokenizer_is_the_hand_mixture(
    make_train_config, routed_data, unigram_teachers
):
    a, b = ({"path": str(p)} for p in unigram_teachers)
    raw = routed(make_train_config, routed_data, a, b, loss={"name": "aligned_kl"})
    raw["teachers"] |= {"column": None, "map": {}, "weights": {"a": 3.0, "b": 1.0}}
    c = build(build_config(raw))
    batch = c.buffer.next_window().micro_batches[0]
    assert batch.alignment is not None  # aligned in the teachers' shared tokens
    got = c.teacher.score(batch).logprobs_B_T_V
    la, lb = (build(config_with(alone(raw, t))).teacher.score(batch).logprobs_B_T_V for t in (a, b))
    want = torch.logaddexp(la + torch.tensor(0.75).log(), lb + torch.tensor(0.25).log())
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got, la, atol=1e-3)  # control: the mixture is not teacher a
    assert torch.isfinite(loss_of(c, batch, c.teacher.score(batch)).loss)


def test_the_printed_line_shows_each_teachers_loss(capsys, monkeypatch):
    from distil.train.logging import ProgressLine

    monkeypatch.delenv("DISTIL_PROGRESS", raising=False)
    line = ProgressLine(10, 0, every=1, enabled=True)
    sums = {"teacher/a/loss_sum": 3.0, "teacher/a/tokens_count": 4.0}
    sums |= {"teacher/b/loss_sum": 0.0, "teacher/b/tokens_count": 0.0}
    metrics = {"loss": 0.75, **teacher_metrics(sums)}
    assert metrics["tokens/teacher/b"] == 0 and "loss/teacher/b" not in metrics  # no tokens
    line.update(1, metrics)
    err = capsys.readouterr().err
    assert "| loss[a] 0.75 |" in err and "loss[b]" not in err


def test_a_teacher_without_rows_runs_only_its_idle_forward(tiny_llama_model, monkeypatch):
    """A sharded teacher with no rows in a rank's micro-batch runs `idle` (one forward, so the
    ranks' all-gathers match: tests/integration/test_fsdp_teachers.py); a replicated one runs
    nothing at all."""
    from distil.data.collate import collate
    from distil.teacher import live
    from distil.teacher.several import RoutedTeacher
    from distil.types import Sample

    class Fake:
        temperature = 1.0

        def __init__(self):
            self.calls = []

        def score(self, batch):
            self.calls.append("score")
            return live.LiveTeacher(tiny_llama_model).score(batch)

        def idle(self):
            self.calls.append("idle")

    a, b = Fake(), Fake()
    routed = RoutedTeacher([a, b], ["a", "b"], route_of=[0, 0, 1])
    batch = collate([Sample(i, [5, 6], [7, 8, 9], "off_policy") for i in (0, 1)], 0)
    routed.score(batch)
    assert a.calls == ["score"] and b.calls == ["idle"]
    forwards = []
    whole = live.LiveTeacher(tiny_llama_model)  # (its one-time logits check runs a forward)
    monkeypatch.setattr(tiny_llama_model, "forward", lambda *x, **k: forwards.append(1))
    whole.idle()  # not sharded: no forward
    assert forwards == []


@pytest.mark.parametrize("mixed", [False, True], ids=["routed", "mixed"])
def test_cross_tokenizer_teachers_write_seq_kd_as_each_alone_writes(
    make_train_config, pair_dirs, routed_data, unigram_teachers, mixed
):
    """seq-KD across tokenizers with several teachers: routed, each row is written by its own
    teacher in its own tokens (one of another vocabulary, one of the student's), then turned
    into student tokens, exactly as that teacher alone writes it; mixed (two teachers of one
    other tokenizer), drawn from their mixture in the teachers' tokens."""
    from dataclasses import replace

    from distil.generation.mixture import mixture_generator
    from distil.generation.seeded import sampling_seed

    a = {"path": str(unigram_teachers[0])}
    b = {"path": str(unigram_teachers[1] if mixed else pair_dirs[0])}
    gen = {"num_generations": 1, "max_new_tokens": 10, "teacher_windows": 2}
    raw = routed(make_train_config, routed_data, a, b, loss={"name": "aligned_kl"},
                 generation=gen)  # fmt: skip
    raw["train"] |= {"seq_kd": True, "lambda": 0.0}
    if mixed:
        raw["teachers"] |= {"column": None, "map": {}, "weights": {"a": 1.0, "b": 2.0}}
    c = build(build_config(raw))
    block = [c.buffer.next_window() for _ in range(2)]  # the first block: one call a teacher
    samples = [s for w in block for b in w.micro_batches for s in b.samples]
    assert {s.source for s in samples} == {"seq_kd"} and all(s.completion_text for s in samples)
    params = replace(c.buffer.params, seed=sampling_seed(0, 0, "teacher-block", 0))
    singles = {n: build(config_with(alone(raw, t))).buffer for n, t in (("a", a), ("b", b))}
    if mixed:  # the mixture's generator over both, in the teachers' tokens
        ref = singles["a"].teacher
        models = [t.model for t in c.teacher.teachers]
        writer = mixture_generator(models, [1.0, 2.0], pad_id=ref.generator.pad_id,
                                   stop_ids=ref.generator.stop_ids)  # fmt: skip
        prompts = [ref.prompt_ids[s.example_id] for s in samples]
        written = writer.generate(prompts, params).completion_lists()
        want = [
            ref.to_student(w, prompt=s.prompt)[0] for w, s in zip(written, samples, strict=True)
        ]
        assert [s.completion_ids for s in samples] == want
        return
    route = {s.example_id: c.teacher.route_of[s.example_id] for s in samples}
    assert set(route.values()) == {0, 1}
    for t, name in enumerate("ab"):
        mine = [s for s in samples if route[s.example_id] == t]
        ref = singles[name].teacher  # that teacher alone, writing its rows in this order
        written = ref.generator.generate([ref.prompt_ids[s.example_id] for s in mine], params)
        want = [ref.to_student(w, prompt=s.prompt) if ref.to_student else (w, None)
                for w, s in zip(written.completion_lists(), mine, strict=True)]  # fmt: skip
        assert [s.completion_ids for s in mine] == [w[0] for w in want], name
    loop.train(build_config(raw))  # and it trains: each teacher scores what it wrote
    metrics = read_metrics(raw["train"]["output_dir"])
    assert all(m["policy/seq_kd_share"] == 1.0 for m in metrics)
    assert any("loss/teacher/a" in m and "loss/teacher/b" in m for m in metrics)
