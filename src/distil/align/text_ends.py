"""Teacher byte ends from character offsets, in compiled code.

A teacher's tokens come with character offsets over the text it was given; `text_ends` turns
one text's spans into each token's byte end (`token_align.text_byte_ends` has the rules), and
`rows_text_ends` does it for every row of a micro-batch in one call
(`CrossTokenizer.teacher_inputs_batch`), reading each token's own bytes from the vocabulary's
byte index.
"""

from __future__ import annotations

import numba
import numpy as np

from distil.align.keys import same_bytes


@numba.njit(cache=True)
def text_ends(data, starts, stops, own_data, own_start, own_stop):
    # pragma: no cover - compiled
    """Byte end of each token of one text (`token_align.text_byte_ends`): data uint8, the
    token spans [starts, stops) in bytes, token k's own bytes
    own_data[own_start[k]:own_stop[k]] (empty: unknown)."""
    n = starts.shape[0]
    # start of the next token with a non-empty span (zero-width (0, 0) specials are skipped)
    next_start = np.empty(n, np.int64)
    upcoming = data.shape[0]
    for k in range(n - 1, -1, -1):
        next_start[k] = upcoming
        if stops[k] > starts[k]:
            upcoming = starts[k]
    ends = np.empty(n, np.int64)
    pos = 0
    for k in range(n):
        a, m = own_start[k], own_stop[k] - own_start[k]
        if m > 0 and starts[k] < pos + m <= stops[k] and same_bytes(own_data, a, data, pos, m):
            pos += m
        else:
            pos = max(pos, min(stops[k], next_start[k]))
        ends[k] = pos
    return ends


@numba.njit(cache=True)
def rows_text_ends(data, d_off, char_spans, tok_off, ids, v_data, v_start):
    # pragma: no cover - compiled
    """`text_ends` of every row of a batch, from character offsets: row r's text is the UTF-8
    data[d_off[r]:d_off[r + 1]], its tokens tok_off[r]:tok_off[r + 1] of `ids` with character
    spans char_spans (N, 2) over that text (clipped to it), their own bytes from a vocabulary's
    byte index (v_data, v_start; ids outside it: unknown). Returns the flat int64 (N,) ends."""
    n_rows = d_off.shape[0] - 1
    n = ids.shape[0]
    size = v_start.shape[0] - 1
    out = np.empty(n, np.int64)
    starts = np.empty(n, np.int64)
    stops = np.empty(n, np.int64)
    own_start = np.empty(n, np.int64)
    own_stop = np.empty(n, np.int64)
    char_end = np.empty(data.shape[0] + 1, np.int64)  # scratch: byte offset of each character
    for r in range(n_rows):
        a, b = d_off[r], d_off[r + 1]
        n_chars = 0
        char_end[0] = 0
        for x in range(a + 1, b):
            if data[x] & 0xC0 != 0x80:  # a lead byte starts a character
                n_chars += 1
                char_end[n_chars] = x - a
        if b > a:
            n_chars += 1
            char_end[n_chars] = b - a
        for k in range(tok_off[r], tok_off[r + 1]):
            starts[k] = char_end[min(max(char_spans[k, 0], 0), n_chars)]
            stops[k] = char_end[min(max(char_spans[k, 1], 0), n_chars)]
            i = ids[k]
            own_start[k] = v_start[i] if 0 <= i < size else 0
            own_stop[k] = v_start[i + 1] if 0 <= i < size else 0
        k0, k1 = tok_off[r], tok_off[r + 1]
        out[k0:k1] = text_ends(
            data[a:b], starts[k0:k1], stops[k0:k1], v_data, own_start[k0:k1], own_stop[k0:k1]
        )
    return out
