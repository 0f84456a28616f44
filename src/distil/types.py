"""The data that flows between distil's parts in one optimizer step: examples, rollouts,
samples, batches, teacher targets, cross-tokenizer alignments and loss outputs.

Shape suffixes: B batch rows, T positions, V vocabulary, K top-k entries, C completion tokens,
P prompt tokens, L whole sequence. `T_s`/`T_t`, `V_s`/`V_t` name the student's and the teacher's
sides where the two meet. Every position-indexed tensor of a loss is already *shifted*: position t
holds the distribution that predicts token t+1 of the sequence.

torch is imported where a method needs it, not with the module: the data and task modules that
read these types (`distil countdown generate`, `distil tokenizer train`) start without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

Messages = list[dict[str, str]]


@dataclass
class Example:
    """One prompt of the dataset, before tokenization.

    `completion` is the dataset's reference answer (used by off-policy slices); `meta` carries
    task fields such as Countdown's `nums` and `target`.
    """

    id: int
    prompt: Messages
    completion: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Rollout:
    """Completions for a list of prompts, `n` per prompt (rows of one prompt are adjacent).

    completion_ids_B_C are right-padded with the pad id; completion_mask_B_C is True up to and
    including the first EOS; logprobs_B_C are the log-probs of the chosen tokens under the
    distribution they were sampled from (after temperature/top-k/top-p), 0 where masked.
    """

    prompt_index: list[int]
    completion_ids_B_C: torch.Tensor
    completion_mask_B_C: torch.Tensor
    logprobs_B_C: torch.Tensor | None = None
    stopped_B: torch.Tensor | None = None  # True where the completion ended with a stop token

    def __len__(self) -> int:
        return len(self.prompt_index)

    def completion_lists(self) -> list[list[int]]:
        """Each row's completion ids with padding removed (EOS kept)."""
        return [
            ids[mask].tolist()
            for ids, mask in zip(self.completion_ids_B_C, self.completion_mask_B_C, strict=True)
        ]


@dataclass
class TeacherTargets:
    """What the teacher says about each (shifted) student position.

    Either full log-probs (`logprobs_B_T_V`) or sparse: the top-k ids and log-probs plus the
    log of the remaining mass `rest_logprob_B_T = log(1 - sum(exp(topk_logprobs)))`. Log-softmax
    is taken over the full vocabulary *before* top-k, so the K entries are true log-probs.
    `token_logprobs_B_T` is the teacher's log-prob of the realized next token, enough for the
    sampled-token (policy-gradient) loss.
    """

    logprobs_B_T_V: torch.Tensor | None = None
    topk_ids_B_T_K: torch.Tensor | None = None
    topk_logprobs_B_T_K: torch.Tensor | None = None
    rest_logprob_B_T: torch.Tensor | None = None
    token_logprobs_B_T: torch.Tensor | None = None

    @property
    def is_sparse(self) -> bool:
        return self.topk_ids_B_T_K is not None

    def to(self, device: torch.device | str) -> TeacherTargets:
        import torch

        moved = {
            f.name: (v.to(device) if isinstance(v, torch.Tensor) else v)
            for f in fields(self)
            if (v := getattr(self, f.name)) is not None
        }
        return replace(self, **moved)


