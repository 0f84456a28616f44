"""Human-readable views of a tokenizer pair and of an aligned completion (`distil inspect pair`).

`pair_report` summarizes what two vocabularies share; `render_pair` / `render_alignment` /
`render_batch_row` show a completion tokenized by both models, one column per aligned group
(alternating colours), the student on the first line and the teacher on the second, as a
`rich.text.Text`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from rich.text import Text

from distil.align.token_align import (
    RowAlignment,
    align_completion,
    completion_text,
    encode_with_byte_ends,
    student_byte_spans,
)
from distil.align.vocab_map import VocabBytes, matched_vocab, role_map, vocab_bytes
from distil.errors import AlignmentError

_STYLES = ("bold cyan", "bold magenta")
_UNALIGNED = "red"
_VISIBLE = str.maketrans({" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"})


def token_text(vb: VocabBytes, token_id: int) -> str:
    """How a token is shown: its bytes as text (spaces as '␣', newlines as '↵', bytes that are
    not UTF-8 as \\xNN), or its own string for a special."""
    if token_id in vb.specials:
        return vb.special_text.get(token_id, vb.specials[token_id])
    if not 0 <= token_id < vb.size:
        return f"<id {token_id}>"
    return vb.token_bytes[token_id].decode("utf-8", "backslashreplace").translate(_VISIBLE)


def overlap_figures(student_tok: Any, teacher_tok: Any) -> dict[str, float]:
    """How much two vocabularies share, two ways (specials left out of both).

    By token *strings* (the raw vocabulary entries, so 'Ġthe' and '▁the' differ; the GOLD
    blog's table is the Jaccard of these) and by *bytes* (distil's matched vocabulary:
    different spellings of the same bytes meet). Keys: shared_strings, shared_bytes,
    string_jaccard, bytes_jaccard, bytes_over_student, bytes_over_teacher, bytes_over_smaller.
    """
    s_vb, t_vb = vocab_bytes(student_tok), vocab_bytes(teacher_tok)
    s_str = {k for k, i in student_tok.get_vocab().items() if i not in s_vb.specials}
    t_str = {k for k, i in teacher_tok.get_vocab().items() if i not in t_vb.specials}
    s_b, t_b = s_vb.by_bytes.keys(), t_vb.by_bytes.keys()
    n_str, n_b = len(s_str & t_str), len(s_b & t_b)
    return {
        "shared_strings": n_str,
        "shared_bytes": n_b,
        "string_jaccard": n_str / max(len(s_str | t_str), 1),
        "bytes_jaccard": n_b / max(len(s_b | t_b), 1),
        "bytes_over_student": n_b / max(len(s_b), 1),
        "bytes_over_teacher": n_b / max(len(t_b), 1),
        "bytes_over_smaller": n_b / max(min(len(s_b), len(t_b)), 1),
    }


def pair_report(student_tok: Any, teacher_tok: Any) -> dict:
    """What two tokenizers share: vocabulary sizes, overlap figures, specials.

    Returns {"student": side, "teacher": side, "overlap": `overlap_figures`, "matched": n
    (matched_vocab pairs, specials paired by role included), "special_pairs": [(student
    special, teacher special)] as token strings} where side = {"vocab_size", "convention",
    "specials": [{"id", "token", "role"}], "chat_template": bool}.
    """
    s_vb, t_vb = vocab_bytes(student_tok), vocab_bytes(teacher_tok)
    try:
        matched = int(matched_vocab(s_vb, t_vb)[0].numel())
    except AlignmentError:
        matched = 0
    pairs = sorted(role_map(s_vb, t_vb).items(), key=lambda ts: ts[1])
    return {
        "student": _side(student_tok, s_vb),
        "teacher": _side(teacher_tok, t_vb),
        "overlap": overlap_figures(student_tok, teacher_tok),
        "matched": matched,
        "special_pairs": [(token_text(s_vb, s), token_text(t_vb, t)) for t, s in pairs],
    }


def specials_summary(side: dict, paired: set[str], *, show_all: bool = False) -> str:
    """One line per kind of special: the roles, the ones paired with the other side, and a
    count of the rest (shown in full with `show_all`), with numbered runs such as Llama 3's
    256 reserved tokens folded into one entry ('<|reserved_special_token_N|> x248')."""
    roles = [f"{x['token']} ({x['role']})" for x in side["specials"] if x["role"] in _ROLES]
    rest = [x["token"] for x in side["specials"] if x["role"] not in _ROLES]
    named = [t for t in rest if t in paired]
    others = [t for t in rest if t not in paired]
    lines = [f"  roles: {', '.join(roles) or 'none'}"]
    if named:
        lines.append(f"  markers paired by name: {', '.join(named)}")
    if others:
        shown = others if show_all else _fold_numbered(others)
        lines.append(f"  other specials ({len(others)}): {', '.join(shown)}")
    return "\n".join(lines)


_ROLES = ("eos", "bos", "pad", "unk")


def _side(tok: Any, vb: VocabBytes) -> dict:
    specials = [
        {"id": i, "token": vb.special_text.get(i, role), "role": role}
        for i, role in sorted(vb.specials.items())
    ]
    return {
        "vocab_size": vb.size,
        "convention": vb.convention,
        "specials": specials,
        "chat_template": bool(getattr(tok, "chat_template", None)),
    }


def _fold_numbered(tokens: list[str], keep: int = 12) -> list[str]:
    # '<|reserved_special_token_17|>' and its siblings -> '<|reserved_special_token_N|> x248'
    families: dict[str, list[str]] = {}
    for t in tokens:
        families.setdefault(re.sub(r"\d+", "N", t), []).append(t)
    out = [f"{k} x{len(v)}" if len(v) > 2 else ", ".join(v) for k, v in families.items()]
    if len(out) > keep:
        out = [*out[:keep], f"... {len(out) - keep} more (--all-specials lists them)"]
    return out


def render_pair(text: str, student_tok: Any, teacher_tok: Any, *, width: int = 100) -> Text:
    """`text` tokenized by the student, the student's bytes by the teacher, aligned and drawn."""
    s_vb, t_vb = vocab_bytes(student_tok), vocab_bytes(teacher_tok)
    s_ids = student_tok.encode(text, add_special_tokens=False)
    s_bytes, _ = student_byte_spans(s_ids, s_vb)
    t_ids, t_ends, t_bytes = encode_with_byte_ends(teacher_tok, completion_text(s_bytes), t_vb)
    return render_alignment(student_tok, teacher_tok, s_ids, t_ids, t_ends, t_bytes, width=width)


