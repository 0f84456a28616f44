"""The bare side of bench/realsize.py: the same model calls as distil's on-policy step with no
distil code in between.

`generate` under bf16 autocast (temperature 1, no top-k/top-p; the embedding rows past the
tokenizer masked by a logits processor that fills that slice of each step's scores with -inf,
as distil's samplers do (in place: theirs clone the scores first, so the bare side is the
cheaper by a copy); `suppress_tokens` over the ~151k padded ids ran an `isin` over the
vocabulary every step and slowed the bare side), one teacher forward per micro-batch under
inference_mode, student forward + unchunked fp32 reverse KL (log-softmax on the loss positions
only, as distil) + backward per micro-batch, clip + fused AdamW (bf16_weights: on fp32 master
copies of the bf16 weights, copied back).
"""

from __future__ import annotations

import time

import torch


def now(device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def prompt_windows(dirs, tok, rows_per_step: int, steps: int) -> list[list[list[int]]]:
    """The prompts of each step as token ids (the template distil renders: countdown_plain)."""
    from distil.tasks.countdown import get_template, read_rows

    template = get_template("countdown_plain")
    rows = read_rows(dirs["data"])[: rows_per_step * steps]
    texts = [
        tok.apply_chat_template(
            template.messages(r["nums"], r["target"]), tokenize=False, add_generation_prompt=True
        )
        for r in rows
    ]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    return [ids[i * rows_per_step : (i + 1) * rows_per_step] for i in range(steps)]


class PastTokenizerMasked:
    """A logits processor: -inf on the ids at or past `limit` (rows no text decodes to), one
    in-place slice fill of the step's fp32 scores (generate hands each step a fresh copy)."""

    def __init__(self, limit: int):
        self.limit = limit

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores[:, self.limit :] = float("-inf")
        return scores


def run_bare(dirs, args, lr: float) -> list[dict]:
    """Per step, the phases' seconds, input tokens and loss tokens of the bare calls."""
    from transformers import AutoModelForCausalLM, LogitsProcessorList

    from distil.models.tokenizers import left_pad
    from distil.testing import load_tokenizer

    dev = args.device
    tok = load_tokenizer(dirs["tokenizer"])
    s_dtype = torch.bfloat16 if args.precision == "bf16_weights" else torch.float32
    student = AutoModelForCausalLM.from_pretrained(dirs["student"], dtype=s_dtype).to(dev)
    teacher = AutoModelForCausalLM.from_pretrained(dirs["teacher"], dtype=torch.bfloat16)
    teacher = teacher.to(dev).eval()
    params = [p for p in student.parameters() if p.requires_grad]
    masters = [p.detach().float() for p in params] if s_dtype == torch.bfloat16 else params
    opt = torch.optim.AdamW(masters, lr=lr, fused=dev == "cuda")
    autocast = torch.autocast(dev, dtype=torch.bfloat16)
    masked = LogitsProcessorList([PastTokenizerMasked(len(tok))])  # as distil's samplers
    out = []
    for prompts in prompt_windows(dirs, tok, args.batch * args.accum, args.steps):
        ids, attn = (t.to(dev) for t in left_pad(prompts, tok.pad_token_id))
        t0 = now(dev)
        student.eval()
        with torch.no_grad(), autocast:
            seqs = student.generate(
                input_ids=ids, attention_mask=attn, max_new_tokens=args.new, do_sample=True,
                temperature=1.0, top_k=0, top_p=1.0, logits_processor=masked,
                pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
            )  # fmt: skip
        student.train()
        rec = {"generate": now(dev) - t0, "teacher": 0.0, "student": 0.0}
        full = torch.cat([attn, completion_mask(seqs[:, ids.shape[1] :], tok.eos_token_id)], 1)
        loss_mask = full.clone()
        loss_mask[:, : ids.shape[1]] = 0
        n = max(int(loss_mask[:, 1:].sum()), 1)
        for rows in torch.arange(len(prompts), device=dev).split(args.batch):
            bare_micro_step(student, teacher, seqs[rows], full[rows], loss_mask[rows], n, rec)
        t0 = now(dev)
        bare_update(params, masters, opt)
        rec["optimizer"] = now(dev) - t0
        rec["step"] = rec["generate"] + rec["teacher"] + rec["student"] + rec["optimizer"]
        rec["tokens"] = int(full.sum())
        rec["loss_tokens"] = int(loss_mask[:, 1:].sum())
        out.append(rec)
    return out


def bare_update(params: list, masters: list, opt) -> None:
    """Clip + AdamW; with bf16 weights on fp32 masters (gradients added in fp32), copied back."""
    if masters is not params:
        for m, p in zip(masters, params, strict=True):
            m.grad = p.grad.float()
            p.grad = None
    torch.nn.utils.clip_grad_norm_(masters, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    if masters is not params:
        with torch.no_grad():
            torch._foreach_copy_(params, masters)


def completion_mask(comp: torch.Tensor, eos: int) -> torch.Tensor:
    """1 up to and including the first EOS of each row, 0 after."""
    after = (comp == eos).long().cumsum(1) - (comp == eos).long()
    return (after == 0).long()


def bare_micro_step(student, teacher, seqs, attn, loss_mask, n: int, rec: dict) -> None:
    """Teacher forward, then student forward + reverse KL + backward, log-softmax on the loss
    positions only (the models' heads still run on every position: HF forwards do)."""
    dev = seqs.device.type
    rows = loss_mask[:, 1:].bool()
    t0 = now(dev)
    with torch.inference_mode():
        t_logits = teacher(input_ids=seqs, attention_mask=attn, use_cache=False).logits
        t_logp = torch.log_softmax(t_logits[:, :-1][rows].float(), -1)
    t_logp = t_logp.clone()  # out of inference mode
    t1 = now(dev)
    with torch.autocast(dev, dtype=torch.bfloat16):
        s_logits = student(input_ids=seqs, attention_mask=attn, use_cache=False).logits
    s_logp = torch.log_softmax(s_logits[:, :-1][rows].float(), -1)
    kl = (s_logp.exp() * (s_logp - t_logp)).sum(-1)  # reverse KL per loss position
    kl.sum().div(n).backward()
    rec["teacher"] += t1 - t0
    rec["student"] += now(dev) - t1
