"""YAML files and `key.sub=value` overrides -> a validated `DistilConfig`, every problem
collected into one `ConfigError` (unknown keys with the nearest valid key, wrong types with
the fix, rules over several values)."""

from __future__ import annotations

import copy
import difflib
import json
import os
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from distil.config.derived import resolve, underive
from distil.config.rules import semantic_problems
from distil.config.schema import DistilConfig
from distil.errors import ConfigError
from distil.paths import path_problem


def read_yaml(path: str | Path) -> dict[str, Any]:
    if problem := path_problem(path, "config file"):
        raise ConfigError(problem)
    path = Path(path)
    if path.is_dir():
        path = path / "config.yaml"
    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        raise ConfigError(f"config file {path} {what}; pass a YAML file or a run directory")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path} is not UTF-8 text (byte {exc.start}: {exc.object[exc.start : exc.start + 1]!r})"
            "; save the config as UTF-8"
        ) from exc
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    raw = parse_yaml(text, str(path))
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a mapping of sections, got {type(raw).__name__}")
    return raw


# A config is a few sections deep and holds a few hundred values; YAML anchors can expand a
# short file into a huge (or cyclic) tree, which pydantic would walk forever.
MAX_DEPTH, MAX_VALUES = 32, 100_000


def parse_yaml(text: str, where: str) -> Any:
    """yaml.safe_load that turns every failure into a ConfigError naming `where`.

    PyYAML's constructors raise arbitrary exceptions for values they cannot build (`!!bool
    maybe` a KeyError, `2001-13-45` a ValueError, `!!timestamp x` an AttributeError), hence
    the broad except. The result is checked for size, depth and non-string keys.
    """
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML: {_one_line(exc)}") from exc
    except RecursionError as exc:
        raise ConfigError(
            f"{where}: YAML nested too deeply; a config is a few levels deep"
        ) from exc
    except Exception as exc:  # see the docstring
        raise ConfigError(
            f"{where}: PyYAML cannot build a value ({type(exc).__name__}: {_one_line(exc)}); "
            "quote the value to keep it as a string, or fix its tag (e.g. !!float 1e-4)"
        ) from exc
    _check_tree(value, where)
    return value


def _check_tree(value: Any, where: str) -> None:
    """Reject trees too deep, too large (anchors expanded) or with keys that are not strings."""
    stack, seen = [(value, 0)], 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if depth > MAX_DEPTH or seen > MAX_VALUES:
            raise ConfigError(
                f"{where}: the YAML holds more than {MAX_VALUES} values or nests deeper than "
                f"{MAX_DEPTH} levels (a cyclic or repeatedly expanded anchor?); a config is a "
                "few sections of plain values"
            )
        if isinstance(node, dict):
            for key, child in node.items():
                if not isinstance(key, str):
                    raise ConfigError(
                        f"{where}: key {_short(key)} ({type(key).__name__}) is not a name; "
                        "config keys are names like train or lr"
                    )
                stack.append((child, depth + 1))
        elif isinstance(node, (list, tuple, set, frozenset)):
            stack.extend((child, depth + 1) for child in node)


def _one_line(exc: BaseException) -> str:
    return " ".join(_short(str(exc), 300).split())


def _short(value: Any, limit: int = 80) -> str:
    try:
        text = value if isinstance(value, str) else repr(value)
    except ValueError:  # an int over Python's 4,300-digit str limit
        text = f"<{type(value).__name__} too long to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> list[str]:
    """Set `a.b=value` overrides into `raw` in place (values parsed as YAML); return problems."""
    problems = []
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        parts = key.split(".")
        if not sep or not key or not all(p.strip() for p in parts):
            problems.append(f"override {_short(item)!r} is not key=value; write e.g. train.lr=1e-4")
            continue
        try:
            value = parse_yaml(text, f"override {_short(item)!r}") if text.strip() else None
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        node = raw
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                problems.append(f"override {_short(item)!r}: '{where}' is a value, not a section")
                break
            node = child
        else:
            node[parts[-1]] = value
    return problems


