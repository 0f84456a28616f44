"""train.bf16_weights (bf16 weights, fp32 master copies and moments) and train.fused_adamw."""

import copy
import json

import pytest
import torch

from distil.config import TrainConfig, build_config
from distil.errors import ConfigError
from distil.models.load import load_model
from distil.testing import read_metrics, train_killed_after_checkpoint
from distil.train import checkpoint as ck
from distil.train import loop
from distil.train.optim import (
    MasterAdamW,
    build_optimizer,
    final_weights,
    grad_params,
    use_fused,
)


def tiny(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)
    )


def ordered(opt):
    return [p for g in opt.param_groups for p in g["params"]]


def feed(pairs, gen, scale=1.0):
    """The same bf16-representable random gradient on each (bf16 param, fp32 param) pair."""
    for p, q in pairs:
        g = (scale * torch.randn(p.shape, generator=gen)).bfloat16()
        p.grad = g.clone()
        if q is not None:
            q.grad = g.float()


def test_master_weights_follow_an_fp32_adamw_and_the_model_holds_them_rounded():
    model, ref = tiny(), tiny()
    cfg = dict(lr=1e-4, weight_decay=0.1)
    opt = build_optimizer(model, TrainConfig(bf16_weights=True, **cfg))
    ref_opt = build_optimizer(ref, TrainConfig(**cfg))
    # the old way to train in bf16: student.dtype=bfloat16 and AdamW on the bf16 weights
    naive = tiny().to(torch.bfloat16)
    naive_opt = build_optimizer(naive, TrainConfig(**cfg))
    assert isinstance(opt, MasterAdamW)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    gen = torch.Generator().manual_seed(1)
    for _ in range(8):
        state = gen.get_state()
        feed(zip(opt.model_params, ordered(ref_opt), strict=True), gen)
        gen.set_state(state)
        feed(((p, None) for p in ordered(naive_opt)), gen)
        for o in (opt, ref_opt, naive_opt):
            o.step()
            o.zero_grad()
    for m, r in zip(opt.masters(), ordered(ref_opt), strict=True):
        assert m.dtype == torch.float32
        torch.testing.assert_close(m, r, atol=1e-6, rtol=0)
    for p, m in zip(opt.model_params, opt.masters(), strict=True):
        assert torch.equal(p, m.to(torch.bfloat16))
    # negative control: lr 1e-4 updates mostly vanish below bf16's spacing without masters
    drift = max(
        (n.float() - r).abs().max().item() for n, r in zip(ordered(naive_opt), ordered(ref_opt))
    )
    assert drift > 1e-4


def test_micro_batch_gradients_add_up_in_fp32():
    model = tiny()
    opt = build_optimizer(model, TrainConfig(bf16_weights=True))
    w = opt.model_params[0]
    parts = [torch.full(w.shape, v, dtype=torch.bfloat16) for v in (1.0, 2**-9, 2**-9, 2**-9)]
    for g in parts:
        w.grad = g.clone()
        opt.fold_grads()
        assert w.grad is None  # moved out: the next backward starts a fresh bf16 gradient
    exact = sum(g.float() for g in parts)
    assert torch.equal(opt.masters()[0].grad, exact)
    # negative control: adding the same parts up in bf16 loses them
    bf16_sum = parts[0].clone()
    for g in parts[1:]:
        bf16_sum += g
    assert not torch.equal(bf16_sum.float(), exact)