def render_alignment(
    student_tok: Any,
    teacher_tok: Any,
    s_ids: Sequence[int],
    t_ids: Sequence[int],
    t_ends: Sequence[int] | np.ndarray | None = None,
    t_bytes: bytes | None = None,
    *,
    alignment: RowAlignment | None = None,
    width: int = 100,
) -> Text:
    """Draw an already-tokenized completion pair (the trainer prints one at start).

    Without `t_ends`/`t_bytes` the teacher's bytes come from its own byte table. Groups are
    columns in alternating colours separated by '│'; student tokens in no group are red, and so
    are teacher tokens in no group. Ends with a summary line.
    """
    s_vb, t_vb = vocab_bytes(student_tok), vocab_bytes(teacher_tok)
    if t_ends is None or t_bytes is None:
        t_bytes, t_ends = student_byte_spans(t_ids, t_vb)
    ra = alignment or align_completion(s_ids, s_vb, t_ids, t_ends, t_bytes, t_vb)
    s_text = [token_text(s_vb, int(i)) for i in s_ids]
    t_text = [token_text(t_vb, int(i)) for i in t_ids]
    out = Text()
    _draw(out, _cells(ra.groups, s_text, t_text), width)
    out.append(_summary(ra))
    return out


def render_batch_row(
    batch: Any, row: int, student_tok: Any, teacher_tok: Any, *, width: int = 100
) -> Text:
    """Draw row `row` of a collated cross-tokenizer `Batch` from its `AlignmentGroups`.

    Uses the sample's completion ids and the groups' realized ids (teacher tokens outside every
    group, e.g. a teacher BOS, are not shown: the batch does not record where the teacher's
    completion starts).
    """
    ag = batch.alignment
    s_vb, t_vb = vocab_bytes(student_tok), vocab_bytes(teacher_tok)
    sample = batch.samples[row]
    s_ids = list(sample.completion_ids)
    first = len(sample.prompt_ids) - 1  # predicting position of completion token 0
    sel = (ag.group_row_G == row).nonzero().flatten().tolist()
    groups, t_text = [], []
    for g in sel:
        pos = ag.student_pos_G_S[g]
        idx = (pos[pos >= 0] - first).tolist()
        toks = ag.teacher_tok_G_T[g]
        t0 = len(t_text)
        t_text += [token_text(t_vb, int(i)) for i in toks[toks >= 0].tolist()]
        groups.append((idx[0], idx[-1] + 1, t0, len(t_text)))
    groups.sort()
    s_text = [token_text(s_vb, int(i)) for i in s_ids]
    out = Text()
    _draw(out, _cells(np.asarray(groups, np.int64).reshape(-1, 4), s_text, t_text), width)
    multi = sum(1 for a, b, c, d in groups if b - a > 1 or d - c > 1)
    outside = len(s_ids) - sum(b - a for a, b, _, _ in groups)
    out.append(
        f"{len(groups)} groups ({multi} multi-token), {outside} of {len(s_ids)} student "
        "tokens outside groups (masked)"
    )
    return out


