"""Cross-tokenizer losses over `AlignmentGroups`: the plumbing they share, and `aligned_kl`.

The student's logits are in student positions, the teacher's full log-probs in teacher
positions; `AlignmentGroups` (built by `distil.align`) ties runs of each that spell the same
bytes. Shared here:
- `keep_groups`: the groups whose student positions all lie inside mask_B_T;
- `run_positions`: the student's log-probs at chosen (row, position) pairs, fp32, in chunks of
  `chunk_size` rows, each checkpointed when there are several (as `chunked.run_rowwise`), so
  the full-vocabulary fp32 logits of all positions never exist at once;
- `finish`: sum / num_tokens (`reduce.token_sum_over`) and the metrics every loss reports.

`aligned_kl` (NeMo RL's cross-tokenizer P-KL idea made exact up to tokenization ambiguity):
each projection entry n pairs a student position with the teacher position predicting the same
bytes; the teacher's distribution there becomes pi_n over student tokens through the
entry's sparse table (`distil.align.project.project_rows`, all tables of a chunk at once), and
    loss_n = JSD_β(S_n ‖ pi_n) over [support of pi_n, rest]
with the student's rest = 1 - sum_support S_n and the teacher's rest = its share on teacher
tokens after which the student's next token is ambiguous (floored as in topk.py, so reverse KL
stays finite). Unlike NeMo RL it projects the teacher (not the student), compares
per position (no chunk averaging of probabilities vs log-probs) and needs no global top-k.

Metrics of every cross-tokenizer loss (sums over this micro-batch, see `distil.losses`):
  logratio_sum         sum_g log S(g) - log T(g) of the realized chunks (log-probability of
                       each group's bytes under each model). Not a divergence by itself: on
                       the student's own samples it estimates the sequence-level KL(S‖T); on
                       teacher-written or dataset text it estimates -KL(T‖S) and is often
                       negative. `sampled_chunk_reverse_kl`, whose loss is this estimate on
                       on-policy rows, also reports it as kl_sum.
  student_logprob_sum  sum_g log S(g); teacher_logprob_sum: sum_g log T(g)
  student_entropy_sum  entropy of the student's tempered distribution at each group position
  tokens_count         mask_B_T.sum(); groups_count: groups used (all student positions in mask)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch.utils.checkpoint import checkpoint

from distil.align.project import PaddedProjection, group_logprob, pad_projection
from distil.errors import ConfigError
from distil.losses.boundary import boundary_tables, entry_targets, stop_logprob
from distil.losses.chunked import (
    StudentHidden,
    check_temperatures,
    chunk_head,
    student_parts,
    upcast,
)
from distil.losses.divergences import divergence_rows, entropy_rows, gather_rows, log1mexp
from distil.losses.reduce import token_sum_over
from distil.losses.registry import register
from distil.losses.topk import REST_LOGPROB_FLOOR, safe_logsumexp
from distil.types import AlignmentGroups, LossOutput, TeacherTargets

# fn(s_n_V, *extras_n) -> (values_n, {metric: detached values_n}); s = log_softmax(logits / τ)
PositionsFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]


def check_inputs(name, targets, alignment, temperature, targets_temperature, beta=0.5):
    """Errors a caller can cause: no alignment, sparse targets, bad temperatures or beta."""
    check_temperatures(temperature, targets_temperature)
    if alignment is None:
        raise ValueError(
            f"loss {name!r} compares two tokenizers and needs alignment=AlignmentGroups (the "
            "batch's `alignment`, built by distil.align); none was given"
        )
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1] (0: forward KL, 1: reverse KL), got {beta}")
    if name == "sampled_chunk_reverse_kl":
        return
    if targets.is_sparse or targets.logprobs_B_T_V is None:
        raise ConfigError(
            f"loss {name!r} needs the teacher's full log-probs over its own vocabulary; sparse "
            "(top-k + rest) or token-only teacher targets are not supported for cross-tokenizer "
            "losses (merging and projection read every teacher token). Fix: score the teacher "
            "with teacher.top_k=null, or use loss 'sampled_chunk_reverse_kl'"
        )


@dataclass
class Kept:
    """The groups a loss uses, as in `AlignmentGroups` (-1 padded, left-packed)."""

    row_G: torch.Tensor
    student_pos_G_S: torch.Tensor
    student_tok_G_S: torch.Tensor
    teacher_pos_G_T: torch.Tensor
    teacher_tok_G_T: torch.Tensor
    match_table_G: torch.Tensor
    exact_G: torch.Tensor | None = None
    prev_tok_G: torch.Tensor | None = None  # `AlignmentGroups.group_prev_tok_G`
    prev_table_G: torch.Tensor | None = None

    @property
    def num(self) -> int:
        return int(self.row_G.shape[0])

    def student_entries(self, *, drop_last: bool = False):
        """(group_N, row_N, pos_N, tok_N) of every student entry (without each group's last)."""
        pos = self.student_pos_G_S
        valid = pos >= 0
        if drop_last:
            size = valid.sum(1, keepdim=True)
            valid = valid & (torch.arange(pos.shape[1], device=pos.device)[None] < size - 1)
        group_G_S = torch.arange(self.num, device=pos.device)[:, None].expand_as(pos)
        group_N = group_G_S[valid]
        return group_N, self.row_G[group_N], pos[valid], self.student_tok_G_S[valid].long()


def keep_groups(alignment: AlignmentGroups, mask_B_T: torch.Tensor) -> Kept:
    """Groups with both sides non-empty whose student positions all lie inside mask_B_T.

    The loop's mask holds exactly the student positions of valid groups; a group it cuts (say a
    truncated completion) is dropped whole rather than compared on part of its bytes.
    """
    a, mask = alignment, mask_B_T.bool()
    pos = a.student_pos_G_S
    valid = pos >= 0
    rows = a.group_row_G[:, None].expand_as(pos)
    inside = torch.where(valid, mask[rows, pos.clamp_min(0)], True)
    keep = inside.all(1) & valid.any(1) & (a.teacher_pos_G_T >= 0).any(1)
    return Kept(
        a.group_row_G[keep],
        pos[keep],
        a.student_tok_G_S[keep],
        a.teacher_pos_G_T[keep],
        a.teacher_tok_G_T[keep],
        a.match_table_G[keep],
        None if a.exact_G is None else a.exact_G[keep],
        None if a.group_prev_tok_G is None else a.group_prev_tok_G[keep],
        None if a.group_prev_table_G is None else a.group_prev_table_G[keep],
    )


def _select(student, row_N: torch.Tensor, pos_N: torch.Tensor, mask_B_T: torch.Tensor):
    hidden, weight, bias, after = student_parts(student, mask_B_T)
    return hidden[row_N, pos_N], weight, bias, after


def _chunk_forward(fn, temperature, ce_weight, head, x_n, labels_n, *extras):
    logits_n_V = upcast(head(x_n))
    s_n_V = torch.log_softmax(logits_n_V / temperature if temperature != 1.0 else logits_n_V, -1)
    values_n, metrics = fn(s_n_V, *extras)
    metrics = {**metrics, "student_entropy": entropy_rows(s_n_V.detach())}
    ce_n = None
    if ce_weight:  # cross-entropy of the data's tokens at temperature 1: -log S(x)
        ce_n = -gather_rows(torch.log_softmax(logits_n_V, -1), labels_n)
        metrics["ce"] = ce_n.detach()
    return values_n, metrics, ce_n


def run_positions(
    student: torch.Tensor | StudentHidden,
    row_N: torch.Tensor,
    pos_N: torch.Tensor,
    fn: PositionsFn,
    mask_B_T: torch.Tensor,
    *,
    extras: tuple[torch.Tensor, ...] = (),
    labels_N: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    ce_weight: float = 0.0,
):
    """fn over the student's log-probs at (row_N, pos_N), chunk by chunk: (values_N, metrics_N, ce_N).

    s_n_V = log_softmax(logits / τ) in fp32 for one chunk of `chunk_size` positions at a time
    (logits from hidden states through the head for a `StudentHidden`); `extras` are sliced
    alongside. With several chunks each runs under a non-reentrant checkpoint. Per-row metrics
    (plus `student_entropy`, and `ce` when ce_weight > 0) are concatenated, not summed; ce_N is
    -log S(labels_N) at temperature 1 with its graph (None when ce_weight is 0). No positions
    still run one empty chunk, so the outputs stay connected to the student.
    """
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive number of rows or None, got {chunk_size}")
    x_N, weight, bias, after = _select(student, row_N, pos_N, mask_B_T)
    n = x_N.shape[0]
    step = max(n if chunk_size is None else min(chunk_size, n), 1)
    forward = partial(
        _chunk_forward, fn, temperature, ce_weight, chunk_head(weight, bias, x_N, step, after)
    )
    parts = []
    for start in range(0, max(n, 1), step):
        sl = slice(start, start + step)
        labels_n = None if labels_N is None else labels_N[sl]
        args = (x_N[sl], labels_n, *(e[sl] for e in extras))
        if step < n:  # several chunks: recompute each in backward instead of storing (n, V)
            parts.append(checkpoint(forward, *args, use_reentrant=False))
        else:
            parts.append(forward(*args))
    values_N = torch.cat([p[0] for p in parts])
    metrics_N = {k: torch.cat([p[1][k] for p in parts]) for k in parts[0][1]}
    ce_N = torch.cat([p[2] for p in parts]) if ce_weight else None
    return values_N, metrics_N, ce_N


def realized_rows(s_n_V: torch.Tensor, tok_n: torch.Tensor):
    """PositionsFn: log S(x) of the realized token at each position (with its graph)."""
    return gather_rows(s_n_V, tok_n), {}


@torch.no_grad()
def teacher_group_logprob(targets: TeacherTargets, kept: Kept, ratio: float, chunk_size=None):
    """(G,) log T(g) at the loss temperature: token log-probs if they serve, else full rows."""
    pos, row = kept.teacher_pos_G_T, kept.row_G
    token_lp = targets.token_logprobs_B_T
    if token_lp is not None and (ratio == 1.0 or targets.logprobs_B_T_V is None):
        lp = token_lp[row[:, None].expand_as(pos), pos.clamp_min(0)]
        return torch.where(pos >= 0, upcast(lp), 0.0).sum(1)
    step = max(kept.num if chunk_size is None else chunk_size, 1)
    parts = [
        group_logprob(
            targets.logprobs_B_T_V,
            row[s : s + step],
            pos[s : s + step],
            kept.teacher_tok_G_T[s : s + step],
            ratio=ratio,
        )
        for s in range(0, kept.num, step)
    ]
    return torch.cat(parts) if parts else torch.zeros(0, device=pos.device)


def finish(total, num_tokens, row_metrics: list[dict], mask_B_T, kept: Kept, **sums) -> LossOutput:
    """LossOutput(total / num_tokens, metrics): `<name>_sum` of the per-row metrics and `sums`."""
    metrics: dict[str, torch.Tensor] = {}
    for part in row_metrics:
        for name, values in part.items():
            key = f"{name}_sum"
            metrics[key] = metrics.get(key, 0.0) + values.detach().sum().to(total.dtype)
    metrics.update({k: v.detach().to(total.dtype) for k, v in sums.items()})
    metrics["logratio_sum"] = metrics["student_logprob_sum"] - metrics["teacher_logprob_sum"]
    metrics["loss_sum"] = total.detach()
    metrics["tokens_count"] = mask_B_T.bool().sum().to(total.dtype)
    metrics["groups_count"] = total.new_tensor(float(kept.num))
    return LossOutput(loss=token_sum_over(total, num_tokens), metrics=metrics)


# ----------------------------------------------------------------------------- aligned_kl


@dataclass
class Entries:
    """The projection entries a loss uses; tok_N: the realized student token; prev_tok_N /
    prev_table_N: the boundary mix of each entry (`AlignmentGroups.proj_prev_tok_N`)."""

    row_N: torch.Tensor
    student_pos_N: torch.Tensor
    teacher_pos_N: torch.Tensor
    table_N: torch.Tensor
    tok_N: torch.Tensor
    prev_tok_N: torch.Tensor | None = None
    prev_table_N: torch.Tensor | None = None


def kept_entries(alignment: AlignmentGroups, kept: Kept, shape_B_T) -> Entries:
    """The projection entries at student positions of kept groups."""
    _, row, pos, tok = kept.student_entries()
    tok_B_T = torch.full(tuple(shape_B_T), -1, dtype=torch.long, device=row.device)
    tok_B_T[row, pos] = tok
    a = alignment
    tok_N = tok_B_T[a.proj_row_N, a.proj_student_pos_N.clamp_min(0)]
    keep = (tok_N >= 0) & (a.proj_student_pos_N >= 0) & (a.proj_teacher_pos_N >= 0)
    pick = torch.nonzero(keep).squeeze(1)
    prev = a.proj_prev_table_N is not None and a.proj_prev_tok_N is not None
    return Entries(
        a.proj_row_N[pick],
        a.proj_student_pos_N[pick],
        a.proj_teacher_pos_N[pick],
        a.proj_table_N[pick],
        tok_N[pick],
        a.proj_prev_tok_N[pick] if prev else None,
        a.proj_prev_table_N[pick] if prev else None,
    )


def _entry_rows(
    teacher_B_T_V, entries: Entries, padded: PaddedProjection, before, ratio, beta, s_n_V, index_n
):
    """JSD_β over [support of pi, rest] for every entry of a chunk, all tables at once."""
    e = entries
    prev = None if e.prev_table_N is None else (e.prev_tok_N[index_n], e.prev_table_N[index_n])
    ids, valid, log_pi, log_rest, log_mass, cont = entry_targets(
        teacher_B_T_V, e.row_N[index_n], e.teacher_pos_N[index_n], e.table_N[index_n], prev,
        padded, ratio, before,
    )  # fmt: skip
    s_sup = torch.where(valid, s_n_V.gather(1, ids), float("-inf"))
    # the student's rest: its mass outside the row's support (a logsumexp over the complement)
    on_support = torch.zeros_like(s_n_V, dtype=torch.int32).scatter_add(1, ids, valid.int()) > 0
    s_rest = safe_logsumexp(s_n_V.masked_fill(on_support, float("-inf")))
    s_C = torch.cat([s_sup, s_rest.clamp_min(REST_LOGPROB_FLOOR)[:, None]], dim=1)
    # the teacher's rest: its share on tokens after which the student's next token is ambiguous
    t_rest = log_rest.clamp(min=REST_LOGPROB_FLOOR)[:, None]
    t_C = torch.cat([log_pi.to(s_C.dtype), t_rest.to(s_C.dtype)], dim=1)
    ok = torch.isfinite(log_mass)  # no teacher mass on the table: nothing to learn
    t_C = torch.where(ok[:, None], t_C, s_C.detach())  # finite stand-in, then zeroed below
    loss_n = torch.where(ok, divergence_rows("jsd", s_C, t_C, beta), 0.0)
    metrics = {
        "student_logprob": gather_rows(s_n_V.detach(), entries.tok_N[index_n]),
        "proj_mass": torch.where(ok, log_mass.exp(), 0.0).to(s_n_V.dtype),
        "proj_skipped": (~ok).to(s_n_V.dtype),
        # each side's mass on the rest bucket (the student's: tokens pi does not name)
        "student_rest": torch.where(ok, s_rest.detach().exp(), 0.0).to(s_n_V.dtype),
        "teacher_rest": torch.where(ok, log_rest.exp(), 0.0).to(s_n_V.dtype),
        # at a token boundary, the teacher's odds of having gone on with a longer token
        "proj_continue": torch.where(ok, cont, 0.0).to(s_n_V.dtype),
    }
    return loss_n, metrics


def _binary_rows(beta: float, s_n_V, tok_n, teacher_lp_n):
    """PositionsFn: JSD_β between [S(x), 1 - S(x)] and [T(x), 1 - T(x)] for a realized token."""
    s_lp = gather_rows(s_n_V, tok_n)
    s_C = torch.stack([s_lp, log1mexp(s_lp, floor=REST_LOGPROB_FLOOR)], dim=1)
    t_lp = teacher_lp_n.to(s_C.dtype)
    t_C = torch.stack([t_lp, log1mexp(t_lp, floor=REST_LOGPROB_FLOOR)], dim=1)
    return divergence_rows("jsd", s_C, t_C, beta), {"student_logprob": s_lp.detach()}


def coarse_groups(kept: Kept) -> torch.Tensor:
    """Groups whose single student token spans several teacher tokens (bool, G).

    No teacher position gives a distribution over such a token, but the teacher's probability
    of its bytes is exact by the chain rule over the group's teacher tokens; these groups are
    compared as [the token, anything else] on both sides (the binary case of Minixhofer et al.'s
    approximate likelihood matching).
    """
    s_size = (kept.student_pos_G_S >= 0).sum(1)
    t_size = (kept.teacher_pos_G_T >= 0).sum(1)
    coarse = (s_size == 1) & (t_size > 1)
    return coarse if kept.exact_G is None else coarse & kept.exact_G


@register("aligned_kl")
def aligned_kl(
    student: torch.Tensor | StudentHidden,
    targets: TeacherTargets,
    mask_B_T: torch.Tensor,
    *,
    num_tokens,
    alignment: AlignmentGroups | None = None,
    temperature: float = 1.0,
    targets_temperature: float = 1.0,
    beta: float = 0.5,
    chunk_size: int | None = None,
    ce_weight: float = 0.0,
    **unused,
) -> LossOutput:
    """Aligned-chunk JSD(β) through a sparse projection of the teacher onto student tokens.

    Per projection entry: JSD_β(S ‖ pi) over pi's support + a rest bucket; per student token
    spanning several teacher tokens (see `coarse_groups`): JSD_β over [token, rest] with the
    teacher's chain-rule probability; both, at a token boundary, also read the teacher's odds
    of having ended the token before there (`distil.losses.boundary`); sum / num_tokens. Extra
    metrics: proj_mass_sum (teacher mass each table covers), student_rest_sum and
    teacher_rest_sum (each side's mass on the rest bucket), proj_skipped_count (entries whose
    table the teacher gives no mass; they add 0), proj_continue_sum (at a boundary, the
    teacher's odds of having gone on), coarse_count.
    """
    check_inputs("aligned_kl", targets, alignment, temperature, targets_temperature, beta)
    kept = keep_groups(alignment, mask_B_T)
    entries = kept_entries(alignment, kept, mask_B_T.shape)
    ratio = targets_temperature / temperature
    padded, before = pad_projection(alignment.proj_tables), boundary_tables(alignment)
    fn = partial(_entry_rows, targets.logprobs_B_T_V, entries, padded, before, ratio, float(beta))
    index_N = torch.arange(entries.row_N.shape[0], device=entries.row_N.device)
    loss_N, metrics_N, ce_N = run_positions(
        student,
        entries.row_N,
        entries.student_pos_N,
        fn,
        mask_B_T,
        extras=(index_N,),
        labels_N=entries.tok_N,
        temperature=temperature,
        chunk_size=chunk_size,
        ce_weight=ce_weight,
    )
    total = loss_N.sum() + (ce_weight * ce_N.sum() if ce_N is not None else 0.0)
    teacher_G = teacher_group_logprob(targets, kept, ratio, chunk_size)
    has_entry = torch.zeros(mask_B_T.shape, dtype=torch.bool, device=mask_B_T.device)
    has_entry[entries.row_N, entries.student_pos_N] = True
    coarse = coarse_groups(kept) & ~has_entry[kept.row_G, kept.student_pos_G_S[:, 0].clamp_min(0)]
    # a coarse group right after a teacher token: the teacher's odds of having ended it there
    coarse_prev = None
    if kept.prev_table_G is not None:
        coarse_prev = (kept.prev_tok_G[coarse], kept.prev_table_G[coarse])
    stop = stop_logprob(
        targets.logprobs_B_T_V, kept.row_G[coarse], kept.teacher_pos_G_T[coarse, 0], coarse_prev,
        padded, ratio, before,
    )  # fmt: skip
    binary_N, binary_metrics, _ = run_positions(
        student,
        kept.row_G[coarse],
        kept.student_pos_G_S[coarse, 0],
        partial(_binary_rows, float(beta)),
        mask_B_T,
        extras=(kept.student_tok_G_S[coarse, 0].long(), teacher_G[coarse] + stop),
        temperature=temperature,
        chunk_size=chunk_size,
    )
    total = total + binary_N.sum()
    skipped = metrics_N.pop("proj_skipped").sum()
    return finish(
        total,
        num_tokens,
        [metrics_N, binary_metrics],
        mask_B_T,
        kept,
        teacher_logprob_sum=teacher_G.sum(),
        proj_skipped_count=skipped,
        coarse_count=coarse.sum(),
    )