def test_accumulated_window_equals_one_big_batch_through_the_model(pair_dirs, bpe_tokenizer):
    from test_train import ragged_samples

    from distil.data.collate import collate
    from distil.losses import get_loss
    from distil.teacher.live import LiveTeacher
    from distil.train.step import micro_step

    teacher_dir, student_dir = pair_dirs
    teacher = load_model(str(teacher_dir))
    samples = ragged_samples(bpe_tokenizer)
    scorer = LiveTeacher(teacher, top_k=None, temperature=1.0)
    opts = dict(temperature=1.0, targets_temperature=1.0, beta=0.5, chunk_size=4, ce_weight=0.0)
    pad = bpe_tokenizer.pad_token_id

    def master_grads(micro):
        student = load_model(str(student_dir)).train()
        opt = build_optimizer(student, TrainConfig(bf16_weights=True))
        batches = [collate(samples[s : s + micro], pad) for s in range(0, len(samples), micro)]
        n = sum(b.num_loss_tokens for b in batches)
        for b in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = micro_step(
                    student, student, b, scorer.score(b), get_loss("jsd"),
                    num_tokens=n, loss_opts=opts,
                )  # fmt: skip
            out.loss.backward()
            opt.fold_grads()
        return [m.grad.clone() for m in opt.masters()]

    for a, b in zip(master_grads(2), master_grads(8), strict=True):
        assert a.dtype == torch.float32
        # bf16 forwards of differently padded batches: bf16 tolerance
        torch.testing.assert_close(a, b, atol=2e-3, rtol=5e-2)


def test_clipping_acts_on_the_fp32_master_gradients():
    model, ref = tiny(), tiny()
    opt = build_optimizer(model, TrainConfig(bf16_weights=True))
    ref_opt = build_optimizer(ref, TrainConfig())
    feed(zip(opt.model_params, ordered(ref_opt), strict=True), torch.Generator().manual_seed(3))
    params = list(grad_params(opt, model))
    assert params == opt.masters() and all(p.grad.dtype == torch.float32 for p in params)
    norm = torch.nn.utils.clip_grad_norm_(params, 0.5)
    ref_norm = torch.nn.utils.clip_grad_norm_(ordered(ref_opt), 0.5)
    assert norm.item() == pytest.approx(ref_norm.item(), rel=1e-6)
    for m, r in zip(params, ordered(ref_opt), strict=True):
        torch.testing.assert_close(m.grad, r.grad, atol=1e-7, rtol=1e-6)


