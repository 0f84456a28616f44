"""`distil plan`: each memory term against a value worked out by hand, on the shipped configs.

The shipped config.json files (tests/data/model_configs) are built on the meta device; nothing
is downloaded and no weights are read.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from distil.config import build_config
from distil.errors import ConfigError
from distil.losses.chunked import auto_chunk_size
from distil.plan import make_plan, make_target, parse_bytes
from distil.plan.shapes import model_shape

MODEL_CONFIGS = Path(__file__).resolve().parents[1] / "data" / "model_configs"

Q06 = str(MODEL_CONFIGS / "qwen3-0.6b")
Q17 = str(MODEL_CONFIGS / "qwen3-1.7b")
Q06_PARAMS = 596_049_920  # tests/data/model_configs/README.md
H100 = make_target("h100")


def cfg(**sections):
    raw = {
        "student": {"path": Q06, "dtype": "bfloat16"},
        "teacher": {"path": Q17, "dtype": "bfloat16"},
        "data": {"max_prompt_tokens": 256, "max_completion_tokens": 256},
        "generation": {"max_new_tokens": 256, "num_generations": 2},
        "train": {"per_device_batch_size": 4, "grad_accum_steps": 2},
    }
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    return build_config(raw)


def term(plan, phase: str, name: str, device: int = 0) -> int:
    p = next(p for p in plan.devices[device].phases if p.name == phase)
    return next(t.bytes for t in p.terms if t.name == name)


def test_weights_of_qwen3_06b_in_bf16_are_its_parameters_times_two():
    plan = make_plan(cfg(), H100)
    assert plan.student.params == Q06_PARAMS
    assert term(plan, "optimizer step", "student weights") == Q06_PARAMS * 2


def test_adamw_fp32_states_are_8_bytes_a_parameter():
    plan = make_plan(cfg(student={"dtype": "float32"}), H100)
    assert term(plan, "optimizer step", "optimizer states") == 8 * Q06_PARAMS
    assert term(plan, "optimizer step", "gradients") == 4 * Q06_PARAMS


def test_bf16_weights_keep_fp32_masters_and_fp32_moments():
    plan = make_plan(cfg(train={"bf16_weights": True}), H100)
    assert term(plan, "optimizer step", "student weights") == 2 * Q06_PARAMS
    assert term(plan, "optimizer step", "fp32 master weights") == 4 * Q06_PARAMS
    assert term(plan, "optimizer step", "optimizer states") == 8 * Q06_PARAMS
    assert term(plan, "optimizer step", "gradients") == (2 + 4) * Q06_PARAMS


def test_fsdp_shards_weights_gradients_and_states():
    plan = make_plan(cfg(student={"dtype": "float32"}), make_target("h100", gpus=4, fsdp=True))
    assert term(plan, "optimizer step", "student weights") == Q06_PARAMS * 4 // 4
    assert term(plan, "optimizer step", "optimizer states") == 8 * Q06_PARAMS // 4


def test_kv_cache_is_2_layers_kv_heads_head_dim_tokens_bytes():
    plan = make_plan(cfg(), H100)
    rows, tokens = 4 * 2, 256 + 256  # the window's sequences, prompt + max_new_tokens
    # Qwen3-0.6B: 28 layers, 8 KV heads of 128, bf16
    assert term(plan, "generation", "KV cache") == 2 * 28 * 8 * 128 * rows * tokens * 2


def test_hf_static_keeps_its_bucketed_kv_cache_in_every_phase():
    plan = make_plan(cfg(generation={"backend": "hf_static"}), H100)
    # bucket(8) = 8 rows; one cache per prompt bucket up to bucket(256), each + max_new_tokens
    rows, tokens = 8, sum(w + 256 for w in (64, 128, 256))
    kv = 2 * 28 * 8 * 128 * rows * tokens * 2
    for phase in ("generation", "student fwd/bwd + loss", "optimizer step"):
        assert term(plan, phase, "hf_static KV cache (kept)") == kv


def test_hf_static_counts_the_caches_of_a_call_split_at_the_largest_bucket():
    """8 rows over buckets [2, 3]: calls of 3, 3 and 2 rows, so caches of 3 and of 2 rows are
    kept for each prompt bucket (the plan once counted the 3-row set only)."""
    plan = make_plan(cfg(generation={"backend": "hf_static", "static_batch_buckets": [2, 3]}), H100)
    rows, tokens = 3 + 2, sum(w + 256 for w in (64, 128, 256))
    kv = 2 * 28 * 8 * 128 * rows * tokens * 2
    assert term(plan, "generation", "hf_static KV cache (kept)") == kv
    even = make_plan(cfg(generation={"backend": "hf_static", "static_batch_buckets": [4]}), H100)
    assert term(even, "generation", "hf_static KV cache (kept)") == kv * 4 // 5  # 4 + 4: one set


def test_vllm_reserves_its_share_of_the_device_while_it_samples():
    c = cfg(generation={"backend": "vllm", "vllm": {"gpu_memory_utilization": 0.25}})
    plan = make_plan(c, H100)
    assert term(plan, "generation", "vLLM engine") == int(0.25 * H100.memory)
    names = [t.name for p in plan.devices[0].phases[1:] for t in p.terms]
    assert "vLLM engine" not in names  # sleep_level 1 frees it between generations


def test_loss_logits_chunk_is_rows_times_vocabulary_in_fp32():
    plan = make_plan(cfg(), H100)
    rows = auto_chunk_size(151_936)  # 220 of the 4 x 256 loss positions: several chunks
    assert rows == 220
    assert term(plan, "student fwd/bwd + loss", "loss logits chunk") == rows * 151_936 * 4 * 14


def test_unchunked_loss_holds_every_loss_position():
    plan = make_plan(cfg(loss={"chunk_size": None}), H100)
    got = term(plan, "student fwd/bwd + loss", "loss logits (unchunked)")
    assert got == 4 * 256 * 151_936 * 4 * 12


def test_teacher_scoring_chunk_uses_the_losses_auto_chunk_rule():
    plan = make_plan(cfg(), H100)
    rows = auto_chunk_size(151_936)
    assert term(plan, "teacher scoring", "scoring chunk (fp32)") == rows * 151_936 * 4 * 2
    assert term(plan, "teacher scoring", "teacher weights") == plan.teacher.params * 2
    b_t = 4 * (512 - 1)  # the shifted positions of a micro-batch
    assert term(plan, "teacher scoring", "teacher log-probs (B, T, V)") == b_t * 151_936 * 2


def test_cached_and_remote_teachers_hold_top_k_transfer_buffers():
    b_t, k = 4 * 511, 32
    for section in ({"cache": "some/dir"}, {"url": "http://host:8000/v1"}):
        plan = make_plan(cfg(teacher={**section, "top_k": k}, train={"lambda": 0.0}), H100)
        assert term(plan, "teacher scoring", "transfer buffer") == b_t * (k * 12 + 4)
        assert "teacher weights" not in [t.name for p in plan.devices[0].phases for t in p.terms]


def test_lora_trains_adapters_only():
    plan = make_plan(cfg(student={"lora": {"enabled": True, "r": 16}}), H100)
    # all-linear on Qwen3-0.6B, per layer in+out: q 1024+2048, k 1024+1024, v 1024+1024,
    # o 2048+1024, gate 1024+3072, up 1024+3072, down 3072+1024 = 22,528; 28 layers, r=16
    adapters = 16 * 22_528 * 28
    assert term(plan, "optimizer step", "LoRA adapters (fp32)") == adapters * 4
    assert term(plan, "optimizer step", "optimizer states") == adapters * 8
    assert term(plan, "optimizer step", "student weights") == Q06_PARAMS * 2  # frozen, bf16


def test_gradient_checkpointing_keeps_each_layers_input_and_one_layer():
    s = model_shape(Q06)
    tokens, a = 4 * 512, 2
    off = term(make_plan(cfg(), H100), "student fwd/bwd + loss", "activations")
    on = term(make_plan(cfg(student={"gradient_checkpointing": True}), H100),
              "student fwd/bwd + loss", "activations")  # fmt: skip
    final = 3 * s.hidden * tokens * a
    assert off == int(28 * s.act_per_token_layer * tokens * a + final)
    assert on == int(28 * s.hidden * tokens * a + s.act_per_token_layer * tokens * a + final)
    assert s.act_traced and 20_000 < s.act_per_token_layer < 60_000


def test_a_teacher_on_another_device_gets_its_own_column():
    plan = make_plan(cfg(teacher={"device": "cuda:1"}), H100)
    assert [d.name for d in plan.devices] == ["cuda:0", "cuda:1 (teacher)"]
    on_student = [t.name for p in plan.devices[0].phases for t in p.terms]
    assert "teacher weights" not in on_student
    assert "teacher log-probs (B, T, V)" in on_student  # the targets come back to the student


def test_flops_per_phase_follow_2n_and_6n():
    plan = make_plan(cfg(), H100)
    s, t = plan.student, plan.teacher
    phases = {p.name: p for p in plan.devices[0].phases}
    assert phases["teacher scoring"].flops == 2 * t.params * 4 * 512
    student = phases["student fwd/bwd + loss"].flops
    assert student == 6 * s.params * 4 * 512 + 2 * s.hidden * s.vocab * 4 * 256
    assert phases["generation"].flops == 2 * s.params * 8 * 512
    assert plan.tokens_per_s > 0 and plan.bound in phases


def test_parse_bytes_and_its_errors():
    assert parse_bytes("80GiB") == 80 * 2**30
    assert parse_bytes("141GB") == 141 * 10**9
    with pytest.raises(ConfigError, match=r"--gpu-memory = 'lots'.*80GiB"):
        parse_bytes("lots")


def test_a_missing_model_config_names_the_key_and_the_fix(tmp_path):
    with pytest.raises(ConfigError, match=r"teacher.path = .*could not read its config.json.*Fix"):
        make_plan(cfg(teacher={"path": str(tmp_path / "nowhere")}), H100)


def test_seq_kd_teacher_writes_with_its_own_kv_cache():
    plan = make_plan(cfg(train={"seq_kd": True, "lambda": 0.0}), H100)
    rows, tokens = 4 * 2, 256 + 256  # the window's off-policy slices, prompt + max_new_tokens
    # Qwen3-1.7B: 28 layers, 8 KV heads of 128, bf16
    kv = 2 * 28 * 8 * 128 * rows * tokens * 2
    assert term(plan, "teacher generation (seq-KD)", "teacher KV cache") == kv
    assert "generation" not in [p.name for p in plan.devices[0].phases]  # no on-policy slices


def test_moe_layers_are_traced_on_meta():
    s = model_shape(str(MODEL_CONFIGS / "qwen3-30b-a3b"))
    assert s.params == 30_532_122_624 and s.experts == 128 and s.act_traced
    assert s.active_params < s.params // 5  # 8 of 128 experts a token


def test_a_config_json_file_or_a_hub_id_is_enough(monkeypatch):
    from transformers import AutoConfig

    by_file = make_plan(cfg(student={"path": str(MODEL_CONFIGS / "qwen3-0.6b" / "config.json")}),
                        H100)  # fmt: skip
    assert by_file.student.params == Q06_PARAMS
    asked = []
    real = AutoConfig.from_pretrained

    def from_pretrained(name, **kwargs):  # the hub id's config.json, and nothing else
        asked.append(name)
        return real(Q06)

    monkeypatch.setattr(AutoConfig, "from_pretrained", from_pretrained)
    by_hub = make_plan(cfg(student={"path": "Qwen/Qwen3-0.6B-not-cached"}), H100)
    assert asked == ["Qwen/Qwen3-0.6B-not-cached"] and by_hub.student.params == Q06_PARAMS


def test_self_distillation_plans_the_students_copy_or_none():
    copy = make_plan(cfg(teacher={"path": None, "from_student": "initial", "system": "hint"}),
                     H100)  # fmt: skip
    assert copy.teacher.params == Q06_PARAMS
    assert term(copy, "teacher scoring", "teacher weights") == Q06_PARAMS * 2  # student.dtype
    same = make_plan(cfg(teacher={"path": None, "from_student": "current", "system": "hint"}),
                     H100)  # fmt: skip
    names = [t.name for p in same.devices[0].phases for t in p.terms]
    assert "teacher weights" not in names and "scoring chunk (fp32)" in names


def several(weights=None, **sections):
    """Qwen3-1.7B (`big`) and Qwen3-0.6B (`small`), routed by a column or mixed."""
    routing = {"weights": weights} if weights else {"column": "domain"}
    models = {
        "big": {"path": Q17, "dtype": "bfloat16"},
        "small": {"path": Q06, "dtype": "bfloat16"},
    }
    return cfg(teacher={"path": None}, teachers={"models": models, **routing}, **sections)


def test_several_teachers_hold_every_live_teachers_weights_in_every_phase():
    plan = make_plan(several(), H100)
    big, small = model_shape(Q17).params, Q06_PARAMS
    for p in plan.devices[0].phases:
        named = {t.name: t.bytes for t in p.terms}
        assert named["teacher weights (big)"] == big * 2, p.name
        assert named["teacher weights (small)"] == small * 2, p.name
    assert [t.name for t in plan.teachers] == ["big", "small"] and plan.teacher.params == big


def test_routed_scoring_is_the_largest_teachers_plus_the_assembled_targets():
    one = make_plan(cfg(), H100)  # Q17 alone scores the micro-batch
    routed = make_plan(several(), H100)
    single = {t.name: t.bytes for t in next(p for p in one.devices[0].phases
                                              if p.name == "teacher scoring").terms}  # fmt: skip
    rows_bt, vocab = 4 * (512 - 1), 151_936
    for name in ("teacher forward", "teacher hidden states", "scoring chunk (fp32)"):
        assert term(routed, "teacher scoring", f"{name} (big)") == single[name]
    assert term(routed, "teacher scoring", "routed targets (assembled)") == rows_bt * vocab * 2
    # the student's step holds one micro-batch's targets, as with one teacher
    assert term(routed, "student fwd/bwd + loss", "teacher log-probs (B, T, V)") == (
        rows_bt * vocab * 2
    )
    s_one = next(p for p in one.devices[0].phases if p.name == "teacher scoring")
    s_routed = next(p for p in routed.devices[0].phases if p.name == "teacher scoring")
    assert s_routed.flops == s_one.flops  # the worst micro-batch: the big teacher on every row


def test_mixed_scoring_holds_the_mixture_and_runs_every_teacher():
    plan = make_plan(several({"big": 1.0, "small": 1.0}), H100)
    rows_bt, vocab = 4 * (512 - 1), 151_936
    # the other teacher's bf16 log-probs, and a chunk of 220 rows mixed in fp32 (no B x T x V)
    assert term(plan, "teacher scoring", "the other teachers' log-probs") == rows_bt * vocab * 2
    assert term(plan, "teacher scoring", "mixing chunk (fp32)") == 220 * vocab * 4 * 3
    scoring = next(p for p in plan.devices[0].phases if p.name == "teacher scoring")
    big, small = model_shape(Q17).active_params, model_shape(Q06).active_params
    assert scoring.flops == 2 * (big + small) * 4 * 512
    # weight 0: loaded (resident) but never run
    zero = make_plan(several({"big": 1.0, "small": 0.0}), H100)
    scoring = next(p for p in zero.devices[0].phases if p.name == "teacher scoring")
    assert scoring.flops == 2 * big * 4 * 512
    assert term(zero, "teacher scoring", "teacher weights (small)") == Q06_PARAMS * 2


def test_a_cached_teacher_holds_no_weights_and_a_teacher_device_gets_its_column():
    c = several()
    models = dict(c.teachers.models)
    models["small"] = models["small"].model_copy(update={"path": None, "cache": "DIR", "top_k": 8})
    models["big"] = models["big"].model_copy(update={"device": "cuda:1"})
    c = c.model_copy(update={"teachers": c.teachers.model_copy(update={"models": models})})
    plan = make_plan(c, H100)
    names = {t.name for p in plan.devices[0].phases for t in p.terms}
    assert "teacher weights (small)" not in names and "teacher weights (big)" not in names
    assert "teacher top-k targets (small)" in names
    assert [d.name for d in plan.devices] == ["cuda:0", "cuda:1 (teachers big)"]
    assert term(plan, "teacher scoring", "teacher weights (big)", device=1) == (
        model_shape(Q17).params * 2
    )


def offloaded(c, *names):
    models = {n: t.model_copy(update={"offload": n in names}) for n, t in c.teachers.models.items()}
    return c.model_copy(update={"teachers": c.teachers.model_copy(update={"models": models})})


def test_offloaded_teachers_hold_the_largest_ones_weights_while_scoring_only():
    big, small = model_shape(Q17).params * 2, Q06_PARAMS * 2  # bf16 bytes
    whole = make_plan(several(), H100)
    both = make_plan(offloaded(several(), "big", "small"), H100)
    for p, q in zip(whole.devices[0].phases, both.devices[0].phases, strict=True):
        names = {t.name for t in q.terms}
        if p.name == "teacher scoring":  # the largest offloaded teacher, once
            assert term(both, p.name, "teacher weights (big, offloaded)") == big
            assert q.peak == p.peak - small, p.name
        else:  # every other phase: no teacher on the device
            assert not any(n.startswith("teacher weights") for n in names), p.name
            assert q.peak == p.peak - big - small, p.name
    note = next(n for n in both.notes if n.startswith("host memory"))
    assert f"{(big + small) / 1e9:.2f} GB (big {big / 1e9:.2f} GB, ~{big / 25e9:.2f} s" in note
    # one offloaded, one resident: the resident one in every phase, the offloaded one scoring
    one = make_plan(offloaded(several(), "small"), H100)
    for p in one.devices[0].phases:
        assert term(one, p.name, "teacher weights (big)") == big
    assert term(one, "teacher scoring", "teacher weights (small, offloaded)") == small
    # a mixture's weight-0 teacher never runs, so is never on the device
    zero = make_plan(offloaded(several({"big": 0.0, "small": 1.0}), "big", "small"), H100)
    assert term(zero, "teacher scoring", "teacher weights (small, offloaded)") == small


def test_privileged_context_lengthens_the_teachers_sequences_only():
    base = cfg(teacher={"path": None, "from_student": "current", "system": "hint"})
    plain = make_plan(base, H100, context_tokens=0)
    longer = make_plan(base, H100, context_tokens=100)
    s = model_shape(Q06)
    assert (
        term(longer, "teacher scoring", "teacher hidden states")
        == 4 * (512 + 100 - 1) * s.hidden * 2
    )
    for phase in ("student fwd/bwd + loss", "generation", "optimizer step"):
        assert term(longer, phase, "activations" if "fwd" in phase else "student weights") == (
            term(plain, phase, "activations" if "fwd" in phase else "student weights")
        )
    # no local data to measure on: one more prompt's worth, said in a note
    guessed = make_plan(base, H100)
    assert guessed.sizes.context == 256 and any("--context-tokens" in n for n in guessed.notes)


def test_a_students_copy_is_in_the_dtype_the_student_loads_in():
    # student.dtype auto on CUDA: the student loads (and the EMA copy is made) in fp32 unless
    # bf16_weights or LoRA keep the checkpoint's bf16 (train.setup.student_dtype)
    ema = {"path": None, "from_student": "ema", "system": "hint"}
    fp32 = make_plan(cfg(student={"dtype": "auto"}, teacher=ema), H100)
    assert term(fp32, "teacher scoring", "teacher weights") == Q06_PARAMS * 4
    assert term(fp32, "optimizer step", "student weights") == Q06_PARAMS * 4
    bf16 = make_plan(
        cfg(student={"dtype": "auto"}, teacher=ema, train={"bf16_weights": True}), H100
    )
    assert term(bf16, "teacher scoring", "teacher weights") == Q06_PARAMS * 2


def test_several_teachers_writing_seq_kd_plan_the_largest_writer_or_every_mixed_one():
    seq_kd = {"train": {"seq_kd": True, "lambda": 0.0}}
    one = make_plan(cfg(**seq_kd), H100)  # Q17 alone writes the window's rows
    kv = term(one, "teacher generation (seq-KD)", "teacher KV cache")
    routed = make_plan(several(**seq_kd), H100)
    assert term(routed, "teacher generation (seq-KD)", "teacher KV cache (big)") == kv
    writing = next(p for p in routed.devices[0].phases if p.name == "teacher generation (seq-KD)")
    w_one = next(p for p in one.devices[0].phases if p.name == "teacher generation (seq-KD)")
    assert writing.flops == w_one.flops
    assert term(routed, "teacher generation (seq-KD)", "teacher weights (small)") == Q06_PARAMS * 2
    mixed = make_plan(several({"big": 1.0, "small": 1.0}, **seq_kd), H100)
    small_kv = 2 * 28 * 8 * 128 * 8 * 512 * 2  # Qwen3-0.6B: 28 layers, 8 KV heads of 128
    assert term(mixed, "teacher generation (seq-KD)", "teacher KV cache (small)") == small_kv
    assert term(mixed, "teacher generation (seq-KD)", "teacher KV cache (big)") == kv
    writing = next(p for p in mixed.devices[0].phases if p.name == "teacher generation (seq-KD)")
    big, small = model_shape(Q17).active_params, model_shape(Q06).active_params
    assert writing.flops == 2 * (big + small) * 8 * 512


def test_a_sharded_teacher_of_several_holds_its_share_of_the_weights():
    c = several()
    models = dict(c.teachers.models)
    models["big"] = models["big"].model_copy(update={"placement": "shard"})
    c = c.model_copy(update={"teachers": c.teachers.model_copy(update={"models": models})})
    plan = make_plan(c, make_target("h100", gpus=4, fsdp=True))
    big, small = model_shape(Q17).params * 2, Q06_PARAMS * 2  # bf16 bytes
    seen = 0
    for p in plan.devices[0].phases:
        named = {t.name: t.bytes for t in p.terms}
        if "teacher weights (big)" in named:
            seen += 1
            assert named["teacher weights (big)"] == pytest.approx(big / 4, abs=4), p.name
            assert named["teacher weights (small)"] == small, p.name
    assert seen >= 3  # in every phase, as a replicated teacher's


def test_a_mixture_writer_holds_the_kv_caches_of_64_rows_at_a_time():
    from distil.generation.mixture import MAX_BATCH

    window = {"per_device_batch_size": 32, "grad_accum_steps": 8}  # 256 rows
    mixed = make_plan(several({"big": 1.0, "small": 1.0}, train={"seq_kd": True, "lambda": 0.0,
                                                                  **window}), H100)  # fmt: skip
    small_kv = 2 * 28 * 8 * 128 * MAX_BATCH * 512 * 2  # Qwen3-0.6B: 28 layers, 8 KV heads
    assert term(mixed, "teacher generation (seq-KD)", "teacher KV cache (small)") == small_kv
    writing = next(p for p in mixed.devices[0].phases if p.name == "teacher generation (seq-KD)")
    big, small = model_shape(Q17).active_params, model_shape(Q06).active_params
    assert writing.flops == 2 * (big + small) * 256 * 512  # every row written
