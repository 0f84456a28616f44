"""The memory terms of a plan: each a small formula over sizes, in bytes.

Hand-checkable on purpose (tests/unit/test_plan_terms.py works each one out by hand):

    weights       params x bytes(dtype) / shards
    AdamW states  trainable x 2 moments x bytes(state dtype) / shards  (8 B a param in fp32)
    KV cache      2 (K and V) x layers x kv_heads x head_dim x rows x tokens x bytes
    logits chunk  rows x vocabulary x 4 (fp32) x the copies alive at once (JSD: 12)

The copy counts below say how many arrays of a chunk's size one step holds at once; they were
counted from the code (named per constant) and checked against measured peaks on CPU
(tests/unit/test_plan_measured.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distil.plan.shapes import ModelShape

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# fp32 arrays of a loss chunk's size alive at once, measured on CPU (RSS high-water above the
# baseline, 151,936-token vocabulary, one chunk and several): the student's logits, their
# log-softmax and softmax, the teacher rows' upcast and exp, the mixture and its logs, and in
# backward the logits' gradient: JSD (mixture) 12, one KL 9, ULD 4, cross-entropy alone 4 (unknown
# losses get JSD's count); several chunks (checkpointed) add the recompute's 2 in backward.
LOSS_CHUNK_COPIES = {"jsd": 12, "forward_kl": 9, "reverse_kl": 9, "sft": 4, "uld": 4}
LOSS_CHUNK_DEFAULT, RECOMPUTE_COPIES = 12, 2
# teacher scoring chunk (the head applied to the chunk's loss rows): the fp32 logits and their
# log-softmax
TEACHER_CHUNK_COPIES = 2
# generation: the last position's logits, the warped copy and the probabilities (fp32)
GEN_LOGITS_COPIES = 3
# an inference forward holds about one layer's activations at a time: the residual stream,
# the attention input and output, and the MLP's gate, up and product
INFER_HIDDEN_COPIES, INFER_MLP_COPIES = 4, 3


def nbytes(dtype: str) -> int:
    return BYTES[dtype]


def torch_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def weights(params: int, dtype_bytes: int, shards: int = 1) -> int:
    """Parameters held on one device (FSDP: one shard of them)."""
    return -(-params * dtype_bytes // shards)


def adam_states(trainable: int, state_bytes: int, shards: int = 1) -> int:
    """AdamW's two moments (exp_avg, exp_avg_sq), in the dtype of what it steps."""
    return -(-2 * trainable * state_bytes // shards)


def kv_cache(shape: ModelShape, rows: int, tokens: int, dtype_bytes: int) -> int:
    """Keys and values of every layer for `rows` sequences of `tokens` positions."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * rows * tokens * dtype_bytes


def logits_chunk(rows: int, vocab: int, copies: int) -> int:
    """`copies` fp32 arrays of `rows` x `vocab` (a loss or scoring chunk)."""
    return rows * vocab * 4 * copies


def activations(shape: ModelShape, tokens: int, act_bytes: int, *, checkpointing: bool) -> int:
    """What the student's forward keeps for backward over `tokens` positions: every layer's
    saved tensors, or with gradient checkpointing each layer's input plus one layer's saved
    tensors (recomputed during backward); plus the final norm's input, output and statistics."""
    per_layer = shape.act_per_token_layer * tokens * act_bytes
    if checkpointing:
        body = shape.layers * shape.hidden * tokens * act_bytes + per_layer
    else:
        body = shape.layers * per_layer
    return int(body + 3 * shape.hidden * tokens * act_bytes)


def inference_forward(shape: ModelShape, tokens: int, act_bytes: int) -> int:
    """The transient peak of a forward without autograd (teacher scoring, prefill)."""
    width = INFER_HIDDEN_COPIES * shape.hidden + INFER_MLP_COPIES * shape.intermediate
    return tokens * width * act_bytes


@dataclass(frozen=True)
class Term:
    """One part of a phase's peak on one device."""

    name: str
    bytes: int
    note: str = ""

    def as_dict(self) -> dict:
        return {"name": self.name, "bytes": int(self.bytes), "note": self.note}