def _draw(out: Text, cells: list[tuple[str, str, str]], width: int) -> None:
    for chunk in _wrap(cells, width):
        for side in (0, 1):
            out.append("student │ " if side == 0 else "teacher │ ", style="dim")
            for cell in chunk:
                pad = max(len(cell[0]), len(cell[1]))
                out.append(cell[side].ljust(pad), style=cell[2])
                out.append(" │ ", style="dim")
            out.append("\n")


def _cells(groups: np.ndarray, s_text: list[str], t_text: list[str]) -> list[tuple[str, str, str]]:
    # one cell per group (student text, teacher text, style); tokens in no group get red cells
    cells: list[tuple[str, str, str]] = []
    si = ti = 0
    for g, (s0, s1, t0, t1) in enumerate(groups.tolist()):
        if si < s0 or ti < t0:
            cells.append((" ".join(s_text[si:s0]), " ".join(t_text[ti:t0]), _UNALIGNED))
        cells.append((" ".join(s_text[s0:s1]), " ".join(t_text[t0:t1]), _STYLES[g % 2]))
        si, ti = s1, max(ti, t1)
    if si < len(s_text) or ti < len(t_text):
        cells.append((" ".join(s_text[si:]), " ".join(t_text[ti:]), _UNALIGNED))
    return cells


def _wrap(cells: list[tuple[str, str, str]], width: int) -> list[list[tuple[str, str, str]]]:
    chunks: list[list[tuple[str, str, str]]] = [[]]
    used = 0
    for cell in cells:
        size = max(len(cell[0]), len(cell[1])) + 3
        if chunks[-1] and used + size > width:
            chunks.append([])
            used = 0
        chunks[-1].append(cell)
        used += size
    return [c for c in chunks if c]


def _summary(ra: RowAlignment) -> str:
    sizes = np.stack([ra.groups[:, 1] - ra.groups[:, 0], ra.groups[:, 3] - ra.groups[:, 2]])
    multi = int((sizes.max(axis=0, initial=0) > 1).sum()) if len(ra.groups) else 0
    dp = ", DP fallback (texts differ)" if ra.used_dp else ""
    return (
        f"{len(ra.groups)} groups ({multi} multi-token), exact bytes "
        f"{ra.n_bytes_exact}/{ra.n_bytes}, {len(ra.unalignable)} unalignable student "
        f"tokens{dp}"
    )
