"""Cross-tokenizer micro-batches: the teacher's own inputs and the alignment of the completions.

The teacher sees the prompt rendered with its OWN chat template and the completion's bytes
tokenized by its own tokenizer; only the completion bytes are shared with the student. The
student's completion bytes come from the bytes each of its tokens produces (so a sample that
stops inside a multi-byte character or decodes to text that re-tokenizes differently is never
silently misaligned); the teacher gets them decoded as UTF-8, an incomplete trailing character
dropped. `distil.align` turns both sides into `AlignmentGroups`; the loss mask keeps only
student tokens inside a group, and the rest are counted as unalignable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from itertools import chain

import numpy as np
import torch

from distil.align import (
    MatchTables,
    PaddedRows,
    ProjectionTables,
    build_alignment,
    completion_text,
    encode_with_byte_ends,
    text_byte_ends,
    vocab_bytes,
)
from distil.align.text_ends import rows_text_ends
from distil.data.collate import collate
from distil.models.tokenizers import (
    PLAIN,
    PromptFormat,
    completion_end_id,
    keep_end,
    prompt_format,
    render_prompt,
    rendered_ids,
    right_pad,
    stop_token_ids,
)
from distil.types import Batch, Messages, Sample


class CrossTokenizer:
    """Everything the data path needs to pair a student with a teacher of another family."""

    def __init__(
        self,
        student_tok,
        teacher_tok,
        *,
        max_prompt_tokens: int | None = None,
        fmt: PromptFormat = PLAIN,
    ):
        self.student_tok, self.teacher_tok, self.fmt = student_tok, teacher_tok, fmt
        self.student_vb = vocab_bytes(student_tok)
        self.teacher_vb = vocab_bytes(teacher_tok)
        self.match_tables = MatchTables(self.student_vb, self.teacher_vb)
        self.proj_tables = ProjectionTables(self.student_vb, self.teacher_vb)
        self.student_stops = set(stop_token_ids(student_tok))
        self.teacher_stops = set(stop_token_ids(teacher_tok))
        # what a finished completion ends with, after a verbatim (False) or chat (True) prompt
        self.teacher_ends = {c: completion_end_id(teacher_tok, c) for c in (False, True)}
        self.student_ends = {c: completion_end_id(student_tok, c) for c in (False, True)}
        self.max_prompt_tokens = max_prompt_tokens
        self._teacher_prompts: dict[int, str] = {}

    @classmethod
    def for_data(cls, student_tok, teacher_tok, data) -> CrossTokenizer:
        """The pair as a config's data section asks: its prompt cut and prompt format."""
        return cls(
            student_tok,
            teacher_tok,
            max_prompt_tokens=data.max_prompt_tokens,
            fmt=prompt_format(data),
        )

    # ------------------------------------------------------------------ teacher side

    def teacher_prompt_text(self, sample: Sample) -> str:
        """The prompt rendered with the teacher's own chat template (cached per example)."""
        text = self._teacher_prompts.get(sample.example_id)
        if text is None:
            text = ""  # a sample without a prompt (a bare completion) stays bare
            if sample.prompt is not None:
                text = render_prompt(
                    self.teacher_tok, sample.prompt, name="teacher tokenizer", fmt=self.fmt
                )
            self._teacher_prompts[sample.example_id] = text
        return text

    def student_bytes(self, completion_ids: Sequence[int]) -> bytes:
        table = self.student_vb.token_bytes
        if completion_ids and min(completion_ids) >= 0 and max(completion_ids) < len(table):
            return b"".join(map(table.__getitem__, completion_ids))  # no per-id Python check
        return b"".join(table[i] for i in completion_ids if 0 <= i < len(table))

    def teacher_inputs(self, sample: Sample):
        """(prompt ids, completion ids, completion byte ends, completion bytes) for the teacher.

        The completion is tokenized in context, after the teacher's prompt, so a tokenizer that
        marks word starts (SentencePiece '▁') sees what follows the prompt rather than the start
        of a text. If a teacher token would straddle the prompt/completion seam, the two are
        tokenized apart instead. The teacher's EOS is appended (zero bytes, after its last
        token) when the student's completion ended with a stop token.
        """
        prompt_text = self.teacher_prompt_text(sample)
        text = completion_text(self.student_bytes(sample.completion_ids))
        tok, vb = self.teacher_tok, self.teacher_vb
        enc = tok(prompt_text + text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets, seam = list(enc["input_ids"]), enc["offset_mapping"], len(prompt_text)
        k = next((i for i, (_, end) in enumerate(offsets) if end > seam), len(ids))
        if k < len(ids) and offsets[k][0] < seam:  # a token spans the seam
            prompt_ids = tok(prompt_text, add_special_tokens=False)["input_ids"]
            t_ids, ends, data = encode_with_byte_ends(tok, text, vb)
        else:
            prompt_ids, t_ids = ids[:k], ids[k:]
            local = [(max(a - seam, 0), max(b - seam, 0)) for a, b in offsets[k:]]
            table = [vb.token_bytes[i] if 0 <= i < vb.size else b"" for i in t_ids]
            ends, data = text_byte_ends(text, local, table), text.encode("utf-8")
        return self._finish_teacher(sample, prompt_ids, t_ids, ends, data)

    def _finish_teacher(self, sample: Sample, prompt_ids, t_ids, ends, data):
        # the teacher's EOS after a finished completion; a verbatim prompt after the teacher's
        # start ids (its BOS, `rendered_ids`); the prompt cut to max_prompt_tokens
        chat = sample.prompt is not None and self.fmt.chat(self.teacher_tok, sample.prompt)
        if sample.completion_ids and sample.completion_ids[-1] in self.student_stops:
            # zero bytes: trailing text the teacher's tokenizer drops (WordPiece strips a final
            # '\n') stays in no teacher token, so the student's tokens for it are masked, and
            # the two EOS still pair by role at the end of the text (align_completion)
            t_ids = [*t_ids, self.teacher_ends[chat]]
            ends = np.append(ends, ends[-1] if len(ends) else 0)
        if sample.prompt is not None:
            prompt_ids = rendered_ids(self.teacher_tok, "", chat, list(prompt_ids))
        if self.max_prompt_tokens is not None:
            prompt_ids = keep_end(self.teacher_tok, prompt_ids, self.max_prompt_tokens)
        return prompt_ids, t_ids, ends, data

    def teacher_inputs_batch(self, samples: Sequence[Sample]) -> list[tuple]:
        """`teacher_inputs` of every sample, with one tokenizer call for the batch and the byte
        ends of all rows in one compiled pass (`text_ends.rows_text_ends`); a row whose prompt and
        completion share a teacher token goes through `teacher_inputs` alone. Same results."""
        return self._teacher_rows(samples)[0]

    def _teacher_rows(self, samples: Sequence[Sample]) -> tuple[list[tuple], np.ndarray]:
        # `teacher_inputs_batch`, and per row whether the teacher's text bytes are a prefix of
        # the student's completion bytes (`PaddedRows.t_prefix_B`; a memcmp here)
        if not samples:
            return [], np.zeros(0, np.bool_)
        tok, vb = self.teacher_tok, self.teacher_vb
        prompts = [self.teacher_prompt_text(s) for s in samples]
        raw = [self.student_bytes(s.completion_ids) for s in samples]
        texts = [completion_text(r) for r in raw]
        enc = tok(
            [p + t for p, t in zip(prompts, texts, strict=True)],
            add_special_tokens=False,
            return_offsets_mapping=True,
        )
        out: list = [None] * len(samples)
        kept, ids, spans, tok_off = [], [], [], [0]
        for r, (row_ids, offsets, seam) in enumerate(
            zip(enc["input_ids"], enc["offset_mapping"], map(len, prompts), strict=True)
        ):
            k = next((i for i, (_, end) in enumerate(offsets) if end > seam), len(row_ids))
            if k < len(row_ids) and offsets[k][0] < seam:  # a token spans the seam
                out[r] = self.teacher_inputs(samples[r])
                continue
            kept.append((r, row_ids[:k], row_ids[k:]))
            ids.extend(row_ids[k:])
            spans.extend(offsets[k:])
            tok_off.append(len(ids))
        if kept:
            data = [texts[r].encode("utf-8") for r, _, _ in kept]
            d_off = np.zeros(len(kept) + 1, np.int64)
            np.cumsum([len(d) for d in data], out=d_off[1:])
            seams = np.repeat(
                np.fromiter((len(prompts[r]) for r, _, _ in kept), np.int64, len(kept)),
                np.diff(tok_off),
            )
            # one pass over the offset pairs (np.asarray on a list of tuples costs 4x more)
            flat = np.fromiter(chain.from_iterable(spans), np.int64, 2 * len(spans))
            char_spans = flat.reshape(-1, 2) - seams[:, None]
            index = vb.index()
            ends = rows_text_ends(
                np.frombuffer(b"".join(data), np.uint8), d_off, char_spans,
                np.asarray(tok_off, np.int64), np.asarray(ids, np.int64), index.data, index.start,
            )  # fmt: skip
            for q, (r, prompt_ids, t_ids) in enumerate(kept):
                out[r] = self._finish_teacher(
                    samples[r], prompt_ids, t_ids, ends[tok_off[q] : tok_off[q + 1]], data[q]
                )
        # (an id outside the student's table spells nothing in `raw`; the aligner takes such a
        # row out of the one-call path before it reads any bytes)
        prefix = [r.startswith(o[3]) for r, o in zip(raw, out, strict=True)]
        return out, np.asarray(prefix, np.bool_)

    def to_student(
        self,
        teacher_completion_ids: Sequence[int],
        *,
        prompt: Messages | str | None = None,
        example=None,
    ) -> tuple[list[int], str]:
        """A teacher-written completion (seq-KD) in student tokens; when the teacher stopped,
        the student's own end (its turn terminator after a chat-rendered `prompt`, the row's
        prompt, else EOS) follows. `example` (the row's index) is not read: routed teachers'
        converter picks by it."""
        chat = prompt is not None and self.fmt.chat(self.student_tok, prompt)
        ids = list(teacher_completion_ids)
        stopped = bool(ids) and ids[-1] in self.teacher_stops
        text = self.teacher_tok.decode(ids, skip_special_tokens=True)
        student_ids = self.student_tok(text, add_special_tokens=False)["input_ids"]
        if stopped:
            student_ids = [*student_ids, self.student_ends[chat]]
        return student_ids, text

    # ------------------------------------------------------------------ batches

    def collate(self, samples: Sequence[Sample], pad_id: int) -> Batch:
        """Student batch + teacher inputs + AlignmentGroups; loss mask = tokens in groups."""
        batch = collate(samples, pad_id)
        teacher, prefix = self._teacher_rows(samples)
        t_ids, t_mask = right_pad(
            [p + ids for p, ids, _, _ in teacher], self.teacher_tok.pad_token_id
        )
        # the completions as the padded id tensors hold them (no second conversion of ints)
        rows = PaddedRows(
            s_ids_B_L=batch.input_ids_B_L.numpy(),
            s_offset_B=np.fromiter((len(s.prompt_ids) for s in samples), np.int64, len(samples)),
            s_len_B=np.fromiter((len(s.completion_ids) for s in samples), np.int64, len(samples)),
            t_ids_B_L=t_ids.numpy(),
            t_offset_B=np.fromiter((len(t[0]) for t in teacher), np.int64, len(teacher)),
            t_len_B=np.fromiter((len(t[1]) for t in teacher), np.int64, len(teacher)),
            t_ends=[t[2] for t in teacher],
            t_bytes=[t[3] for t in teacher],
            t_prefix_B=prefix,
        )
        alignment, in_group = build_alignment(
            rows, self.student_vb, self.teacher_vb, self.match_tables, self.proj_tables
        )
        # completion token j of row r is predicted at position len(prompt) - 1 + j
        rows_K, tokens_K = in_group.nonzero(as_tuple=True)
        starts = torch.tensor([len(s.prompt_ids) - 1 for s in samples], dtype=torch.long)
        mask = torch.zeros_like(batch.mask_B_T)
        mask[rows_K, starts[rows_K] + tokens_K] = True
        return replace(
            batch,
            mask_B_T=mask,
            completion_mask_B_T=batch.mask_B_T,  # the reward term trains unaligned tokens too
            teacher_input_ids_B_L=t_ids,
            teacher_attention_mask_B_L=t_mask,
            alignment=alignment,
        )
