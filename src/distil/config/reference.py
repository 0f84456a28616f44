"""The config reference, generated from the schema: docs/config.md (`distil config schema
--markdown`; a test fails when the page is out of date) and the JSON Schema that YAML editors
complete and check configs with (`distil config schema`).

Every key with its type, default and description comes from the config classes (their one
home); the rules that tie keys together from the docstrings of the registered checks
(rules.py); the derived values from `resolve`.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any, Literal, Union

from pydantic import BaseModel

from distil.config.rules import _CHECKS
from distil.config.schema import DistilConfig

HEADER = """# Config reference

Every key of a distil config, with its type, default and what it does. Generated from the
schema (`src/distil/config/schema.py`, `schema_models.py`) by `distil config schema --markdown >
docs/config.md`; a test fails when this page and the schema differ. A config is YAML with these
sections; any key can be set on the command line as `section.key=value` (`distil train CONFIG
train.max_steps=200`) or from Python as `{"train.max_steps": 200}` (docs/python.md). Unknown keys
are errors naming the nearest valid key. Editors that read JSON Schema (VS Code's YAML extension)
complete and check configs with `distil config schema > distil.schema.json` and a first line
`# yaml-language-server: $schema=distil.schema.json`.

Values filled in when a config is loaded (`distil config show` prints them):

- `student.tokenizer`, `teacher.tokenizer` and each `teachers.models.NAME.tokenizer` default to
  the model's path;
- `generation.generation_batch_size` defaults to `train.per_device_batch_size *
  train.grad_accum_steps / generation.num_generations`;
- `logging.run_name` defaults to the name of `train.output_dir`.
"""


def reference_markdown() -> str:
    """docs/config.md: a table per section (nested sections after their parent), then the
    rules over several keys."""
    parts = [HEADER]
    for name, info in DistilConfig.model_fields.items():
        parts += _section(info.alias or name, info.annotation)
    parts.append("## Rules that tie keys together\n")
    parts.append(
        "Checked when a config is loaded; a config that breaks one is refused with the values "
        "seen and the fix (all problems at once).\n"
    )
    parts += [f"- {rule_text(fn)}" for fn in _CHECKS]
    return "\n".join(parts) + "\n"


def rule_text(fn) -> str:
    """A rule's description: the first paragraph of its docstring, on one line."""
    if not fn.__doc__:
        raise ValueError(f"the config rule {fn.__name__} has no docstring to document it by")
    return " ".join(fn.__doc__.strip().split("\n\n")[0].split())


def _section(key: str, model: type[BaseModel]) -> list[str]:
    out = [f"## `{key}`\n"]
    if model.__doc__ and model.__doc__ is not BaseModel.__doc__ and "__doc__" in vars(model):
        out.append(" ".join(model.__doc__.split()) + "\n")
    out += ["| key | type | default | description |", "|---|---|---|---|"]
    nested = []
    for name, info in model.model_fields.items():
        sub = f"{key}.{info.alias or name}"
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            nested.append((sub, info.annotation))
            continue
        default = info.get_default(call_default_factory=True)
        row = [f"`{sub}`", _type(info), f"`{json.dumps(default, default=str)}`", info.description]
        out.append("| " + " | ".join(_cell(str(c or "")) for c in row) + " |")
    out.append("")
    for sub, section in nested:
        out += _section(sub, section)
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _type(info) -> str:
    return " ".join([type_text(info.annotation), *_bounds(info.metadata)])


def _bounds(metadata) -> list[str]:
    """The constraints of a field's or an Annotated type's metadata (a nested FieldInfo's
    too) as `> 0`, `<= 1.0`, ..."""
    out = []
    for meta in metadata:
        if hasattr(meta, "metadata") and not isinstance(meta, type):  # Field(gt=0) in Annotated
            out += _bounds(meta.metadata)
        elif bound := _bound(meta):
            out.append(bound)
    return out


def _bound(meta: Any) -> str | None:
    for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
        if getattr(meta, attr, None) is not None:
            return f"{sign} {getattr(meta, attr)}"
    if getattr(meta, "min_length", None) is not None:
        return f"(at least {meta.min_length})"
    return None


def type_text(ann: Any) -> str:
    """A type as the reference writes it: int, 'a' or 'b', list of int, ..."""
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if ann is type(None):
        return "null"
    if origin is Literal:
        return " or ".join(json.dumps(a) for a in args)
    if origin in (Union, types.UnionType):
        return " or ".join(type_text(a) for a in args)
    if origin is typing.Annotated:
        return " ".join([type_text(args[0]), *_bounds(args[1:])])
    if origin is list:
        return f"list of {type_text(args[0])}"
    if origin is tuple:
        return f"[{', '.join(type_text(a) for a in args)}]"
    if origin is dict:
        value = args[1]
        if isinstance(value, type) and issubclass(value, BaseModel):
            return "mapping of names to sections with the keys of `teacher`"
        return f"mapping of {type_text(args[0])} to {type_text(value)}"
    return getattr(ann, "__name__", str(ann))


def json_schema() -> dict[str, Any]:
    """The config's JSON Schema (draft 2020-12, as pydantic writes it), keys by their YAML
    names (`lambda`, `async`)."""
    schema = DistilConfig.model_json_schema(by_alias=True)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