def test_master_state_round_trips_through_the_checkpoint_files(tmp_path):
    model = tiny()
    opt = build_optimizer(model, TrainConfig(bf16_weights=True, lr=1e-3))
    gen = torch.Generator().manual_seed(4)
    for _ in range(3):
        feed(((p, None) for p in opt.model_params), gen)
        opt.step()
        opt.zero_grad()
    ck._save_optimizer(opt, tmp_path)
    from safetensors.torch import load_file

    tensors = load_file(str(tmp_path / ck.OPTIM_TENSORS))
    assert tensors["state/0/master"].dtype == torch.float32
    other = tiny(seed=9)  # different weights: everything must come from the files
    other_opt = build_optimizer(other, TrainConfig(bf16_weights=True, lr=1e-3))
    meta = json.loads((tmp_path / ck.OPTIM_META).read_text())
    ck._load_optimizer(other_opt, tensors, meta)
    for a, b in zip(opt.masters(), other_opt.masters(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(opt.model_params, other_opt.model_params, strict=True):
        assert torch.equal(a, b) and b.dtype == torch.bfloat16
    state = gen.get_state()
    feed(((p, None) for p in opt.model_params), gen)
    gen.set_state(state)
    feed(((p, None) for p in other_opt.model_params), gen)
    opt.step()
    other_opt.step()
    for a, b in zip(opt.masters(), other_opt.masters(), strict=True):
        assert torch.equal(a, b)


def test_a_state_without_masters_takes_them_from_the_loaded_model():
    """Resuming a checkpoint of a run without bf16 weights: the model's weights were just
    loaded from it; the masters must follow them, not the weights the run started from."""
    plain = tiny(seed=3)
    plain_opt = build_optimizer(plain, TrainConfig())
    sd = plain_opt.state_dict()
    model = tiny()
    opt = build_optimizer(model, TrainConfig(bf16_weights=True))
    with torch.no_grad():  # what load_checkpoint's model part does before the optimizer's
        for p, q in zip(opt.model_params, ordered(plain_opt), strict=True):
            p.copy_(q)
    opt.load_state_dict(sd)
    for p, m, q in zip(opt.model_params, opt.masters(), ordered(plain_opt), strict=True):
        assert torch.equal(m, q.bfloat16().float()) and torch.equal(p, q.bfloat16())


def test_a_plain_adamw_resuming_a_bf16_weights_state_takes_the_masters(tmp_path):
    model = tiny()
    opt = build_optimizer(model, TrainConfig(bf16_weights=True, lr=1e-4))
    feed(((p, None) for p in opt.model_params), torch.Generator().manual_seed(7))
    opt.step()
    ck._save_optimizer(opt, tmp_path)
    from safetensors.torch import load_file

    plain = tiny(seed=4)
    plain_opt = build_optimizer(plain, TrainConfig(lr=1e-4))
    meta = json.loads((tmp_path / ck.OPTIM_META).read_text())
    ck._load_optimizer(plain_opt, load_file(str(tmp_path / ck.OPTIM_TENSORS)), meta)
    for m, p in zip(opt.masters(), ordered(plain_opt), strict=True):
        assert p.dtype == torch.float32 and torch.equal(p, m)  # exact, not the bf16 weights
        assert "master" not in plain_opt.state[p] and "exp_avg" in plain_opt.state[p]


def test_final_weights_are_the_masters_in_the_loaded_dtype():
    model = tiny()
    opt = build_optimizer(model, TrainConfig(bf16_weights=True, lr=1e-4))
    feed(((p, None) for p in opt.model_params), torch.Generator().manual_seed(5))
    opt.step()
    assert any(not torch.equal(m, m.bfloat16().float()) for m in opt.masters())
    final_weights(opt)
    for p, m in zip(opt.model_params, opt.masters(), strict=True):
        assert p.dtype == torch.float32 and torch.equal(p, m)
        assert p.data_ptr() != m.data_ptr()


@pytest.mark.parametrize("bf16_weights", [False, True])
def test_fused_adamw_equals_the_default_step(bf16_weights):
    a, b = tiny(), tiny()
    cfg = dict(lr=1e-3, weight_decay=0.1, bf16_weights=bf16_weights)
    fused = build_optimizer(a, TrainConfig(fused_adamw=True, **cfg))
    plain = build_optimizer(b, TrainConfig(fused_adamw=False, **cfg))
    inner = fused.param_groups[0]
    assert inner["fused"] is True and plain.param_groups[0]["fused"] is None
    gen = torch.Generator().manual_seed(6)
    params = (lambda o: o.model_params) if bf16_weights else ordered
    for _ in range(6):
        for p, q in zip(params(fused), params(plain), strict=True):
            g = torch.randn(p.shape, generator=gen).bfloat16()
            p.grad, q.grad = g.to(p.dtype), g.to(q.dtype)
        fused.step()
        plain.step()
    for x, y in zip(ordered(fused), ordered(plain), strict=True):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-6)


def test_fused_auto_is_on_for_cuda_only():
    auto = TrainConfig()
    assert use_fused(auto, torch.device("cuda")) is True
    assert use_fused(auto, torch.device("cpu")) is None  # the default for-loop step
    assert use_fused(TrainConfig(fused_adamw=True), torch.device("cpu")) is True
    assert use_fused(TrainConfig(fused_adamw=False), torch.device("cuda")) is None


@pytest.mark.parametrize(
    ("overrides", "keys", "fix"),
    [
        ({"train": {"fp16": True}}, "train.fp16=true", "train.fp16=false"),
        ({"student": {"dtype": "float16"}}, "student.dtype = 'float16'", "student.dtype=float32"),
        (
            {"student": {"lora": {"enabled": True}}},
            "student.lora.enabled=true",
            "bf16_weights=false",
        ),
    ],
)
def test_bad_combinations_are_config_errors(overrides, keys, fix):
    raw = copy.deepcopy(overrides)
    raw.setdefault("train", {})["bf16_weights"] = True
    with pytest.raises(ConfigError) as err:
        build_config(raw)
    assert keys in str(err.value) and fix in str(err.value)


def test_bf16_weights_under_fsdp_is_refused(monkeypatch, tmp_path):
    from distil.train import setup

    monkeypatch.setattr(setup, "fsdp_requested", lambda: True)
    monkeypatch.setattr(setup, "check_launch", lambda cfg: None)
    cfg = build_config({"train": {"bf16_weights": True, "output_dir": str(tmp_path)}})
    with pytest.raises(ConfigError, match=r"train\.bf16_weights=true under FSDP"):
        setup.build_accelerator(cfg)


def test_resumed_bf16_weights_run_matches_the_uninterrupted_one(
    tmp_path, make_train_config, monkeypatch
):
    overrides = {"train": {"max_steps": 4, "save_every": 2, "bf16_weights": True}}
    loop.train(build_config(make_train_config(**overrides)))
    full = read_metrics(tmp_path / "run")
    raw = make_train_config(**copy.deepcopy(overrides))
    raw["train"]["output_dir"] = str(tmp_path / "killed")
    train_killed_after_checkpoint(monkeypatch, build_config(raw), step=2)
    resumed = read_metrics(tmp_path / "killed")
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    for a, b in zip(full[2:], resumed[2:], strict=True):
        assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"], a["step"]
    assert full[2]["loss"] != full[1]["loss"]
    wa = load_model(str(tmp_path / "run" / "final")).state_dict()
    wb = load_model(str(tmp_path / "killed" / "final")).state_dict()
    # the final model: fp32 (student.dtype), from the masters, not the bf16-rounded weights
    assert all(t.dtype == torch.float32 for t in wa.values())
    assert any(not torch.equal(t, t.bfloat16().float()) for t in wa.values())
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name
    ckpt = tmp_path / "run" / "checkpoints" / "step-00000004"
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(str(ckpt / ck.MODEL_FILE)).values()} == {torch.bfloat16}


