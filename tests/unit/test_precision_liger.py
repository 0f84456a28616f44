"""student.liger: the refusals and the wiring, with a stand-in for liger_kernel (CPU).

The kernels themselves are compared with and without Liger in tests/gpu/test_precision_gpu.py.
"""

import sys
import types

import pytest
import torch

from distil.config import build_config
from distil.errors import ConfigError, MissingExtraError
from distil.models import liger
from distil.testing import tiny_llama


@pytest.fixture
def standin(monkeypatch):
    """A fake liger_kernel whose llama patch records its arguments; a gemma-like patch has no
    swiglu argument (its MLP is GeGLU)."""
    calls = []

    def patch_llama(
        rope=True, cross_entropy=False, fused_linear_cross_entropy=True, rms_norm=True,
        swiglu=True, model=None,
    ):  # fmt: skip
        calls.append(("llama", model, dict(rope=rope, rms_norm=rms_norm, swiglu=swiglu,
                      cross_entropy=cross_entropy, flce=fused_linear_cross_entropy)))  # fmt: skip

    def patch_gemma(rope=True, fused_linear_cross_entropy=True, rms_norm=True, geglu=True,
                    model=None):  # fmt: skip
        calls.append(("gemma", model, dict(rope=rope, flce=fused_linear_cross_entropy)))

    mp = types.ModuleType("liger_kernel.transformers.monkey_patch")
    mp.MODEL_TYPE_TO_APPLY_LIGER_FN = {"llama": patch_llama, "gemma": patch_gemma}
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", types.ModuleType("t"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.monkey_patch", mp)
    return calls


def test_the_patch_gets_the_model_and_never_the_fused_linear_cross_entropy(standin):
    model = tiny_llama(50)
    applied = liger.apply_liger(model, "cuda")
    [(name, patched, kwargs)] = standin
    assert name == "llama" and patched is model
    assert kwargs == dict(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, flce=False)
    assert applied == ["rope", "rms_norm", "swiglu"]
    model.config.model_type = "gemma"  # arguments a patch does not take are dropped
    assert liger.apply_liger(model, torch.device("cuda")) == ["rope", "rms_norm"]
    assert standin[1][2] == dict(rope=True, flce=False)


def test_a_model_type_liger_does_not_know_is_a_config_error(standin):
    model = tiny_llama(50)
    model.config.model_type = "gpt2"
    with pytest.raises(ConfigError, match=r"model type 'gpt2' .*it has: gemma, llama"):
        liger.apply_liger(model, "cuda")
    assert standin == []


def test_off_cuda_is_a_config_error(standin):
    with pytest.raises(ConfigError, match="need a CUDA GPU; this run's device is cpu"):
        liger.apply_liger(tiny_llama(50), "cpu")


def test_without_the_extra_the_error_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # import fails
    with pytest.raises(MissingExtraError, match=r"distil\[liger\]") as err:
        liger.apply_liger(tiny_llama(50), "cuda")
    assert "student.liger=true" in str(err.value)


def test_load_student_applies_liger_only_when_asked(monkeypatch, make_train_config):
    from distil.train import setup

    seen = []
    monkeypatch.setattr(liger, "apply_liger", lambda model, device: seen.append((model, device)))
    acc = types.SimpleNamespace(device=torch.device("cpu"))
    model, _ = setup.load_student(build_config(make_train_config()), acc)
    assert seen == []
    model, _ = setup.load_student(build_config(make_train_config(student={"liger": True})), acc)
    assert seen == [(model, acc.device)]
