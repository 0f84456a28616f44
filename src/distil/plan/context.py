"""How many tokens privileged context (`teacher.context`, `teacher.system`) adds to each of the
teacher's sequences: stated (`distil plan --context-tokens N`), or measured on the first rows
of `data.train` with the student's tokenizer.

A same-tokenizer teacher sees its context prompt whole (data/context.py), while the student's
prompt is cut to `data.max_prompt_tokens`; the added tokens of a row are the teacher prompt's
length less the student prompt's (as cut), and the plan takes the largest over the rows read,
so a teacher sequence is at most max_prompt_tokens + that + the completion. Across tokenizers
the teacher's prompt is cut to `data.max_prompt_tokens` as well: nothing is added.
"""

from __future__ import annotations

from pathlib import Path

from distil.config import DistilConfig
from distil.errors import ConfigError
from distil.losses import is_cross_tokenizer

SAMPLE_ROWS = 256  # rows of data.train read to measure the context's length


def context_tokens(cfg: DistilConfig, stated: int | None = None) -> tuple[int, str]:
    """(tokens added to each teacher sequence, how the number was found; '' without context)."""
    from distil.config.contexts import has_context

    if not has_context(cfg):  # teacher.context/system, or a routed teacher's own
        return 0, ""
    if stated is not None:
        if stated < 0:
            raise ConfigError(
                f"--context-tokens {stated}: a context adds tokens. Fix: 0 or more, or leave it "
                "out to measure it on data.train"
            )
        return stated, f"privileged context: {stated} tokens a teacher sequence (stated)"
    if is_cross_tokenizer(cfg.loss.name):
        return 0, (
            "privileged context across tokenizers: the teacher's prompt is cut to "
            "data.max_prompt_tokens, as the student's (nothing added)"
        )
    try:
        added, rows = measure(cfg)
    except Exception as exc:  # many types: no local data, no tokenizer, a row lacking a field
        guess = cfg.data.max_prompt_tokens
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return guess, (
            f"privileged context: its length could not be measured ({reason}); planned as "
            f"{guess} more tokens a teacher sequence (one more prompt). State it with "
            "`distil plan --context-tokens N`"
        )
    return added, (
        f"privileged context: up to {added} tokens more a teacher sequence, measured on the "
        f"first {rows} rows of data.train (`distil plan --context-tokens N` to state it)"
    )


def measure(cfg: DistilConfig) -> tuple[int, int]:
    """(largest tokens added over the rows read, rows read), with the student's tokenizer."""
    from distil.data.context import row_prompts
    from distil.models.load import load_tokenizer
    from distil.models.tokenizers import encode_prompts, prompt_format
    from distil.tasks.prompts import config_examples
    from distil.teacher.several import row_contexts

    d = cfg.data
    if not d.train or not Path(d.train).expanduser().exists():
        raise FileNotFoundError(f"data.train = {d.train!r} is not a local file")
    examples = config_examples(d, limit=SAMPLE_ROWS)
    s = cfg.student
    tok = load_tokenizer(s.tokenizer or s.path, trust_remote_code=s.trust_remote_code)
    fmt = prompt_format(d)
    student = encode_prompts(
        tok, [e.prompt for e in examples], max_tokens=d.max_prompt_tokens, fmt=fmt
    )
    prompts = row_prompts(examples, row_contexts(cfg, examples) or [(None, None)] * len(examples))
    own = [e.prompt if p is None else p for e, p in zip(examples, prompts, strict=True)]
    teacher = encode_prompts(tok, own, fmt=fmt)  # each row's teacher's (its own without context)
    added = max((len(a) - len(b) for a, b in zip(teacher, student, strict=True)), default=0)
    return max(0, added), len(examples)