ConfigLike = str | os.PathLike | Mapping[str, Any] | DistilConfig | None
Overrides = Sequence[str] | Mapping[str, Any]


def raw_config(config: ConfigLike, overrides: Overrides = ()) -> tuple[dict[str, Any], list[str]]:
    """(a config as a plain dict with `overrides` applied, the overrides' problems): a YAML
    file or run directory read as `load_config` reads it, a dict of sections, a DistilConfig,
    or None (every default). Overrides are `key=value` strings as on the command line, or a
    mapping {"train.max_steps": 10} whose values are set as given. With overrides, each
    derived value that equals its derivation is cleared first, to be derived again
    (`derived.underive`: a resolved config's run_name follows a new train.output_dir)."""
    if config is None:
        raw: dict[str, Any] = {}
    elif isinstance(config, DistilConfig):
        raw = config.model_dump(mode="json", by_alias=True)
    elif isinstance(config, Mapping):
        raw = copy.deepcopy(dict(config))
    elif isinstance(config, (str, os.PathLike)):
        raw = read_yaml(config)
    else:
        raise ConfigError(
            f"config: got a {type(config).__name__}. Fix: pass a YAML file or run directory "
            "path, a dict of sections, or a DistilConfig"
        )
    overrides = override_list(overrides)
    if overrides:  # derived values follow what the overrides change (derived.underive)
        underive(raw)
    return raw, apply_overrides(raw, overrides)


def override_list(overrides: Overrides) -> list[str]:
    """`key=value` strings of a list of them (or one), or of a mapping {key: value} whose
    values are written as JSON (which YAML reads back as the same value)."""
    if isinstance(overrides, str):
        return [overrides]
    if isinstance(overrides, Mapping):
        return [f"{k}={json.dumps(v, default=str)}" for k, v in overrides.items()]
    return list(overrides)


def as_config(config: ConfigLike, overrides: Overrides = ()) -> DistilConfig:
    """`raw_config` validated and resolved, every problem in one ConfigError (a DistilConfig
    without overrides is returned as it is)."""
    if isinstance(config, DistilConfig) and not overrides:
        return config
    return build_config(*raw_config(config, overrides))


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> DistilConfig:
    """Read YAML (or a run directory's config.yaml), apply overrides, validate and resolve."""
    return build_config(*raw_config(path, overrides))


def _loc_key(loc: tuple) -> str:
    """The config key of a pydantic error location: list indices and the member names a union
    field adds (`target_modules.str`) dropped."""
    parts = [str(p) for p in loc if not isinstance(p, int)]
    leaves = leaf_fields()
    if len(parts) > 2 and _dict_of_sections(
        getattr(leaves.get(".".join(parts[:2])), "annotation", None)
    ):
        return ".".join(parts[:4])  # teachers.models.<name>.<key>
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in leaves:
            return ".".join(parts[:end])
    return ".".join(parts)


def build_config(raw: dict[str, Any], problems: list[str] | None = None) -> DistilConfig:
    problems = list(problems or [])
    problems += unknown_key_problems(raw, DistilConfig)
    bad_keys: set[str] = set()
    try:
        cfg = DistilConfig.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors():
            if err["type"] == "extra_forbidden":
                continue  # reported above with a suggestion
            key = _loc_key(err["loc"])
            if key not in bad_keys:  # a union field fails once per member: report it once
                bad_keys.add(key)
                problems.append(_type_problem(key, err))
        try:
            cfg = DistilConfig.model_validate(_without(raw, bad_keys | _unknown_keys(raw)))
        except ValidationError:  # defaults for the bad keys should always validate
            raise ConfigError(problems) from exc
    cfg = resolve(cfg)
    for keys, message in semantic_problems(cfg):
        if not (set(keys) & bad_keys):
            problems.append(message)
    if problems:
        raise ConfigError(problems)
    return cfg


# ----------------------------------------------------------------------------- messages


