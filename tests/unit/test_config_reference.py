"""docs/config.md is the schema's reference page and stays so (regenerate it with `distil config
schema --markdown > docs/config.md`); the JSON Schema covers every key; `distil --version`
and `distil env` answer."""

from __future__ import annotations

import json
import re
from importlib import metadata
from pathlib import Path

import pytest
import torch

import distil
from distil.cli import main
from distil.config import leaf_fields
from distil.config.reference import json_schema, reference_markdown, rule_text
from distil.config.rules import _CHECKS

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_the_config_page_is_the_schemas():
    assert DOC.read_text() == reference_markdown(), (
        "docs/config.md is out of date: run `distil config schema --markdown > docs/config.md`"
    )


def test_the_page_lists_every_key_with_its_default_and_every_rule():
    page = reference_markdown()
    rows = dict(
        re.findall(r"^\| `([a-z0-9_.]+)` \| [^|]*(?:\\\|[^|]*)* \| `([^`]*)` \|", page, re.M)
    )
    leaves = leaf_fields()
    assert set(rows) == set(leaves)  # every key, no other
    for key, info in leaves.items():
        assert rows[key] == json.dumps(info.get_default(call_default_factory=True), default=str)
    assert "| `train.lambda` | float >= 0.0 <= 1.0 | `1.0` | share of on-policy slices |" in page
    assert '| `loss.chunk_size` | int > 0 or "auto" or null | `"auto"` |' in page
    for fn in _CHECKS:
        assert f"- {rule_text(fn)}\n" in page

    def undocumented(cfg):
        return None

    with pytest.raises(ValueError, match="undocumented has no docstring"):
        rule_text(undocumented)


def test_json_schema_has_every_key_and_the_cli_prints_it(capsys):
    schema = json_schema()
    defs = schema["$defs"]

    def keys(props, prefix=""):
        for name, spec in props.items():
            ref = spec.get("$ref") or next(
                (a["$ref"] for a in spec.get("allOf", []) if "$ref" in a), None
            )
            if ref and "additionalProperties" not in spec:
                yield from keys(defs[ref.split("/")[-1]]["properties"], f"{prefix}{name}.")
            else:
                yield prefix + name

    assert set(keys(schema["properties"])) == set(leaf_fields())
    assert defs["TrainConfig"]["properties"]["lambda"]["maximum"] == 1.0  # YAML names, bounds
    assert defs["TrainConfig"]["additionalProperties"] is False  # unknown keys are errors
    assert main(["config", "schema"]) == 0
    assert json.loads(capsys.readouterr().out) == schema


def test_version_and_env_answer(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"distil {distil.__version__}\n"
    assert distil.__version__ == metadata.version("distil")
    assert main(["env"]) == 0
    lines = dict(line[2:].split(":", 1) for line in capsys.readouterr().out.splitlines())
    shown = {k: v.strip() for k, v in lines.items()}
    assert shown["distil"] == distil.__version__
    assert shown["torch"] == metadata.version("torch") == torch.__version__
    assert shown["transformers"] == metadata.version("transformers")
    assert shown["accelerate"] == metadata.version("accelerate")
    assert shown["vllm"] == _version_or_absent("vllm")
    assert shown["Python"].split()[0] == ".".join(map(str, __import__("sys").version_info[:3]))
    assert shown["GPU"] == ("none" if not torch.cuda.is_available() else shown["GPU"])


def _version_or_absent(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"
