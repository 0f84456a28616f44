"""Peak RSS and time of one cross-tokenizer loss (forward + backward) on a Llama 3 student
(128,256 tokens) and a Qwen3 teacher (151,669 tokens): random hidden states (H = 64) through the
student's head, random teacher log-probs, the alignment of Countdown-like text built by distil.
Needs the real tokenizer files (../shared/tokenizers or DISTIL_REAL_TOKENIZERS).

    python bench/loss_memory.py gold 4 60     # LOSS [rows] [completion words]
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import torch

from distil.data.crosstok import CrossTokenizer
from distil.losses import get_loss
from distil.losses.chunked import StudentHidden, auto_chunk_size
from distil.models.load import load_tokenizer
from distil.types import Sample, TeacherTargets

ROOT = Path(
    os.environ.get(
        "DISTIL_REAL_TOKENIZERS", Path(__file__).resolve().parents[2] / "shared" / "tokenizers"
    )
)


def main() -> None:
    torch.manual_seed(0)
    name = sys.argv[1]
    rows = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    words = int(sys.argv[3]) if len(sys.argv) > 3 else 120
    s_tok, t_tok = load_tokenizer(str(ROOT / "llama3")), load_tokenizer(str(ROOT / "qwen3"))
    cross = CrossTokenizer(s_tok, t_tok)
    text = ("Let me add 12 and 7 to get 19, then multiply by 3: (12 + 7) * 3 = 57. " * 40).split()
    samples = []
    for i in range(rows):
        prompt = f"Using the numbers [12, 7, 3], make {57 + i}. Think step by step."
        completion = " ".join(text[i : i + words])
        p_ids = s_tok(prompt, add_special_tokens=False)["input_ids"]
        c_ids = s_tok(completion, add_special_tokens=False)["input_ids"]
        samples.append(Sample(i, p_ids, c_ids, "off_policy", prompt, completion_text=completion))
    batch = cross.collate(samples, s_tok.pad_token_id or 0)
    b, t = batch.mask_B_T.shape
    tb, tt = batch.teacher_input_ids_B_L.shape
    logprobs = torch.log_softmax(torch.randn(tb, tt - 1, len(t_tok)) * 2, -1)
    hidden = torch.randn(b, t, 64, requires_grad=True)
    weight = (torch.randn(len(s_tok), 64) * 0.05).requires_grad_()
    _ = batch.alignment.teacher_pos_G_T  # the padded form expanded before the baseline
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    out = get_loss(name)(
        StudentHidden(hidden, weight),
        TeacherTargets(logprobs_B_T_V=logprobs),
        batch.mask_B_T,
        num_tokens=float(batch.mask_B_T.sum()),
        alignment=batch.alignment,
        chunk_size=auto_chunk_size(len(s_tok)),
    )
    out.loss.backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        "RESULT "
        + json.dumps(
            {
                "loss": name,
                "loss_tokens": int(batch.mask_B_T.sum()),
                "peak_over_inputs_MB": round((peak - base) / 1024),
                "seconds": round(seconds, 2),
                "value": float(out.loss),
            }
        )
    )


if __name__ == "__main__":
    main()