def leaf_fields(model: type[BaseModel] = DistilConfig, prefix: str = "") -> dict[str, Any]:
    """Map every dotted leaf key (by alias) to its pydantic FieldInfo."""
    out = {}
    for name, info in model.model_fields.items():
        key = prefix + (info.alias or name)
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.update(leaf_fields(ann, key + "."))
        else:
            out[key] = info
    return out


def _unknown_keys(raw: Any, model: type[BaseModel] = DistilConfig, prefix: str = "") -> set[str]:
    if not isinstance(raw, dict):
        return set()
    fields = {(info.alias or name): info for name, info in model.model_fields.items()}
    found = set()
    for key, value in raw.items():
        info = fields.get(str(key))
        if info is None:
            found.add(prefix + str(key))
        elif isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            found |= _unknown_keys(value, info.annotation, f"{prefix}{key}.")
        elif (item := _dict_of_sections(info.annotation)) is not None and isinstance(value, dict):
            for name, entry in value.items():  # teachers.models.<name>: a section per name
                found |= _unknown_keys(entry, item, f"{prefix}{key}.{name}.")
    return found


def _dict_of_sections(annotation: Any) -> type[BaseModel] | None:
    """The section type of a `dict[str, Section]` field (teachers.models), else None."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is dict and len(args) == 2:
        item = args[1]
        if isinstance(item, type) and issubclass(item, BaseModel):
            return item
    return None


def unknown_key_problems(raw: dict[str, Any], model: type[BaseModel]) -> list[str]:
    problems = []
    all_keys = list(leaf_fields(model))
    sections = sorted({k.split(".")[0] for k in all_keys})
    for key in sorted(_unknown_keys(raw, model)):
        parent, _, last = key.rpartition(".")
        siblings = [k for k in all_keys if k.rpartition(".")[0] == parent]
        if item := _dict_of_sections(
            getattr(leaf_fields(model).get(parent.rpartition(".")[0]), "annotation", None)
        ):
            siblings = [f"{parent}.{info.alias or n}" for n, info in item.model_fields.items()]
            all_keys = [*all_keys, *siblings]  # teachers.models.<name>: the keys of its section
        if not parent:
            siblings = sections
        same_name = [k for k in all_keys if k.rpartition(".")[2] == last]
        close = difflib.get_close_matches(key, siblings, n=1, cutoff=0.6)
        close = close or difflib.get_close_matches(key, all_keys, n=1, cutoff=0.6)
        hint = same_name[0] if same_name else (close[0] if close else None)
        fix = f"did you mean '{hint}'?" if hint else "remove it"
        where = f"section '{parent}'" if parent else "the top level"
        problems.append(f"unknown key '{key}' in {where}: {fix}")
    return problems


def _type_problem(key: str, err: dict[str, Any]) -> str:
    info = leaf_fields().get(key)
    seen = err.get("input")
    value = repr(_short(seen, 200)) if isinstance(seen, str) else _short(seen, 200)
    msg = err["msg"]
    if info is None:
        return f"'{key}' = {value}: {msg}"
    return f"'{key}' = {value}: {msg}. Fix: {_fix_hint(key, info)}"


def _fix_hint(key: str, info: Any) -> str:
    ann = info.annotation
    choices = _literal_choices(ann)
    desc = f" ({info.description})" if info.description else ""
    if choices:
        return f"set {key} to one of {', '.join(repr(c) for c in choices)}{desc}"
    default = info.get_default(call_default_factory=True)
    return f"set {key} to a value like {default!r}{desc}"


def _literal_choices(ann: Any) -> list[Any]:
    if get_origin(ann) is Literal:
        return list(get_args(ann))
    for arg in get_args(ann):
        choices = _literal_choices(arg)
        if choices:
            return choices
    return []


def _without(raw: Any, keys: set[str], prefix: str = "") -> Any:
    if not isinstance(raw, dict):
        return raw
    out = {}
    for k, v in raw.items():
        key = prefix + str(k)
        if key in keys or any(b.startswith(key + ".") and not isinstance(v, dict) for b in keys):
            continue
        out[k] = _without(v, keys, key + ".")
    return out
