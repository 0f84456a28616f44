"""Multiple-choice scoring by log-likelihood, the way lm-evaluation-harness scores MMLU: each
choice's continuation (" A", " B", ...) is scored after the prompt as plain text, and the
choice of highest summed log-probability is the model's answer (lm-eval's `acc`).

Tokenization follows lm-eval's `_encode_pair` for causal models: trailing spaces of the
context move to the continuation, the context and context + continuation are each encoded
with the tokenizer's defaults (its BOS, if it adds one, as lm-eval 0.4.10 and later do: 0.4.9
encoded without it, hence the extra's pin), and the continuation's tokens are those past the
context's. A sequence longer than the model's context is cut from the left.
The verdicts then come from the task's own check of the chosen letter, so the report is the
same table as for a generated answer.
"""

from __future__ import annotations

from typing import Any

import torch


def encode_pair(tok, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids), as lm-eval's HFLM encodes a loglikelihood request."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tok(context + continuation)["input_ids"]
    head = tok(context)["input_ids"]
    return head, whole[len(head) :]


@torch.no_grad()
def logliks(model, tok, requests: list[tuple[str, str]], *, batch_size: int = 16) -> list[float]:
    """The summed log-probability of each (context, continuation) request's continuation."""
    device = next(model.parameters()).device
    limit = getattr(model.config, "max_position_embeddings", None)
    encoded = [encode_pair(tok, c, x) for c, x in requests]
    out: list[float] = []
    was_training = model.training
    model.eval()
    try:
        for s in range(0, len(encoded), batch_size):
            out += _batch(model, encoded[s : s + batch_size], device, limit)
    finally:
        model.train(was_training)
    return out


def _batch(model, pairs, device, limit: int | None) -> list[float]:
    """One right-padded forward over the pairs' context + continuation (the last token left
    out: it is only predicted), each continuation's log-probs summed. Only the continuation
    positions are normalized: log_softmax over all B x L x V positions would hold a float copy
    of every logit (about 10 GB for 16 five-shot MMLU requests at a 151k vocabulary)."""
    rows = []
    for head, cont in pairs:
        ids = (head + cont)[:-1]
        rows.append(ids[-limit:] if limit else ids)
    width = max(len(r) for r in rows)
    ids_B_L = torch.zeros((len(rows), width), dtype=torch.long)
    mask_B_L = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids_B_L[i, : len(r)] = torch.tensor(r)
        mask_B_L[i, : len(r)] = 1
    logits_B_L_V = model(input_ids=ids_B_L.to(device), attention_mask=mask_B_L.to(device)).logits
    lengths = [len(cont) for _, cont in pairs]
    # each row's continuation positions, the rows one after another: N = sum of lengths
    logits_N_V = torch.cat(
        [
            logits_B_L_V[i, len(r) - n : len(r)]
            for i, (r, n) in enumerate(zip(rows, lengths, strict=True))
        ]
    )
    targets_N = torch.tensor([t for _, cont in pairs for t in cont], device=logits_N_V.device)
    logp_N = torch.log_softmax(logits_N_V.float(), dim=-1).gather(-1, targets_N[:, None])[:, 0]
    return [float(part.sum()) for part in logp_N.split(lengths)]


def choose(model, tok, task, problems: list[dict[str, Any]], *, batch_size: int = 16):
    """`problems` with `completions` = [the chosen choice's answer text] and `logliks` (one
    per choice), from `task.choice_prompt(problem)` -> (context, [(continuation, answer)])."""
    prompts = [task.choice_prompt(p) for p in problems]
    requests = [(ctx, cont) for ctx, options in prompts for cont, _ in options]
    scores = logliks(model, tok, requests, batch_size=batch_size)
    out, at = [], 0
    for p, (_, options) in zip(problems, prompts, strict=True):
        mine = scores[at : at + len(options)]
        at += len(options)
        best = max(range(len(options)), key=lambda i: mine[i])  # the first of equal scores
        out.append({**p, "completions": [options[best][1]], "logliks": mine})
    return out
