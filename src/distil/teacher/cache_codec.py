"""How a teacher-cache shard stores N tokens' top-k targets (format 2; docs/teacher-cache.md).

Ids: each token's top-k ids sorted ascending, as gaps (the first id, then id_j - id_{j-1} - 1,
since the ids are distinct), each gap Rice-coded with a parameter r_j per position j of the
sorted list (chosen per shard, the one that makes the shard smallest): the gap's high bits
g >> r_j in unary into one bit stream, its low r_j bits into another. Gaps of a random top-64 of
a 128k vocabulary are about geometric with mean 2k, which a Rice code stores in about 12.5 bits,
0.1 bit above their entropy; both streams decode with numpy, without a Python loop per gap.

Values, in the same (id) order, by codec:
    sqrt  the square root of each probability rounded to a step d (`sqrt_step(k)`), as the
          level above the token's lowest level, lzma-compressed. KL(p || q) ~ 2 sum_i
          (sqrt p_i - sqrt q_i)^2 (twice the squared Hellinger distance), so a uniform step on
          sqrt p costs KL ~ k d^2 / 6 nats per token whatever the probabilities: the step on
          log p_i, 2 d / sqrt p_i, grows as p_i falls, where the KL tolerates it.
    q8    log-probs in steps of `LOGPROB_STEP` nats below the token's top-1 (format 1's codec)
    fp16 / fp32  the log-probs themselves (fp32: lossless)
"""

from __future__ import annotations

import lzma
import math

import numpy as np
import torch

VALUE_CODECS = ("sqrt", "q8", "fp16", "fp32")
# q8: rounding to steps of s nats costs KL ~ m s^2/24 per token, m = the top-k mass (errors
# uniform in +-s/2 on log-probs): at most 6.5e-4 nats for s = 1/8
LOGPROB_STEP = 0.125
# sqrt: the KL per token the rounding may cost (k d^2 / 6), half of a 1e-3 nats per token budget
SQRT_KL_BUDGET = 5e-4
MAX_LEVEL = 255  # sqrt levels are bytes: d >= 1/255


def sqrt_step(k: int) -> float:
    """The sqrt codec's step for top-k: k d^2 / 6 = SQRT_KL_BUDGET, at least 1/MAX_LEVEL."""
    return max(1.0 / MAX_LEVEL, math.sqrt(6.0 * SQRT_KL_BUDGET / k))


def encode_tokens(
    ids_N_K: torch.Tensor,
    logprobs_N_K: torch.Tensor,
    rest_N: torch.Tensor,
    token_N: torch.Tensor,
    values: str = "sqrt",
    step: float | None = None,
) -> dict[str, np.ndarray]:
    """The flat arrays of N tokens' targets: `ids_*` (`encode_ids`), `values_x`, `rest`,
    `token` (and `top1` for q8). `step`: the sqrt codec's step (default `sqrt_step(k)`)."""
    ids = ids_N_K.detach().cpu().numpy().astype(np.int64)
    lps = logprobs_N_K.detach().cpu().float().numpy()
    order = np.argsort(ids, axis=-1, kind="stable")
    out = encode_ids(np.take_along_axis(ids, order, -1))
    slp = np.take_along_axis(lps, order, -1)
    side = np.float32 if values == "fp32" else np.float16
    if values == "sqrt":
        d = step or sqrt_step(ids.shape[-1])
        levels = np.clip(np.rint(np.exp(0.5 * slp.astype(np.float64)) / d), 0, MAX_LEVEL)
        levels = levels.astype(np.uint8)
        low = levels.min(axis=-1, initial=MAX_LEVEL)  # levels above the token's lowest: smaller
        payload = low.tobytes() + (levels - low[:, None]).tobytes()
    elif values == "q8":
        top1 = lps.max(axis=-1, initial=-np.inf) if lps.size else np.zeros(len(lps), np.float32)
        out["top1"] = top1.astype(side)
        steps = np.rint((out["top1"].astype(np.float32)[:, None] - slp) / LOGPROB_STEP)
        payload = np.clip(steps, 0, 255).astype(np.uint8).tobytes()
    else:
        payload = slp.astype("<f4" if values == "fp32" else "<f2").tobytes()
    out["values_x"] = _x(payload)
    out["rest"] = rest_N.detach().cpu().float().numpy().astype(side)
    out["token"] = token_N.detach().cpu().float().numpy().astype(side)
    return out


