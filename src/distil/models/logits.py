"""Logits from a causal LM's final hidden states, as its own forward computes them.

Every path that applies the output head itself (a live teacher reading its decoder, the
serve-teacher scorer, the student's chunked loss) must also apply what the model's
`*ForCausalLM.forward` does around the head. In transformers 5.24:

    any config with final_logit_softcapping c (Gemma 2/3/3n/4, VaultGemma, nanochat):
                          logits = c * tanh(lm_head(h) / c)
    Cohere, Cohere2, Cohere2-MoE: logits = lm_head(h) * self.logit_scale
    Granite (MoE, shared, hybrid, SWA): logits = lm_head(h) / config.logits_scaling
    HyperCLOVA X:         logits = lm_head(h) * config.logits_scaling
    Falcon-H1:            logits = lm_head(h) * self.model.lm_head_multiplier
    MiniCPM3:             logits = lm_head(h / config.logits_scaling)   (before the head)

`logits_rule(model)` reads the factors where the forward reads them. `check_logits` compares
the model's own `.logits` with decoder + rule on a few tokens once, when a teacher or a
chunked-loss student is built, so an architecture that does anything else is refused with its
model type named instead of scored wrongly. `after_head_off` makes a forward with its head
replaced by an identity (`data.packing.head_bypassed`) return the head's input: the factors
after the head are set to no-ops while it runs, since a soft-cap applied to hidden states
cannot be undone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from distil.errors import DistilError

# model_type: (op, attribute path from the *ForCausalLM module to the factor its forward reads)
AFTER_HEAD = {
    "cohere": ("mul", "logit_scale"),
    "cohere2": ("mul", "logit_scale"),
    "cohere2_moe": ("mul", "logit_scale"),
    "granite": ("div", "config.logits_scaling"),
    "granitemoe": ("div", "config.logits_scaling"),
    "granitemoeshared": ("div", "config.logits_scaling"),
    "granitemoehybrid": ("div", "config.logits_scaling"),
    "granite_swa": ("div", "config.logits_scaling"),
    "granitemoe_swa": ("div", "config.logits_scaling"),
    "hyperclovax": ("mul", "config.logits_scaling"),
    "falcon_h1": ("mul", "model.lm_head_multiplier"),
}
BEFORE_HEAD = {"minicpm3": ("div", "config.logits_scaling")}
SOFTCAP = "config.final_logit_softcapping"


@dataclass(frozen=True)
class LogitsRule:
    """logits = cap(after(lm_head(before(hidden)))): each step the identity when its factor is
    None. `mul`/`div` multiply/divide the logits, `cap` soft-caps them, `hidden_div` divides
    the hidden states before the head."""

    model_type: str = ""
    hidden_div: float | None = None
    mul: float | None = None
    div: float | None = None
    cap: float | None = None

    def head_input(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden if self.hidden_div is None else hidden / self.hidden_div

    def after_head(self, logits: torch.Tensor) -> torch.Tensor:
        """The forward's steps after the head, in the logits' dtype, in its order."""
        if self.mul is not None:
            logits = logits * self.mul
        if self.div is not None:
            logits = logits / self.div
        if self.cap:  # Gemma 2: logits / c, tanh, * c
            logits = torch.tanh(logits / self.cap) * self.cap
        return logits

    @property
    def has_after_head(self) -> bool:
        return self.mul is not None or self.div is not None or bool(self.cap)

    def logits(self, hidden: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
        """logits (..., V) from the final hidden states (..., H), in the head's dtype."""
        x = self.head_input(hidden).to(weight.dtype)
        return self.after_head(F.linear(x, weight, bias))


def causal_lm(model):
    """The *ForCausalLM module inside a PEFT wrapper (whose attributes are the model's)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(inner, "module", inner)  # DDP


def _read(module, path: str):
    for name in path.split("."):
        module = getattr(module, name, None)
    return module


def _write(module, path: str, value) -> None:
    *parents, name = path.split(".")
    for p in parents:
        module = getattr(module, p)
    setattr(module, name, value)


def logits_rule(model) -> LogitsRule:
    """What `model`'s forward does around its head (see the module docstring)."""
    lm = causal_lm(model)
    model_type = str(getattr(getattr(lm, "config", None), "model_type", ""))
    fields: dict = {"cap": _read(lm, SOFTCAP) or None}
    if model_type in AFTER_HEAD:
        op, path = AFTER_HEAD[model_type]
        fields[op] = float(_read(lm, path))
    if model_type in BEFORE_HEAD:
        fields["hidden_div"] = float(_read(lm, BEFORE_HEAD[model_type][1]))
    return LogitsRule(model_type=model_type, **fields)


