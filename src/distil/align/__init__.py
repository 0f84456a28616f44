"""Cross-tokenizer alignment: which student and teacher tokens spell the same completion bytes.

  vocab_map    bytes per token id (byte-level 'Ġ', SentencePiece '▁' + <0xNN>, WordPiece '##'),
               specials by role, the matched vocabulary and the candidate/projection tables
  byte_index   a vocabulary's byte strings sorted into arrays; the compiled table builds
  token_align  byte ends of both sides, two-pointer groups, specials paired by role
  walk         the whole micro-batch aligned in compiled passes over flat arrays (numba)
  keys         table keys (byte strings) deduplicated and looked up in compiled code
  dp           numba banded edit distance for texts that are not byte-identical
  batch        a micro-batch -> `distil.types.AlignmentGroups`
  inspect      `distil inspect pair` and the training example print (imports rich)

Only torch, numpy, numba and the stdlib are imported here; tokenizers are passed in.
"""

from distil.align.batch import PaddedRows, RowInputs, build_alignment
from distil.align.tables import MatchTables, ProjectionTables
from distil.align.token_align import (
    RowAlignment,
    align_completion,
    completion_text,
    encode_with_byte_ends,
    student_byte_spans,
    text_byte_ends,
    token_starts,
    two_pointer_groups,
)
from distil.align.vocab_map import VocabBytes, matched_vocab, role_map, vocab_bytes

__all__ = [
    "MatchTables",
    "PaddedRows",
    "ProjectionTables",
    "RowAlignment",
    "RowInputs",
    "VocabBytes",
    "align_completion",
    "build_alignment",
    "completion_text",
    "encode_with_byte_ends",
    "matched_vocab",
    "role_map",
    "student_byte_spans",
    "text_byte_ends",
    "token_starts",
    "two_pointer_groups",
    "vocab_bytes",
]