def decode_tokens(
    arrays: dict[str, np.ndarray], k: int, values: str, step: float | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids (N, K) int64 ascending, log-probs (N, K) fp32, rest (N,), token (N,)) from
    `encode_tokens`; lossy codecs' K+1 buckets renormalised to sum to 1."""
    n = len(arrays["rest"])
    ids = decode_ids(arrays, n, k)
    raw = lzma.decompress(arrays["values_x"].tobytes())
    if values == "sqrt":
        d = step or sqrt_step(k)
        low = np.frombuffer(raw, np.uint8, count=n).astype(np.float64)
        levels = np.frombuffer(raw, np.uint8, offset=n).reshape(n, k) + low[:, None]
        # level 0 holds sqrt p in [0, d/2): decoded at its middle, never at p = 0
        lps = 2.0 * np.log(np.where(levels > 0, levels * d, d / 4))
    elif values == "q8":
        steps = np.frombuffer(raw, np.uint8).reshape(n, k).astype(np.float32)
        lps = arrays["top1"].astype(np.float32)[:, None] - steps * (step or LOGPROB_STEP)
    else:
        lps = np.frombuffer(raw, "<f4" if values == "fp32" else "<f2").reshape(n, k)
    lps_N_K = torch.from_numpy(lps.astype(np.float32))
    rest_N = torch.from_numpy(arrays["rest"].astype(np.float32))
    if values != "fp32":
        # rounded values no longer sum to 1 with the rest; a KL against such targets has a
        # floor above 0, so the K+1 buckets are renormalised (bench/cache.py measures the KL)
        z_N = torch.logsumexp(torch.cat([lps_N_K, rest_N[:, None]], -1), -1)
        lps_N_K, rest_N = lps_N_K - z_N[:, None], rest_N - z_N
    return (
        torch.from_numpy(ids),
        lps_N_K,
        rest_N,
        torch.from_numpy(arrays["token"].astype(np.float32)),
    )


def _x(data: bytes) -> np.ndarray:
    """lzma (xz, no integrity check: each shard has a sha256 in the manifest)."""
    return np.frombuffer(lzma.compress(data, check=lzma.CHECK_NONE), np.uint8).copy()


# ----------------------------------------------------------------------------- ids


def id_gaps(sorted_ids_N_K: np.ndarray) -> np.ndarray:
    """(N, K) int64 gaps >= 0: the first id, then id_j - id_{j-1} - 1."""
    gaps = np.diff(sorted_ids_N_K, axis=-1, prepend=-1) - 1
    if gaps.size and (gaps.min() < 0 or sorted_ids_N_K[:, 0].min() < 0):
        raise ValueError("top-k ids must be distinct and >= 0")
    return gaps


def rice_parameters(gaps_N_K: np.ndarray) -> np.ndarray:
    """(K,) uint8: for each position, the r that stores its gaps in the fewest bits,
    sum_i (g_i >> r) + 1 + r."""
    n, k = gaps_N_K.shape
    if n == 0:
        return np.zeros(k, np.uint8)
    bits = np.stack([(gaps_N_K >> r).sum(0) + n * (1 + r) for r in range(32)])
    return bits.argmin(0).astype(np.uint8)


def encode_ids(sorted_ids_N_K: np.ndarray) -> dict[str, np.ndarray]:
    """`ids_r` (K,) Rice parameters, `ids_hi` the packed unary codes (g >> r zeros, then a
    one), `ids_lo` the packed low r bits of each gap (most significant first), token-major."""
    gaps = id_gaps(sorted_ids_N_K)
    r_K = rice_parameters(gaps)
    hi = (gaps >> r_K).reshape(-1)
    unary = np.zeros(int(hi.sum()) + hi.size, bool)
    unary[np.cumsum(hi + 1) - 1] = True
    shift_K_B, valid_K_B = _low_bit_layout(r_K)
    low_bits = np.zeros((*gaps.shape, shift_K_B.shape[1]), np.uint8)  # (N, K, max r)
    for b, s in enumerate(shift_K_B.T):  # one bit plane at a time: no (N, K, max r) int64
        low_bits[:, :, b] = (gaps >> s) & 1
    low = low_bits[np.broadcast_to(valid_K_B, low_bits.shape)]
    return {"ids_r": r_K, "ids_hi": np.packbits(unary), "ids_lo": np.packbits(low)}


def decode_ids(arrays: dict[str, np.ndarray], n: int, k: int) -> np.ndarray:
    """(N, K) int64 sorted ids from `encode_ids`' arrays."""
    r_K = arrays["ids_r"].astype(np.int64)
    ends = np.flatnonzero(np.unpackbits(arrays["ids_hi"]))[: n * k]
    hi = (np.diff(ends, prepend=-1) - 1).reshape(n, k)
    shift_K_B, valid_K_B = _low_bit_layout(r_K)
    mask = np.broadcast_to(valid_K_B, (n, *valid_K_B.shape))
    low_bits = np.zeros(mask.shape, np.uint8)
    low_bits[mask] = np.unpackbits(arrays["ids_lo"])[: int(mask.sum())]
    gaps = hi << r_K
    for b, s in enumerate(shift_K_B.T):  # bits past a position's r are 0 in low_bits
        gaps |= low_bits[:, :, b].astype(np.int64) << s
    return np.cumsum(gaps + 1, axis=-1) - 1


def _low_bit_layout(r_K: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(K, max r) shift of each stored low bit (r_j - 1 - b) and whether position j has bit b."""
    b = np.arange(int(r_K.max(initial=0)))
    shift = r_K.astype(np.int64)[:, None] - 1 - b[None, :]
    return np.maximum(shift, 0), shift >= 0
