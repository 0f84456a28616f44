"""student.dtype / teacher.dtype `auto`, TF32, the pure-bf16 notice and Liger's class patching.

auto is the checkpoint's own dtype on CUDA and float32 on CPU (gpu-readiness finding 1); the
resolution is a function of the saved config and the device name, so it is tested here without
a GPU. The Liger test uses a stand-in patch that does what liger-kernel's qwen3 patch does
(rebinds the modeling module's classes and patches the given instance; finding 13).
"""

import json
import sys
import types

import pytest
import torch

from distil.config import build_config
from distil.config.rules import precision_notices
from distil.models import liger
from distil.models.load import checkpoint_dtype, enable_tf32, load_model, resolve_dtype
from distil.testing import tiny_llama


@pytest.fixture(scope="module")
def bf16_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("bf16_ckpt")
    tiny_llama(50).to(torch.bfloat16).save_pretrained(out)
    return str(out)


def test_auto_is_the_checkpoints_dtype_on_cuda_and_fp32_on_cpu(bf16_dir):
    assert (
        json.loads((__import__("pathlib").Path(bf16_dir) / "config.json").read_text())["dtype"]
        == "bfloat16"
    )
    assert checkpoint_dtype(bf16_dir) == "bfloat16"
    assert resolve_dtype("auto", bf16_dir, "cuda") == "bfloat16"
    assert resolve_dtype("auto", bf16_dir, torch.device("cuda", 1)) == "bfloat16"
    assert resolve_dtype("auto", bf16_dir, "cpu") == "float32"
    assert resolve_dtype("auto", bf16_dir, None) == "float32"
    assert resolve_dtype("float16", bf16_dir, "cpu") == "float16"  # explicit values stay
    assert resolve_dtype("float32", bf16_dir, "cuda") == "float32"


def test_checkpoint_dtype_reads_older_keys_and_falls_back_to_fp32(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float16"}))
    assert checkpoint_dtype(str(tmp_path)) == "float16"
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float64"}))
    assert checkpoint_dtype(str(tmp_path)) == "float32"
    (tmp_path / "config.json").write_text("{}")
    assert checkpoint_dtype(str(tmp_path)) == "float32"
    assert checkpoint_dtype(str(tmp_path / "missing")) == "float32"


def test_load_model_auto_on_cpu_loads_fp32(bf16_dir):
    # the loader every command shares (distil eval, cache-teacher, serve-teacher)
    model = load_model(bf16_dir, device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    model = load_model(bf16_dir, dtype="bfloat16", device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_defaults_are_auto_and_the_student_trains_fp32_weights(bf16_dir, make_train_config):
    from distil.train.setup import student_dtype

    raw = make_train_config(student={"path": bf16_dir}, teacher={"path": bf16_dir})
    cfg = build_config(raw)
    assert cfg.student.dtype == "auto" and cfg.teacher.dtype == "auto"
    # plain AdamW updates the weights themselves: fp32 on any device
    assert student_dtype(cfg, torch.device("cuda")) == "float32"
    assert student_dtype(cfg, torch.device("cpu")) == "float32"
    # fp32 master copies (bf16_weights) or a frozen base (LoRA): the checkpoint's dtype on CUDA
    for train, student in (({"bf16_weights": True}, {}), ({}, {"lora": {"enabled": True}})):
        raw = make_train_config(train=train, student={"path": bf16_dir, **student})
        cfg = build_config(raw)
        assert student_dtype(cfg, torch.device("cuda")) == "bfloat16"
        assert student_dtype(cfg, torch.device("cpu")) == "float32"


def test_tf32_is_switched_on_for_cuda_only():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        enable_tf32("cpu")
        enable_tf32(None)
        assert torch.get_float32_matmul_precision() == "highest"
        enable_tf32(torch.device("cuda", 0))
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize(
    "student, train, warned",
    [
        ({"dtype": "bfloat16"}, {}, True),
        ({"dtype": "float16"}, {}, True),
        ({"dtype": "bfloat16"}, {"bf16_weights": True}, False),
        ({"dtype": "bfloat16", "lora": {"enabled": True}}, {}, False),
        ({"dtype": "auto"}, {}, False),
        ({"dtype": "float32"}, {"bf16": True}, False),
    ],
)
def test_pure_low_precision_adamw_is_warned_about(make_train_config, student, train, warned):
    cfg = build_config(make_train_config(student=student, train=train))
    notices = precision_notices(cfg)
    assert bool(notices) == warned
    if warned:
        assert "train.bf16_weights=true" in notices[0] and student["dtype"] in notices[0]


def _tiny_qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    )  # fmt: skip
    return Qwen3ForCausalLM(cfg)


def test_liger_patches_the_student_instance_not_the_teachers_classes(monkeypatch):
    from transformers.models.qwen3 import modeling_qwen3

    class FakeLigerNorm(torch.nn.Module):
        pass

    original = modeling_qwen3.Qwen3RMSNorm

    def patch_qwen3(rope=True, rms_norm=True, swiglu=True, model=None, **_):
        # what liger-kernel does: rebind the module's class, patch the built instance
        modeling_qwen3.Qwen3RMSNorm = FakeLigerNorm
        model.model.norm.forward = types.MethodType(lambda self, x: x, model.model.norm)
        model.model.norm.patched = True

    mp = types.ModuleType("liger_kernel.transformers.monkey_patch")
    mp.MODEL_TYPE_TO_APPLY_LIGER_FN = {"qwen3": patch_qwen3}
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", types.ModuleType("t"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.monkey_patch", mp)
    monkeypatch.setattr(modeling_qwen3, "Qwen3RMSNorm", original)  # restored after the test
    student = _tiny_qwen3()
    assert student.config.model_type == "qwen3"
    liger.apply_liger(student, "cuda")
    assert getattr(student.model.norm, "patched", False)
    assert modeling_qwen3.Qwen3RMSNorm is original
    teacher = _tiny_qwen3()  # loaded after the student, as train/setup.py does
    norms = [m for m in teacher.modules() if "Norm" in type(m).__name__]
    assert norms and all(type(m) is original for m in norms)
    assert not any(isinstance(m, FakeLigerNorm) for m in teacher.modules())
