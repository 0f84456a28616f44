"""What a finished stage of `distil demo` ran, recorded in its output directory, so that
`--resume` reuses a stage only when the same command, config text, code and inputs would run
it again (a re-made start or teacher, or a code change, runs it anew)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from distil.demo.run import DemoRun, code_version, content_hash
from distil.files import atomic_write
from distil.progress import console

STAGE_RECORD = "demo_stage.json"  # what a finished stage ran: command, config, code, inputs
# the keys of a stage's command whose files or model directories it reads
INPUT_KEYS = ("data.train", "student.path", "teacher.path", "eval.data")


def _record(command: str, config: Path) -> dict[str, Any]:
    """What a finished stage ran: its command, its config text's sha256, the code that ran it
    and the sha256 of every input its command names (data files, model weights), so --resume
    reuses it only when all of them are the same (a re-made start or teacher, or a code
    change, runs it again)."""
    inputs = {}
    for key in INPUT_KEYS:
        value = _command_value(command, key)
        if value is not None:
            inputs[key] = content_hash(Path(value))
    return {
        "command": command,
        "config_sha256": hashlib.sha256(config.read_bytes()).hexdigest(),
        "code": code_version(),
        "inputs": inputs,
    }


def _command_value(command: str, key: str) -> str | None:
    """The value `key=VALUE` has in a `distil ...` command line (None when it has none)."""
    for item in command.split(" "):
        k, sep, value = item.partition("=")
        if sep and k == key:
            return value
    return None


def finished(run: DemoRun, out: Path, command: str, config: Path) -> bool:
    """With --resume: whether `out` holds a stage that finished running exactly `command` with
    this config text (then it is reused and says so)."""
    record = out / STAGE_RECORD
    if not (run.resume and record.is_file()):
        return False
    if json.loads(record.read_text()) != _record(command, config):
        return False
    note = f"reusing the finished stage in {out} (--resume)"
    console.print(f"[dim]{note}[/dim]")
    if run.stages:  # the stage running it (in a lane: what the demo prints when it ends)
        run.stages[-1].note = note
    return True


def mark_finished(out: Path, command: str, config: Path) -> None:
    """Record a finished stage in `out` (written last, atomically: a killed stage has none)."""
    text = json.dumps(_record(command, config)) + "\n"
    atomic_write(out / STAGE_RECORD, lambda tmp: Path(tmp).write_text(text))
