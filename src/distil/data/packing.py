"""Padding-free (packed) forwards: the sequences of a padded micro-batch run as packed rows.

A micro-batch stays padded everywhere else (labels, loss masks, sampling log-probs, teacher
targets, cross-tokenizer alignment positions): only the model's forward sees packed rows. The
sequences are placed into rows of at most `pack_length` tokens (best-fit decreasing), with
`position_ids` restarting at 0 for each sequence and no attention mask, and the output (logits or
hidden states) is scattered back to the padded (B, L, ...) layout. So every tensor that refers to
a padded position keeps referring to the same token, and the transformer body never computes on
padding (only the few tokens that fill the end of a row).

How transformers 5.x keeps packed sequences apart (masking_utils `_preprocess_mask_arguments`):
with `attention_mask=None`, `past_key_values=None` and `position_ids` given, it finds the
sequences from the position restarts (`diff(position_ids) != 1`) and builds a block-diagonal
causal mask (sdpa, eager, flex). The pitfall: the model's forward creates a `DynamicCache` when
`use_cache` is on (the config default, also in train mode), and then the detection is skipped and
the sequences of a row attend to each other, silently. `model_forward` is the one function that
runs every student and teacher forward of training and always passes `use_cache=False`.
Flash-attention kernels take the varlen path from `position_ids` only for a single row
(`_is_packed_sequence` requires batch size 1), so under flash attention the whole micro-batch
becomes one row.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch


def best_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Bins of sequence indices, each summing to at most `capacity` tokens (a sequence longer
    than `capacity` gets a bin of its own). Longest first, each into the fullest bin it fits."""
    bins: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        n = lengths[i]
        fits = [b for b in range(len(bins)) if free[b] >= n]
        if fits:
            b = min(fits, key=lambda b: free[b])
            bins[b].append(i)
            free[b] -= n
        else:
            bins.append([i])
            free.append(capacity - n)
    return bins


@dataclass
class PackPlan:
    """Where each real token of a padded (B, L) batch sits in the packed (R, P) rows.

    `padded_index_N` / `packed_index_N` are flat indices (b * L + t and r * P + p) of the same
    N real tokens; `position_ids_R_P` restart at 0 per sequence (row tails too, so the filler
    is a segment of its own that no real token sees).
    """

    rows: list[list[int]]
    shape_B_L: tuple[int, int]
    shape_R_P: tuple[int, int]
    padded_index_N: torch.Tensor
    packed_index_N: torch.Tensor
    position_ids_R_P: torch.Tensor


def plan_packing(lengths: list[int], width: int, pack_length: int | None) -> PackPlan:
    """Pack sequences of `lengths` (right-padded to `width`) into rows of <= `pack_length` tokens
    (None: one row holding everything, for flash-attention varlen)."""
    capacity = sum(lengths) if pack_length is None else pack_length
    rows = best_fit_decreasing(lengths, max(capacity, 1))
    p = max(max(sum(lengths[i] for i in row) for row in rows), 1)
    positions = torch.zeros((len(rows), p), dtype=torch.long)
    padded, packed = [], []
    for r, row in enumerate(rows):
        col = 0
        for i in row:
            n = lengths[i]
            positions[r, col : col + n] = torch.arange(n)
            padded.append(torch.arange(n) + i * width)
            packed.append(torch.arange(n) + r * p + col)
            col += n
        positions[r, col:] = torch.arange(p - col)
    return PackPlan(
        rows=rows,
        shape_B_L=(len(lengths), width),
        shape_R_P=(len(rows), p),
        padded_index_N=torch.cat(padded) if padded else torch.zeros(0, dtype=torch.long),
        packed_index_N=torch.cat(packed) if packed else torch.zeros(0, dtype=torch.long),
        position_ids_R_P=positions,
    )


def pack(x_B_L: torch.Tensor, plan: PackPlan, fill: int = 0) -> torch.Tensor:
    """(B, L, ...) -> (R, P, ...): real tokens moved to their packed places, `fill` elsewhere."""
    b, l_ = plan.shape_B_L
    r, p = plan.shape_R_P
    tail = x_B_L.shape[2:]
    flat = x_B_L.reshape(b * l_, *tail)
    out = flat.new_full((r * p, *tail), fill)
    out[plan.packed_index_N.to(flat.device)] = flat[plan.padded_index_N.to(flat.device)]
    return out.reshape(r, p, *tail)


