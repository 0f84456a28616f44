"""`distil config validate`: every check `distil train` makes before its first step that needs
no model weights, so `ok` means training would start.

Beyond a valid config (`distil.config`): local paths exist with the right kind and the output
directory can be created (`config.source_problems`), the loss is registered, the needed extras
are installed, the first rows of the data parse and fit the token limits, the tokenizers load,
have an EOS token and render the prompts, a same-tokenizer loss gets one vocabulary on both
sides, and the evaluation problems file reads. Hub ids are not fetched; they are returned as
notes.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from distil.config import DistilConfig, training_problems
from distil.errors import DistilError
from distil.paths import looks_local, source_problems

ROWS_READ = 64  # rows of each data file parsed and measured


def preflight(cfg: DistilConfig) -> tuple[list[str], list[str]]:
    """(problems, notes): problems stop `distil train`; notes say what was not checked."""
    notes = source_problems(cfg)[1]
    problems = training_problems(cfg)
    if problems:  # the checks below read files: only once every path is there
        return problems, notes
    found = _Problems()
    _settings(cfg, found)
    if cfg.teacher.cache:  # manifest only; shards and data rows are checked by `distil train`
        from distil.teacher.cached import check_settings

        found.attempt(check_settings, cfg)
    examples = _data(cfg, found)
    toks = _tokenizers(cfg, examples, found)
    from distil.losses import is_cross_tokenizer
    from distil.models.load import vocab_mismatch

    same_tokenizer = cfg.loss.name != "sft" and not is_cross_tokenizer(cfg.loss.name)
    if same_tokenizer and len(toks) == 2 and not found:
        found += filter(None, [vocab_mismatch(cfg.loss.name, toks["student"], toks["teacher"])])
    return list(found), notes


class _Problems(list):
    def attempt(self, fn, *args, **kwargs):
        """fn(*args, **kwargs), or None with its DistilError's message recorded."""
        try:
            return fn(*args, **kwargs)
        except DistilError as exc:
            self.append(str(exc))
            return None


def _settings(cfg: DistilConfig, found: _Problems) -> None:
    from distil.losses import get_loss, is_cross_tokenizer

    found.attempt(get_loss, cfg.loss.name)
    if cfg.teacher.top_k is not None and is_cross_tokenizer(cfg.loss.name) and not cfg.teacher.url:
        found.append(
            f"teacher.top_k = {cfg.teacher.top_k} with loss.name = {cfg.loss.name!r}: the "
            "cross-tokenizer losses need the teacher's full distribution. Fix: set "
            "teacher.top_k=null"
        )
    extras = [(t, "trackers", f"logging.trackers={t}") for t in cfg.logging.trackers]
    if cfg.student.lora.enabled:
        extras.append(("peft", "peft", "student.lora.enabled=true"))
    for module, extra, feature in extras:
        if importlib.util.find_spec(module) is None:
            found.append(
                f"{feature} needs the optional package '{module}', which is not installed. "
                f"Install it with: pip install 'distil[{extra}]' (or pip install {module})."
            )
    if cfg.train.fp16:
        import torch

        if not torch.cuda.is_available():
            found.append("train.fp16=true needs a CUDA GPU. Fix: use train.bf16=true on CPU")


def _data(cfg: DistilConfig, found: _Problems):
    """The first rows of data.train (also parsed: data.eval and, with eval_every, eval.data)."""
    from distil.data.datasets import config_examples

    examples = None
    for source in (cfg.data.train, cfg.data.eval):
        if source and (looks_local(source) or Path(os.path.expanduser(source)).exists()):
            rows = found.attempt(config_examples, cfg.data, source, ROWS_READ)
            examples = rows if examples is None else examples
    if cfg.train.eval_every:  # the task imports; a local problems file reads as its rows
        from distil.tasks import make_task

        task = found.attempt(make_task, cfg.eval)
        if task is not None and cfg.eval.data and looks_local(cfg.eval.data):
            found.attempt(task.load)
    return examples


def _tokenizers(cfg: DistilConfig, examples, found: _Problems) -> dict:
    """Load the local tokenizers (no weights); render a prompt; measure the student's rows."""
    from distil.data.lengths import check_lengths, uses_completions
    from distil.models.load import load_tokenizer
    from distil.models.tokenizers import render_prompt, stop_token_ids

    sides = [("student", cfg.student)]
    if cfg.teacher.path and (cfg.loss.name != "sft" or cfg.train.seq_kd):
        sides.append(("teacher", cfg.teacher))
    toks = {}
    for name, section in sides:
        if not Path(os.path.expanduser(section.tokenizer)).exists():
            continue  # a hub id: a note, not fetched
        key = f"{name}.tokenizer" if section.tokenizer != section.path else f"{name}.path"
        tok = found.attempt(
            load_tokenizer, section.tokenizer, key=key, trust_remote_code=section.trust_remote_code
        )
        if tok is None:
            continue
        toks[name] = tok
        found.attempt(stop_token_ids, tok)
        rendered = examples and found.attempt(render_prompt, tok, examples[0].prompt, name=name)
        if rendered and name == "student":
            found.attempt(
                check_lengths, examples, tok, cfg.data, completions_used=uses_completions(cfg)
            )
    return toks
