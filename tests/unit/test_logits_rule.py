"""Logits from hidden states as each model's forward computes them (`distil.models.logits`):
the live teacher, serve-teacher and the student's chunked loss equal `model(...).logits` for
tiny models whose forward scales (Granite, Cohere, HyperCLOVA X, Falcon-H1), pre-scales
(MiniCPM3) or soft-caps (Gemma 2) after the head; a forward that does anything else is refused
when the teacher, the scorer or the student is built."""

from __future__ import annotations

import pytest
import torch
from test_serve_scoring import Tok, check_entries
from transformers import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM

from distil.data.collate import collate
from distil.losses import get_loss
from distil.models.logits import LogitsRuleError, logits_rule
from distil.serve.scoring import PromptScorer
from distil.teacher.live import LiveTeacher
from distil.train.step import check_bypassed_logits, student_forward
from distil.types import Sample, TeacherTargets

V = 120
SMALL = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
MLA = dict(q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8)
MOE = dict(num_local_experts=2, num_experts_per_tok=1)
ARCHS = {
    "granite": dict(logits_scaling=8.0),
    "cohere": dict(logit_scale=0.0625),
    "cohere2": dict(logit_scale=0.0625),
    "hyperclovax": dict(logits_scaling=0.5),
    "gemma2": dict(final_logit_softcapping=3.0, head_dim=16, attn_implementation="eager"),
    "minicpm3": dict(dim_model_base=16, num_key_value_heads=4, **MLA),
    "falcon_h1": dict(lm_head_multiplier=0.3, num_hidden_layers=1, mamba_d_ssm=64,
                      mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_chunk_size=8),
    # the rest of the table's model types, and two more soft-capped ones
    "cohere2_moe": dict(logit_scale=0.0625),
    "granitemoeshared": dict(logits_scaling=8.0, shared_intermediate_size=64, **MOE),
    "granitemoehybrid": dict(logits_scaling=8.0, shared_intermediate_size=64,
                             layer_types=["attention", "attention"], **MOE),
    "granite_swa": dict(logits_scaling=8.0),
    "granitemoe_swa": dict(logits_scaling=8.0, **MOE),
    "gemma3_text": dict(final_logit_softcapping=3.0, head_dim=16),
    "vaultgemma": dict(final_logit_softcapping=3.0, head_dim=16),
}  # fmt: skip


def tiny(model_type: str):
    """A seeded tiny model of `model_type` whose head's logits are large (x 20), so that a
    scale or a soft-cap after the head changes the log-probs by far more than rounding."""
    config = AutoConfig.for_model(model_type, **{**SMALL, **ARCHS[model_type]})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(20)
    return model


def _batch(lengths=(9, 3, 12)):
    g = torch.Generator().manual_seed(0)
    samples = [
        Sample(i, torch.randint(3, V, (6,), generator=g).tolist(),
               torch.randint(3, V, (n,), generator=g).tolist(), "off_policy")
        for i, n in enumerate(lengths)
    ]  # fmt: skip
    return collate(samples, pad_id=0)


def _logits(model, batch):
    with torch.no_grad():
        out = model(input_ids=batch.input_ids_B_L, attention_mask=batch.attention_mask_B_L)
    return out.logits[:, :-1]


def _head_only(model, batch):
    """log-probs of the bare head on the final hidden states (what the branch once scored)."""
    with torch.no_grad():
        h = model.get_decoder()(
            input_ids=batch.input_ids_B_L, attention_mask=batch.attention_mask_B_L
        ).last_hidden_state[:, :-1]
        return torch.log_softmax(model.get_output_embeddings()(h).float(), -1)