class WeightCasts:
    """Counts casts of the student's fp32 weight matrices to bf16 (autocast's per-call cost)."""

    def __init__(self, model):
        self.shapes = {tuple(p.shape) for p in model.parameters() if p.ndim == 2}
        self.count = 0

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                x = args[0] if args else None
                if (
                    func is torch.ops.aten._to_copy.default
                    and isinstance(x, torch.Tensor)
                    and x.dtype == torch.float32
                    and kwargs.get("dtype") == torch.bfloat16
                    and tuple(x.shape) in outer.shapes
                ):
                    outer.count += 1
                return func(*args, **kwargs)

        self.mode = Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


@pytest.mark.parametrize(
    ("mode", "backend"), [("bf16", "hf"), ("bf16_weights", "hf"), ("bf16_weights", "hf_static")]
)
def test_generation_on_bf16_weights_recasts_nothing(make_train_config, mode, backend):
    from distil.generation.base import SamplingParams
    from distil.train.setup import build

    raw = make_train_config(train={mode: True}, generation={"backend": backend})
    c = build(build_config(raw))
    generator = c.buffer.student.generator
    prompts = [c.tokenizer("nums: 3 5 target: 8")["input_ids"]] * 2
    with WeightCasts(c.unwrapped) as casts:
        generator.generate(prompts, SamplingParams(6, 1.0, 1.0, 0, 1))
    if mode == "bf16":  # fp32 weights under autocast: recast at every decode step
        assert casts.count >= 6
    else:
        assert casts.count == 0
        assert all(p.dtype == torch.bfloat16 for p in c.unwrapped.parameters())


def test_static_cache_under_autocast_on_fp32_weights_is_a_config_error(make_train_config):
    # distil's own behaviour: the check names both keys, says why, and offers fixes that pass.
    # (Whether torch itself fails inside the static cache on such a run depends on the processor's
    # kernels, so the test does not assert it.)
    raw = make_train_config(train={"bf16": True}, generation={"backend": "hf_static"})
    with pytest.raises(ConfigError) as err:
        build_config(raw)
    msg = str(err.value)
    assert "generation.backend" in msg and "train.bf16" in msg
    assert "'hf_static'" in msg and "fp32 weights" in msg
    assert "Fix: train.bf16_weights=true" in msg and "generation.backend=hf" in msg
    # each fix the message offers is accepted, and so are bf16 weights under autocast
    for fix in (
        {"train": {"bf16": True, "bf16_weights": True}},
        {"generation": {"backend": "hf"}},
        {"student": {"dtype": "bfloat16"}},
    ):
        fixed = make_train_config(train={"bf16": True}, generation={"backend": "hf_static"})
        for section, values in fix.items():
            fixed[section].update(values)
        build_config(fixed)
