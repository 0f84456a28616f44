"""What an FSDP or DeepSpeed launch cannot do is refused before any weights load, with the
value seen and the fix (the launcher's choice reaches distil as ACCELERATE_* / FSDP_*
environment variables)."""

from pathlib import Path

import pytest
import torch
import yaml

from distil.config import build_config
from distil.errors import ConfigError
from distil.train.fsdp import check_launch

CONFIGS = Path(__file__).parents[2] / "configs" / "accelerate"


def cfg(**sections):
    raw = {"student": {"path": "s"}, "teacher": {"path": "t"}}
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return build_config(raw)


@pytest.fixture
def fsdp(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")


def test_plain_and_fsdp2_launches_pass(monkeypatch, fsdp):
    check_launch(cfg())
    check_launch(cfg(teacher={"placement": "shard"}))
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    check_launch(cfg())


@pytest.mark.parametrize(
    ("env", "sections", "words"),
    [
        ({"FSDP_VERSION": "1"}, {}, ["FSDP version 1", "fsdp_version: 2"]),
        ({}, {"student": {"lora": {"enabled": True}}}, ["student.lora.enabled", "DDP"]),
        ({}, {"generation": {"async": True}}, ["generation.async = true", "DDP"]),
        (
            {},
            {"teacher": {"placement": "shard", "device": "cpu"}},
            ["teacher.device = 'cpu'", "teacher.placement=replicate"],
        ),
        ({"ACCELERATE_USE_DEEPSPEED": "true"}, {}, ["DeepSpeed", "fsdp_zero2_8gpu.yaml"]),
    ],
)
def test_unsupported_fsdp_launches_are_refused(monkeypatch, fsdp, env, sections, words):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as err:
        check_launch(cfg(**sections))
    for w in words:
        assert w in str(err.value)


def test_sharded_teacher_without_fsdp_is_refused(monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    with pytest.raises(ConfigError, match=r"teacher\.placement = 'shard'"):
        check_launch(cfg(teacher={"placement": "shard"}))


def test_the_accelerate_configs_are_fsdp2_and_name_the_files_they_mention():
    """Every FSDP config asks for FSDP2 (FSDP1 is refused); every config file a message or
    config names exists."""
    files = {p.name: yaml.safe_load(p.read_text()) for p in CONFIGS.glob("*.yaml")}
    fsdp_files = [n for n, c in files.items() if c["distributed_type"] == "FSDP"]
    assert len(fsdp_files) >= 4
    for name in fsdp_files:
        assert files[name]["fsdp_config"]["fsdp_version"] == 2, name
        assert files[name]["fsdp_config"]["fsdp_cpu_ram_efficient_loading"] is False, name
    for name in ("fsdp_8gpu.yaml", "fsdp_zero2_8gpu.yaml", "ddp_8gpu.yaml"):
        assert name in files
    assert (CONFIGS / "slurm_multinode.sh").exists()


@pytest.mark.parametrize(("precision", "low"), [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_fsdp_mixed_precision_reduces_gradients_in_fp32(fsdp, precision, low):
    # gpu-readiness finding 18: accelerate's own policy for "bf16" reduces in bf16 as well
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from distil.train.fsdp import fsdp_plugin

    plugin = fsdp_plugin(precision)
    policy = plugin.mixed_precision_policy
    assert isinstance(policy, MixedPrecisionPolicy)
    assert (policy.param_dtype, policy.reduce_dtype, policy.output_dtype) == (
        low, torch.float32, low,
    )  # fmt: skip
    # what AcceleratorState does with a plugin it is given: it keeps a policy that is set
    plugin.set_mixed_precision(precision)
    assert plugin.mixed_precision_policy.reduce_dtype == torch.float32
    assert fsdp_plugin("no").mixed_precision_policy is None


def several(**b):
    """Two teachers routed by a column; `b` is teachers.models.b's extra keys."""
    models = {"a": {"path": "t"}, "b": {"path": "t2", **b}}
    return {"teacher": {"path": None}, "teachers": {"models": models, "column": "src"}}


def test_a_sharded_teacher_of_several_needs_fsdp_and_no_device(monkeypatch, fsdp):
    check_launch(cfg(**several(placement="shard")))
    with pytest.raises(ConfigError, match=r"teachers\.models\.b\.device = 'cpu' with .*Fix"):
        check_launch(cfg(**several(placement="shard", device="cpu")))
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    with pytest.raises(ConfigError, match=r"teachers\.models\.b\.placement = 'shard' shards"):
        check_launch(cfg(**several(placement="shard")))


def test_a_sharded_teacher_of_several_is_a_live_one_that_does_not_write():
    with pytest.raises(ConfigError, match=r"models\.b\.placement = 'shard' on a cache or a server"):
        cfg(**several(placement="shard", path=None, cache="DIR", top_k=4))
    raw = several(placement="shard")
    with pytest.raises(ConfigError, match=r"models\.b\.placement = 'shard' on train\.seq_kd"):
        cfg(**raw, train={"seq_kd": True, "lambda": 0.0}, loss={"name": "forward_kl"})
    weights = {**raw["teachers"], "column": None, "weights": {"a": 1.0, "b": 1.0}}
    assert cfg(teacher=raw["teacher"], teachers=weights).teachers.models["b"].placement == "shard"
