"""Rules over generation and teacher backends (a remote teacher, vLLM's engine lengths, the
teacher writing ahead): each takes a config and returns (keys involved, message) or None, like
the rules in `distil.config.rules`, which runs the ones listed in CHECKS."""

from __future__ import annotations

from distil.config.rules_reward import TEACHERLESS
from distil.config.schema import DistilConfig


def _remote_teacher(cfg: DistilConfig):
    """teacher.url: what a server can give (top-k log-probs at temperature 1, no generation)."""
    t = cfg.teacher
    if not t.url:
        return None
    found = []
    if not t.url.startswith(("http://", "https://")):
        found.append(
            (
                ("teacher.url",),
                f"teacher.url = {t.url!r} is not an http(s) address. "
                "Fix: the server's address ending in /v1, e.g. http://127.0.0.1:8000/v1",
            )
        )
    if t.top_k is None:
        found.append(
            (
                ("teacher.top_k",),
                "teacher.url needs teacher.top_k (a server returns "
                "the top-k prompt log-probs, not the full distribution). Fix: set "
                "teacher.top_k to at most the server's --max-logprobs (vLLM's default: 20)",
            )
        )
    if t.cache:
        found.append(
            (
                ("teacher.url", "teacher.cache"),
                "teacher.url and teacher.cache are both set. Fix: keep one teacher source",
            )
        )
    if cfg.train.seq_kd:
        found.append(
            (
                ("teacher.url", "train.seq_kd"),
                "train.seq_kd=true needs a local teacher "
                "to write completions; teacher.url only scores. Fix: train.seq_kd=false, "
                "or write the completions once with `distil generate` and train on them",
            )
        )
    if cfg.loss.temperature != 1.0 and cfg.loss.name not in TEACHERLESS:
        found.append(
            (
                ("teacher.url", "loss.temperature"),
                f"loss.temperature = "
                f"{cfg.loss.temperature} with teacher.url: servers return log-probs at "
                "temperature 1, and top-k log-probs cannot be re-tempered exactly. Fix: "
                "loss.temperature=1",
            )
        )
    if not found:
        return None
    keys = tuple(dict.fromkeys(k for keys, _ in found for k in keys))
    return keys, "; ".join(message for _, message in found)


def _vllm_engine_lengths(cfg: DistilConfig):
    """generation.backend=vllm: a set max_model_len must hold the run's longest sequences (the
    engine stops a completion at its context length, silently), and a step's token budget
    must hold one token of every sequence it decodes at once."""
    if cfg.generation.backend != "vllm":
        return None
    v, gen, data = cfg.generation.vllm, cfg.generation, cfg.data
    if v.max_num_seqs and v.max_num_seqs > v.max_num_batched_tokens:
        return ("generation.vllm.max_num_seqs", "generation.vllm.max_num_batched_tokens"), (
            f"generation.vllm.max_num_seqs = {v.max_num_seqs} is more than "
            f"generation.vllm.max_num_batched_tokens = {v.max_num_batched_tokens}, which vLLM "
            "refuses. Fix: lower max_num_seqs or raise max_num_batched_tokens"
        )
    if not v.max_model_len:
        return None  # sized from the lengths below
    needs = [("generation.max_new_tokens", gen.max_new_tokens)]
    if cfg.train.eval_every:  # the in-training eval samples with the same engine
        needs.append(("eval.max_new_tokens", cfg.eval.max_new_tokens))
    key, new = max(needs, key=lambda kv: kv[1])
    if v.max_model_len < data.max_prompt_tokens + new:
        return ("generation.vllm.max_model_len", "data.max_prompt_tokens", key), (
            f"generation.vllm.max_model_len = {v.max_model_len} is shorter than "
            f"data.max_prompt_tokens + {key} = {data.max_prompt_tokens} + {new}: the engine "
            "would stop completions at its context length. Fix: set "
            f"generation.vllm.max_model_len to at least {data.max_prompt_tokens + new}, or "
            "null to size it from these lengths"
        )
    return None


def _teacher_windows(cfg: DistilConfig):
    """generation.teacher_windows > 1 needs teacher-written slices (train.seq_kd=true,
    train.lambda < 1) and a teacher that does not change every step."""
    k, t = cfg.generation.teacher_windows, cfg.teacher
    if k == 1:
        return None
    if not cfg.train.seq_kd or cfg.train.lambda_ >= 1.0:
        return ("generation.teacher_windows", "train.seq_kd"), (
            f"generation.teacher_windows = {k} batches the teacher's seq-KD completions, but "
            "this run has no teacher-written slices (train.seq_kd=false or train.lambda=1). "
            "Fix: generation.teacher_windows=1, or train.seq_kd=true with train.lambda < 1"
        )
    if t.from_student in ("current", "ema"):
        return ("generation.teacher_windows", "teacher.from_student"), (
            f"generation.teacher_windows = {k} writes completions ahead, but teacher.from_student "
            f"= {t.from_student!r} is a teacher that changes every step, so what it wrote ahead "
            "would be stale. Fix: generation.teacher_windows=1, or teacher.from_student=initial"
        )
    return None


def _async_ema_writer(cfg: DistilConfig):
    """generation.async samples the next window in the background while the step trains; an
    EMA teacher that writes seq-KD slices would be sampled while `after_step` lerps it."""
    t, train = cfg.teacher, cfg.train
    if not (cfg.generation.async_ and train.seq_kd and train.lambda_ < 1.0):
        return None
    if t.from_student != "ema":
        return None
    return ("generation.async", "teacher.from_student", "train.seq_kd"), (
        "generation.async = true with teacher.from_student = 'ema' writing seq-KD slices "
        "(train.seq_kd = true, train.lambda < 1): the next window's completions would be "
        "sampled in the background from the average while each step updates it in place, so "
        "they would come from half-updated weights, differ from run to run and not resume "
        "exactly. Fix: generation.async=false, or teacher.from_student=current (its writer "
        "samples the student's snapshot) or initial, or train.seq_kd=false"
    )


CHECKS = [_remote_teacher, _vllm_engine_lengths, _teacher_windows, _async_ema_writer]