@contextmanager
def after_head_off(model) -> Iterator[None]:
    """While it runs, `model`'s forward applies nothing after its head (factors set to 1, the
    soft-cap to None); restored after. Hold the module's lock (`head_bypassed` does)."""
    lm = causal_lm(model)
    model_type = str(getattr(getattr(lm, "config", None), "model_type", ""))
    paths = [(SOFTCAP, None)] if _read(lm, SOFTCAP) else []
    if model_type in AFTER_HEAD:
        paths.append((AFTER_HEAD[model_type][1], 1.0))
    saved = [(path, _read(lm, path)) for path, _ in paths]
    try:
        for path, neutral in paths:
            _write(lm, path, neutral)
        yield
    finally:
        for path, value in saved:
            _write(lm, path, value)


class LogitsRuleError(DistilError):
    """A model's forward computes its logits from its hidden states in a way distil does not
    reproduce."""


CHECK_IDS = 8  # tokens of the one-time check


@torch.no_grad()
def check_logits(model, rule: LogitsRule, head_input: Callable, *, role: str) -> None:
    """Refuse `model` unless `rule` applied to `head_input(kw)` (the head's input (1, L, H)
    for the forward's keyword arguments `kw`, called after `model(**kw)`) gives the model's own
    `.logits` on a few tokens, within two units in the last place of its dtype (1e-4 in fp32)
    of the largest logit. `role` names the model in the error ("teacher", "student", ...)."""
    lm = causal_lm(model)
    training = lm.training
    lm.eval()  # no dropout in either forward
    try:
        device = next(lm.parameters()).device
        rows = lm.get_input_embeddings().weight.shape[0]
        ids = (torch.arange(1, CHECK_IDS + 1, device=device) % rows)[None]
        kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
        ref = model(**kw).logits
        head = lm.get_output_embeddings()
        got = rule.after_head(F.linear(head_input(kw).to(head.weight.dtype), head.weight,
                                       getattr(head, "bias", None)))  # fmt: skip
    finally:
        lm.train(training)
    err = float((got.float() - ref.float()).abs().max())
    scale = 1.0 + float(ref.float().abs().max())
    tol = max(2 * torch.finfo(ref.dtype).eps, 1e-4) * scale
    if not err <= tol:
        fix = "use a model of another architecture"
        if role == "student":  # the loss can read the forward's own logits instead
            fix = "set loss.chunk_size=null (the loss then reads the forward's own logits)"
        raise LogitsRuleError(
            f"the {role}'s model type {rule.model_type or '(unknown)'!r} "
            f"({type(lm).__name__}) computes its logits from its hidden states in a way distil "
            f"does not reproduce: on {CHECK_IDS} tokens its own logits differ from the head "
            f"applied to its final hidden states (with {rule}) by up to {err:.4g} (largest "
            f"logit {scale - 1:.4g}). Its forward probably scales or caps the logits after the "
            f"head in a way distil.models.logits does not know. Fix: {fix}, or add this "
            "model type's transform to distil.models.logits"
        )


def check_decoder_logits(model, rule: LogitsRule, *, role: str = "teacher") -> None:
    """`check_logits` for a model scored through its decoder (a teacher, serve-teacher): the
    decoder's output is read from the model's own forward (a hook), so the check costs one
    forward of a few tokens (an offloaded teacher runs it in host memory)."""
    decoder = model.get_decoder()
    seen: list[torch.Tensor] = []
    hook = decoder.register_forward_hook(lambda m, a, out: seen.append(out[0]))

    def head_input(kw):  # a forward that never ran its decoder: the decoder run on its own
        return rule.head_input(seen[-1] if seen else decoder(**kw)[0])

    try:
        check_logits(model, rule, head_input, role=role)
    finally:
        hook.remove()