@pytest.mark.parametrize("model_type", sorted(ARCHS))
def test_the_live_teacher_scores_as_the_models_own_forward(model_type):
    model = tiny(model_type)
    batch = _batch()
    m = batch.mask_B_T
    ref = torch.log_softmax(_logits(model, batch).float(), -1)
    assert (_head_only(model, batch)[m] - ref[m]).abs().max() > 0.1  # the transform matters
    for packing in (False, True):
        out = LiveTeacher(model, packing=packing, chunk_rows=4).score(batch)
        torch.testing.assert_close(out.logprobs_B_T_V[m], ref[m], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model_type", ["granite", "cohere", "gemma2", "minicpm3"])
def test_serve_teacher_scores_as_the_models_own_forward(model_type):
    model = tiny(model_type)
    prompts = [[5, 17, 30, 4, 99, 7, 8], [3, 9, 11]]
    check_entries(model, prompts, PromptScorer(model, Tok()).score(prompts, 3), 3)


@pytest.mark.parametrize("model_type", ["gemma2", "cohere", "granite", "minicpm3"])
def test_the_chunked_student_loss_equals_the_loss_on_the_models_logits(model_type):
    """Gemma 2's student once trained on uncapped logits (its forward capped the hidden states
    the bypassed head handed back); the chunked loss and its gradients now equal the loss on
    `model(...).logits`."""
    model = tiny(model_type)
    batch = _batch()
    g = torch.Generator().manual_seed(1)
    teacher = torch.log_softmax(torch.randn(*batch.mask_B_T.shape, V, generator=g), -1)
    loss_fn = get_loss("forward_kl")
    kw = dict(num_tokens=int(batch.mask_B_T.sum()), labels_B_T=batch.labels_B_T)

    def loss_and_grads(chunk_size):
        model.zero_grad()
        student = student_forward(model, model, batch, chunk_size=chunk_size, vocab_size=None)
        out = loss_fn(student, TeacherTargets(logprobs_B_T_V=teacher), batch.mask_B_T,
                      chunk_size=chunk_size, **kw)  # fmt: skip
        out.loss.backward()
        return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    ref_loss, ref_grads = loss_and_grads(None)  # the model's own logits
    before = logits_rule(model)
    loss, grads = loss_and_grads(4)
    assert logits_rule(model) == before  # the bypass put the forward's factors back
    torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=1e-5)
    for n in ref_grads:
        torch.testing.assert_close(grads[n], ref_grads[n], atol=1e-5, rtol=1e-4, msg=n)


class CappedLlama(LlamaForCausalLM):
    """A forward that soft-caps its logits after the head with no config field saying so (a
    scale alone would pass the student's check: it commutes with a bias-free head)."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = torch.tanh(out.logits / 4) * 4
        return out


def test_an_unknown_transform_after_the_head_is_refused():
    from distil.testing import tiny_llama

    model = tiny_llama(V, seed=0)
    model.__class__ = CappedLlama
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    builds = {
        "teacher": LiveTeacher,
        "served model": lambda m: PromptScorer(m, Tok()),
        "student": check_bypassed_logits,
    }
    for role, build in builds.items():
        with pytest.raises(LogitsRuleError, match="model type 'llama' \\(CappedLlama\\)") as e:
            build(model)
        assert f"the {role}'s model type" in str(e.value)
        assert ("loss.chunk_size=null" in str(e.value)) == (role == "student")
    model.__class__ = LlamaForCausalLM  # the same weights without the transform: accepted
    LiveTeacher(model)
    check_bypassed_logits(model)


@pytest.mark.parametrize("chunk_size", ["auto", None])
def test_a_chunked_student_is_checked_when_the_run_is_built(
    make_train_config, monkeypatch, chunk_size
):
    from distil.config import build_config
    from distil.train import setup

    checked = []
    monkeypatch.setattr(setup, "check_bypassed_logits", checked.append)
    cfg = build_config(make_train_config(loss={"chunk_size": chunk_size}))
    c = setup.build(cfg)
    assert checked == ([c.unwrapped] if chunk_size else [])


def test_the_teachers_check_costs_one_forward():
    """The decoder's output is read from the model's own forward (a hook): an offloaded
    teacher, checked in host memory, runs its layers once."""
    model = tiny("gemma2")
    calls = []
    model.get_decoder().register_forward_pre_hook(lambda m, a: calls.append(1))
    LiveTeacher(model)
    assert len(calls) == 1
    assert not model.get_decoder()._forward_hooks  # the check's hook is removed
