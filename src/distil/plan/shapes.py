"""What the planner knows of a model: its sizes, read from config.json and a build on the meta
device (shapes only: no weights are read or allocated).

`model_shape(path)` takes a local directory, a config.json file or a hub id (then only its
config.json is read, through `AutoConfig`). The parameter counts come from the meta build, so
tied embeddings, biases, norms, MoE experts and a vision tower count as transformers builds
them. The activations one decoder layer saves for backward are measured by running that layer
on the meta device under `torch.autograd.graph.saved_tensors_hooks` and adding up the elements
of the storages it saves (parameters excluded), per token (an MoE layer on meta routes every
token to its k experts); an architecture whose layer cannot run on meta falls back to a count
of a Llama-style block.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch

from distil.errors import ConfigError

TRACE_TOKENS = 97  # tokens of the traced layer: a prime, so no (T, T) tail equals a model dim


@dataclass(frozen=True)
class ModelShape:
    """Sizes of one model (counts are elements, not bytes)."""

    path: str
    model_type: str
    dtype: str  # the checkpoint's torch_dtype
    params: int
    embed_params: int  # the input embedding (the output head too when tied)
    head_params: int  # an untied output head (0 when tied)
    largest_param: int  # elements of the largest parameter tensor
    layers: int
    hidden: int
    intermediate: int  # MLP width a token passes through (MoE: active experts x expert width)
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    active_params: int  # parameters a token's forward uses (MoE: routed experts only)
    experts: int = 0
    # linear layers by name suffix: (count, in_features + out_features, in x out summed)
    linears: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    # per token per decoder layer, saved for backward, in elements of the compute dtype
    act_per_token_layer: float = 0.0
    act_traced: bool = False  # measured on the meta device (else the Llama-style count)

    def lora_params(self, r: int, target_modules: str | list[str]) -> int:
        """Adapter parameters of rank `r` over `target_modules` ("all-linear": every linear
        layer but the output head, as peft chooses)."""
        names = None if target_modules == "all-linear" else set(_as_list(target_modules))
        total = 0
        for suffix, (_count, in_out, _) in self.linears.items():
            if names is None or suffix in names:
                total += r * in_out
        return total


def _as_list(value) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def read_config(path: str, *, key: str, trust_remote_code: bool = False):
    """The transformers config of `path` (a directory, a config.json file or a hub id)."""
    from transformers import AutoConfig

    local = Path(os.path.expanduser(path))
    try:
        if local.is_file():
            raw = json.loads(local.read_text(encoding="utf-8"))
            model_type = raw.pop("model_type", None)
            if model_type is None:
                raise ValueError("config.json has no model_type")
            return AutoConfig.for_model(model_type, **raw)
        return AutoConfig.from_pretrained(str(local) if local.exists() else path,
                                          trust_remote_code=trust_remote_code)  # fmt: skip
    except Exception as exc:  # many types: missing file, bad JSON, offline hub, unknown type
        raise ConfigError(
            f"{key} = {path!r}: could not read its config.json ({str(exc).splitlines()[0]}). "
            f"Fix: point {key} to a model directory, a config.json file or a hub id whose "
            "config.json can be read (`distil plan` reads no weights)"
        ) from exc


@lru_cache(maxsize=32)
def model_shape(path: str, *, key: str = "student.path", trust_remote_code: bool = False):
    """The `ModelShape` of `path`, from a meta-device build of its config."""
    from transformers import AutoModelForCausalLM

    config = read_config(path, key=key, trust_remote_code=trust_remote_code)
    text = config.get_text_config()
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(
                config, trust_remote_code=trust_remote_code, dtype=torch.bfloat16
            )  # bf16: the grouped expert matmuls of MoE layers run on meta only in bf16
    except Exception as exc:
        raise ConfigError(
            f"{key} = {path!r}: transformers could not build a causal LM from its config "
            f"({str(exc).splitlines()[0]}). Fix: a model type this transformers version knows, "
            "or student/teacher.trust_remote_code=true for a checkpoint with its own code"
        ) from exc
    return _shape_of(path, model, config, text)


def _shape_of(path: str, model, config, text) -> ModelShape:
    params = list(model.parameters())
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is None or head.weight is embed
    head_params = 0 if tied else head.weight.numel()
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    experts = int(getattr(text, "num_experts", 0) or getattr(text, "num_local_experts", 0) or 0)
    active = int(getattr(text, "num_experts_per_tok", 0) or 0)
    inter = text.intermediate_size
    if experts:
        inter = active * int(getattr(text, "moe_intermediate_size", 0) or inter)
    total = sum(p.numel() for p in params)
    expert_params = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    active_params = total - expert_params + (expert_params * active // experts if experts else 0)
    act, traced = _trace_layer(model, text)
    if not traced:
        q, kv = heads * head_dim, text.num_key_value_heads * head_dim
        act = 6 * text.hidden_size + 6 * q + 4 * kv + 4 * inter  # norms, q/k/v/rope/sdpa, MLP
    return ModelShape(
        path=path,
        model_type=config.model_type,
        dtype=str(
            getattr(config, "dtype", None) or getattr(text, "dtype", None) or "float32"
        ).replace("torch.", ""),
        params=total,
        embed_params=embed.numel(),
        head_params=head_params,
        largest_param=max(p.numel() for p in params),
        layers=text.num_hidden_layers,
        hidden=text.hidden_size,
        intermediate=inter,
        heads=heads,
        kv_heads=text.num_key_value_heads,
        head_dim=head_dim,
        vocab=text.vocab_size,
        active_params=active_params,
        experts=experts,
        linears=_linears(model),
        act_per_token_layer=act,
        act_traced=traced,
    )


def _linears(model) -> dict[str, tuple[int, int, int]]:
    """Linear layers of the decoder (the output head excluded), grouped by name suffix."""
    head = model.get_output_embeddings()
    out: dict[str, tuple[int, int, int]] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and mod is not head and "vision" not in name:
            suffix = name.rsplit(".", 1)[-1]
            c, io, prod = out.get(suffix, (0, 0, 0))
            out[suffix] = (c + 1, io + mod.in_features + mod.out_features,
                           prod + mod.in_features * mod.out_features)  # fmt: skip
    return out


def _trace_layer(model, text) -> tuple[float, bool]:
    """Elements one decoder layer saves for backward per token (parameters and (T, T)
    attention weights excluded: the math attention kernel meta runs keeps them, the flash and
    memory-efficient kernels a GPU or CPU run uses do not), or (0, False) when it cannot run."""
    inner = model.model
    inner = getattr(inner, "language_model", inner)
    t = TRACE_TOKENS
    saved: dict[int, tuple[int, torch.Tensor]] = {}

    def pack(x: torch.Tensor) -> torch.Tensor:
        s = x.untyped_storage()
        # elements, so the count holds for any dtype; keep x alive: its address must not be reused
        saved[s._cdata] = (s.nbytes() // x.element_size(), x)
        return x

    try:
        dtype = next(model.parameters()).dtype
        h = torch.zeros(1, t, text.hidden_size, device="meta", dtype=dtype, requires_grad=True)
        pos = torch.arange(t, device="meta")[None]
        try:
            pe = inner.rotary_emb(h, pos)
        except TypeError:  # rotary embeddings per layer type (Gemma 3)
            pe = inner.rotary_emb(h, pos, "full_attention")
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            inner.layers[0](h, attention_mask=None, position_ids=pos, position_embeddings=pe)
    except Exception:  # data-dependent ops, remote code, unusual layer signatures
        return 0.0, False
    weights = {p.untyped_storage()._cdata for p in model.parameters()}
    total = sum(
        n for k, (n, x) in saved.items() if k not in weights and tuple(x.shape[-2:]) != (t, t)
    )
    return total / t, True