@dataclass
class GroupSpans:
    """The padded group tensors of `AlignmentGroups` in compact form, as the aligner builds them.

    Group g (of batch row r = group_row_G[g]) has the student tokens
    `student_ids_R_L[student_idrow_B[r], student_first_G[g] : + student_len_G[g]]`, predicted at
    positions `student_first_G[g] + i + student_shift_B[r]`; the same for the teacher. The ids
    are the collator's padded input ids (row r of the batch is row r of them, shift -1), or the
    batch's completions concatenated into one row. A micro-batch moved to the GPU moves these
    (G ints per field and the ids) and is padded there: the padded tensors are
    (2 * S_max + 2 * T_max) ints per group, several times more to write and to copy.
    `expand_cpu` is the compiled CPU expansion `padded` runs on the CPU, handed in by
    `distil.align` (a module-level function, so the spans pickle); without it the tensor ops
    run there too.
    """

    student_first_G: torch.Tensor
    student_len_G: torch.Tensor
    student_ids_R_L: torch.Tensor
    student_idrow_B: torch.Tensor
    student_shift_B: torch.Tensor
    teacher_first_G: torch.Tensor
    teacher_len_G: torch.Tensor
    teacher_ids_R_L: torch.Tensor
    teacher_idrow_B: torch.Tensor
    teacher_shift_B: torch.Tensor
    expand_cpu: Callable[[GroupSpans, torch.Tensor], tuple[torch.Tensor, ...]] | None = field(
        default=None, repr=False
    )

    def to(self, device: torch.device | str) -> GroupSpans:
        moved = {f.name: getattr(self, f.name).to(device) for f in fields(self)[:-1]}
        return replace(self, **moved)

    def padded(self, row_G: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(student_pos_G_S, student_tok_G_S, teacher_pos_G_T, teacher_tok_G_T), padded with -1
        (widths >= 1): compiled loops on the CPU, a few tensor ops on any other device."""
        if self.expand_cpu is not None and self.student_ids_R_L.device.type == "cpu":
            return self.expand_cpu(self, row_G)
        return self.padded_by_tensor_ops(row_G)

    def padded_by_tensor_ops(self, row_G: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """`padded` with tensor ops on the spans' device (one sync per side for the width)."""
        s = _pad_side(row_G, self.student_first_G, self.student_len_G, self.student_ids_R_L,
                      self.student_idrow_B, self.student_shift_B)  # fmt: skip
        t = _pad_side(row_G, self.teacher_first_G, self.teacher_len_G, self.teacher_ids_R_L,
                      self.teacher_idrow_B, self.teacher_shift_B)  # fmt: skip
        return (*s, *t)


def _pad_side(row_G, first_G, len_G, ids_R_L, idrow_B, shift_B) -> tuple[torch.Tensor, ...]:
    # one side's (G, W) positions and ids with tensor ops (the width: one sync)
    import torch

    width = max(int(len_G.max()), 1) if len(len_G) else 1
    at = torch.arange(width, device=len_G.device)
    valid = at < len_G[:, None]
    col = first_G[:, None] + at
    pos = torch.where(valid, col + shift_B[row_G][:, None], -1)
    if ids_R_L.numel() == 0:
        return pos, torch.full_like(col, -1)
    tok = ids_R_L[idrow_B[row_G][:, None], col.clamp(max=ids_R_L.shape[1] - 1)]
    return pos, torch.where(valid, tok.long(), -1)


class _Padded:
    """An `AlignmentGroups` padded tensor: the one given, or expanded from `spans` on first read
    (on the spans' device). Raises AttributeError on the class, so that the dataclass sees a
    field without a default."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, obj: Any, owner: type | None = None) -> torch.Tensor:
        if obj is None:
            raise AttributeError(self.slot[1:])
        if obj.__dict__[self.slot] is None:
            obj._expand()
        return obj.__dict__[self.slot]

    def __set__(self, obj: Any, value: torch.Tensor | None) -> None:
        obj.__dict__[self.slot] = value


_PADDED = ("student_pos_G_S", "student_tok_G_S", "teacher_pos_G_T", "teacher_tok_G_T")


@dataclass
class AlignmentGroups:
    """How a cross-tokenizer micro-batch's student and teacher tokens cover the same bytes.

    Built once per batch in `distil.align` (outside the loss). All positions are *predicting*
    positions in each model's shifted logits (input index - 1), so `student_pos_G_S[g]` are the
    student logit rows that predict the group's student tokens `student_tok_G_S[g]`, in order.

    Groups (G of them, over all rows) pair a run of student tokens with a run of teacher tokens
    that spell the same completion bytes; padding is -1.
      group_row_G            row of each group
      student_pos_G_S/_tok   student predicting positions / realized ids (G, S_max)
      teacher_pos_G_T/_tok   teacher predicting positions / realized ids (G, T_max)
      match_table_G          index into `match_tables`: candidates at the groups' last
                             positions that spell the same bytes on both sides (0 = the
                             whole-vocabulary byte map, for groups whose last tokens start at
                             the same byte)
      match_tables           [(student_ids_P, teacher_ids_P)] pairs of matched candidates
    Projection entries (N of them, one per student position inside a group) give, for each
    student position, the teacher position whose distribution predicts it and the sparse map
    turning that teacher distribution into one over the student's next token:
      proj_row_N, proj_student_pos_N, proj_teacher_pos_N, proj_table_N
      proj_tables            [(teacher_ids_K, student_ids_K)]: teacher token -> the student
                             token that would come next if the teacher emitted it
    A student token longer than the teacher token that predicts its first byte (say the
    student's single token '<answer>' against the teacher's '<', 'answer', '>') has no
    projection entry: no teacher position gives a distribution over it. `exact_G` marks groups
    whose bytes are equal on both sides (False only after the DP fallback).
    `metrics` holds counts (groups, aligned bytes, bytes matched exactly, DP fallbacks,
    unalignable tokens masked).
    `distil.align` gives the four padded tensors as None and their compact form in `spans`
    (`GroupSpans`); each is expanded on first read, on the device the alignment is on, so a
    batch moved to the GPU is padded there.
    """

    group_row_G: torch.Tensor
    student_pos_G_S: torch.Tensor = _Padded()  # type: ignore[assignment]
    student_tok_G_S: torch.Tensor = _Padded()  # type: ignore[assignment]
    teacher_pos_G_T: torch.Tensor = _Padded()  # type: ignore[assignment]
    teacher_tok_G_T: torch.Tensor = _Padded()  # type: ignore[assignment]
    match_table_G: torch.Tensor
    match_tables: list[tuple[torch.Tensor, torch.Tensor]]
    proj_row_N: torch.Tensor
    proj_student_pos_N: torch.Tensor
    proj_teacher_pos_N: torch.Tensor
    proj_table_N: torch.Tensor
    proj_tables: list[tuple[torch.Tensor, torch.Tensor]]
    exact_G: torch.Tensor | None = None  # bool: the group spells the same bytes on both sides
    metrics: dict[str, float] = field(default_factory=dict)
    spans: GroupSpans | None = None  # the padded tensors' compact form, when they are None
    # per projection entry on table 0 after a teacher completion token t (`align.batch.
    # _boundaries`): t's id and the index into `proj_tables` of the teacher's other ways to go
    # on from bytes(t) (t itself its ambiguous share); -1 where none. None: no entry has one
    proj_prev_tok_N: torch.Tensor | None = None
    proj_prev_table_N: torch.Tensor | None = None
    # the same for each group's first teacher token (aligned_kl reads it for the groups whose
    # one student token spans several teacher tokens, which have no projection entry)
    group_prev_tok_G: torch.Tensor | None = None
    group_prev_table_G: torch.Tensor | None = None

    @property
    def num_groups(self) -> int:
        return int(self.group_row_G.shape[0])

    def _expand(self) -> None:
        if self.spans is None:
            raise ValueError("AlignmentGroups: a padded tensor is None and there are no spans")
        for name, value in zip(_PADDED, self.spans.padded(self.group_row_G), strict=True):
            if self.__dict__["_" + name] is None:
                setattr(self, name, value)

    def to(self, device: torch.device | str) -> AlignmentGroups:
        import torch

        def move(v):
            if isinstance(v, (torch.Tensor, GroupSpans)):
                return v.to(device)
            if isinstance(v, list):
                return [tuple(x.to(device) for x in pair) for pair in v]
            return v

        def stored(name: str):  # a padded tensor not expanded yet stays None (expanded on device)
            return self.__dict__["_" + name] if name in _PADDED else getattr(self, name)

        return AlignmentGroups(**{f.name: move(stored(f.name)) for f in fields(self)})


@dataclass
class LossOutput:
    """A loss value (already divided by the window's token count) and detached metrics.

    Metrics are per-token *sums* over this micro-batch's loss tokens unless their name ends in
    `_count`; the loop adds them over the window and divides once (no `.item()` in a loss).
    """

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class Sample:
    """One training sequence before collation: prompt ids + completion ids (student tokens).

    `source` is "on_policy" (the student sampled it), "off_policy" (the dataset's completion)
    or "seq_kd" (the teacher wrote it). `completion_text` is what the completion decodes to;
    cross-tokenizer teachers re-tokenize it with their own tokenizer. An on-policy sample of a
    run that scores rewards carries its `reward` and its group-relative `advantage`. `stopped`:
    whether its sampler ended it with a stop token (False: cut at max_new_tokens).
    """

    example_id: int
    prompt_ids: list[int]
    completion_ids: list[int]
    source: str
    prompt: Messages | str | None = None
    completion_text: str | None = None
    sampling_logprobs: list[float] | None = None
    reward: float | None = None
    advantage: float | None = None
    stopped: bool | None = None  # the sampler ended it with a stop token (None: not known)


@dataclass
class Batch:
    """A padded micro-batch for the student forward (right padding).

    `labels_B_T` and `mask_B_T` are shifted (position t predicts input token t+1): the loss
    covers completion tokens only, prompt and padding are False.
    """

    input_ids_B_L: torch.Tensor
    attention_mask_B_L: torch.Tensor
    labels_B_T: torch.Tensor
    mask_B_T: torch.Tensor
    samples: list[Sample]
    sampling_logprobs_B_T: torch.Tensor | None = None
    # cross-tokenizer batches: the teacher's own inputs and the alignment of the completions
    teacher_input_ids_B_L: torch.Tensor | None = None
    teacher_attention_mask_B_L: torch.Tensor | None = None
    # privileged context, same tokenizer: the teacher's prompt + the same completion, and per
    # row the shift from a student position to the teacher's (data/context.py)
    context_input_ids_B_L: torch.Tensor | None = None
    context_attention_mask_B_L: torch.Tensor | None = None
    context_shift_B: torch.Tensor | None = None
    alignment: AlignmentGroups | None = None
    # cross-tokenizer batches: every completion token, before the alignment narrowed mask_B_T to
    # the tokens in groups (None: mask_B_T is it). A task's reward trains all of them.
    completion_mask_B_T: torch.Tensor | None = None

    @property
    def num_loss_tokens(self) -> int:
        return int(self.mask_B_T.sum())

    @property
    def num_completion_tokens(self) -> int:
        """The completion tokens (the reward term's), aligned or not."""
        mask = self.mask_B_T if self.completion_mask_B_T is None else self.completion_mask_B_T
        return int(mask.sum())

    def to(self, device: torch.device | str) -> Batch:
        import torch

        moved = {
            f.name: v.to(device)
            for f in fields(self)
            if isinstance(v := getattr(self, f.name), (torch.Tensor, AlignmentGroups))
        }
        return replace(self, **moved)