def unpack(y_R_P: torch.Tensor, plan: PackPlan) -> torch.Tensor:
    """(R, P, ...) -> (B, L, ...): each token's output back at its padded place, 0 on padding.
    Differentiable (gradients flow to the packed output).

    One gather into the (B, L, ...) output and a fill of its padding rows: no zero-filled
    buffer and no gathered copy beside it (with a full head that is (B * L, V) each)."""
    b, l_ = plan.shape_B_L
    r, p = plan.shape_R_P
    tail = y_R_P.shape[2:]
    flat = y_R_P.reshape(r * p, *tail)
    source_BL = torch.zeros(b * l_, dtype=torch.long)  # padding reads packed row 0, then zeroed
    source_BL[plan.padded_index_N] = plan.packed_index_N
    padding_BL = torch.ones(b * l_, dtype=torch.bool)
    padding_BL[plan.padded_index_N] = False
    if flat.shape[0] == 0:
        return flat.new_zeros((b, l_, *tail))
    out = flat.index_select(0, source_BL.to(flat.device))
    out.masked_fill_(padding_BL.to(flat.device).reshape(-1, *([1] * len(tail))), 0)
    return out.reshape(b, l_, *tail)


@contextmanager
def head_bypassed(model: torch.nn.Module):
    """Temporarily replace the output embedding with identity and turn off what the forward
    applies after it (`models.logits.after_head_off`: Gemma 2's soft-cap, Cohere's and
    Granite's scales), so `model_forward` returns the head's input through the (possibly
    DDP-wrapped) module; yields the real head (the student's chunked loss applies it, then
    `models.logits.logits_rule(model).after_head`). Holds the module's lock
    (models/inuse.py): a generate call on another thread waits for it. A teacher, which needs
    no wrapper, reads its hidden states from its decoder instead (`model_forward(hidden=True)`):
    no swap, no lock."""
    from distil.models.inuse import module_lock
    from distil.models.logits import after_head_off

    with module_lock(model), after_head_off(model):
        head = model.get_output_embeddings()
        model.set_output_embeddings(torch.nn.Identity())
        try:
            yield head
        finally:
            model.set_output_embeddings(head)


def sequence_lengths(attention_mask_B_L: torch.Tensor) -> list[int]:
    """Lengths of right-padded rows; a mask that is not ones-then-zeros is refused (packing
    would otherwise move tokens away from the positions that the labels refer to)."""
    lengths = attention_mask_B_L.sum(dim=1)
    prefix = torch.arange(attention_mask_B_L.shape[1], device=attention_mask_B_L.device)
    expected = prefix.unsqueeze(0) < lengths.unsqueeze(1)
    if not torch.equal(attention_mask_B_L.bool(), expected):
        raise ValueError("packing needs right-padded rows (attention mask = ones, then zeros)")
    return lengths.tolist()


def attn_implementation(model) -> str:
    config = getattr(getattr(model, "module", model), "config", None)
    return str(getattr(config, "_attn_implementation", None) or "")


def model_forward(
    model,
    input_ids_B_L: torch.Tensor,
    attention_mask_B_L: torch.Tensor,
    *,
    packing: bool,
    pack_length: int | None = None,
    hidden: bool = False,
) -> torch.Tensor:
    """The model's `.logits` output (B, L, D) for a right-padded batch, run padded or packed.

    Every training forward goes through here so that the cache is always off: see the module
    docstring. `pack_length=None` packs into rows as long as the longest sequence (the padded
    width), so a packed row never costs more attention than a padded one. D is the vocabulary,
    or the hidden size when the head is replaced (`head_bypassed`). `hidden`: the final hidden
    states (H), from the model's decoder (`get_decoder()`: the body and its final norm, no head),
    with the module untouched, so nothing else waits for it (a teacher: `final_hidden`).
    """
    run = _decoder_call(model) if hidden else (lambda **kw: model(**kw).logits)
    if not packing:
        return run(input_ids=input_ids_B_L, attention_mask=attention_mask_B_L, use_cache=False)
    lengths = sequence_lengths(attention_mask_B_L)
    capacity = max(lengths) if pack_length is None else max(pack_length, max(lengths))
    if attn_implementation(model).startswith("flash"):
        capacity = None  # varlen kernels: one row, boundaries from position_ids
    plan = plan_packing(lengths, input_ids_B_L.shape[1], capacity)
    ids_R_P = pack(input_ids_B_L, plan)
    out = run(
        input_ids=ids_R_P,
        position_ids=plan.position_ids_R_P.to(ids_R_P.device),
        attention_mask=None,  # a mask (even all ones) turns the packed-sequence detection off
        use_cache=False,  # a cache turns it off too: sequences would attend across each other
    )
    return unpack(out, plan)


def _decoder_call(model):
    """A call of `model`'s decoder returning its last hidden state (after the final norm)."""
    decoder = model.get_decoder()
    return lambda **kw: decoder(**kw).last_hidden_state
