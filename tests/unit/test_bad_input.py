"""The bad-input corpus: every input a user can get wrong gives exit 2 and one paragraph.

Each case builds its inputs in a temporary directory, runs the real CLI entry in-process
(`distil.cli.main`), and asserts the exit code, the message's key phrases, that no traceback
was printed, that no weights were read to answer it, and that no output was left behind.
`distil train` rejects every case before its first step (all but the row lengths before any
model loads).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from distil.cli import main
from distil.testing import save_tokenizer

GOOD_ROW = {"nums": [3, 5, 7], "target": 22, "solution": "3 * 5 + 7"}


@dataclass
class Case:
    argv: list[str]
    phrases: list[str]
    files: dict[str, bytes | str] = field(default_factory=dict)
    absent: list[str] = field(default_factory=list)  # nothing written there
    config: dict | None = None  # written to c.yaml over the base config


def base_config() -> dict:
    return {
        "data": {"train": "data/train.jsonl", "template": "countdown_plain"},
        "student": {"path": "models/student"},
        "teacher": {"path": "models/student"},
        "train": {"output_dir": "runs/x", "max_steps": 2, "per_device_batch_size": 4},
        "logging": {"progress": False},
        "loss": {"name": "jsd"},
    }


def good_data() -> str:
    return json.dumps(GOOD_ROW) + "\n"


def with_keys(**sections) -> dict:
    cfg = base_config()
    for dotted, value in sections.items():
        section, key = dotted.split("__")
        cfg[section][key] = value
    return cfg


TRAIN = ["train", "c.yaml"]
VALIDATE = ["config", "validate", "c.yaml"]
DEEP = '{"prompt": ' + "[" * 5000 + "]" * 5000 + "}\n"

CASES = {
    # --- data files (item 5)
    "jsonl-not-utf8": Case(
        TRAIN,
        ["data/train.jsonl:2", "not UTF-8", "b'\\xff'"],
        {"data/train.jsonl": good_data().encode() + b'{"nums": [1, 2], "target": "\xff"}\n'},
        ["runs/x"],
    ),
    "dir-not-a-dataset": Case(
        TRAIN,
        ["not a dataset written by Dataset.save_to_disk"],
        {"data/train/readme.txt": "hello"},
        ["runs/x"],
        with_keys(data__train="data/train"),
    ),
    "text-named-parquet": Case(
        TRAIN,
        ["data/train.parquet", "cannot read as parquet"],
        {"data/train.parquet": "nums,target\n1,2\n"},
        ["runs/x"],
        with_keys(data__train="data/train.parquet"),
    ),
    "unsupported-suffix": Case(
        TRAIN,
        ["unsupported file type '.txt'"],
        {"data/train.txt": good_data()},
        ["runs/x"],
        with_keys(data__train="data/train.txt"),
    ),
    "train-output-dir-is-a-file": Case(
        TRAIN,
        ["train.output_dir = 'runs'", "is a file, not a directory"],
        {"runs": "a file"},
        [],
        with_keys(train__output_dir="runs"),
    ),
    "train-output-dir-under-a-file": Case(
        TRAIN,
        ["sits under 'runs', which is a file"],
        {"runs": "a file"},
        [],
        with_keys(train__output_dir="runs/x/y"),
    ),
    "generate-out-is-a-file": Case(
        ["countdown", "generate", "--n", "5", "--test-n", "2", "--out", "out"],
        ["--out = 'out' is a file"],
        {"out": "a file"},
    ),
    "generate-out-under-a-file": Case(
        ["countdown", "generate", "--n", "5", "--test-n", "2", "--out", "out/d"],
        ["sits under 'out'"],
        {"out": "a file"},
    ),
    "tokenizer-out-under-a-file": Case(
        ["tokenizer", "train", "--family", "bpe", "--data", "data/train.jsonl", "--out", "o/t"],
        ["--out = 'o/t' sits under 'o'"],
        {"o": "a file"},
    ),
    "init-model-out-under-a-file": Case(
        ["init-model", "--tokenizer", "models/student", "--out", "o/m"],
        ["--out = 'o/m' sits under 'o'"],
        {"o": "a file"},
    ),
    # --- data rows
    "json-nested-5000-deep": Case(
        TRAIN, ["data/train.jsonl:1", "nested too deeply"], {"data/train.jsonl": DEEP}, ["runs/x"]
    ),
    "json-int-over-4300-digits": Case(
        TRAIN,
        ["data/train.jsonl:2", "too long to read"],
        {"data/train.jsonl": good_data() + '{"nums": [1, 2], "target": ' + "7" * 5000 + "}\n"},
        ["runs/x"],
    ),
    "lone-surrogate": Case(
        TRAIN,
        ["data/train.jsonl:1", "lone surrogate"],
        {"data/train.jsonl": '{"prompt": "a\\ud800b", "completion": "x"}\n'},
        ["runs/x"],
        with_keys(data__template=None),
    ),
    "booleans-as-countdown-numbers": Case(
        TRAIN,
        ["data/train.jsonl:1", "'nums' must be a list of positive integers", "True"],
        {"data/train.jsonl": '{"nums": [true, 3, 4], "target": 7}\n'},
        ["runs/x"],
    ),
    "boolean-target": Case(
        TRAIN,
        ["data/train.jsonl:1", "'target' must be an integer"],
        {"data/train.jsonl": '{"nums": [2, 3, 4], "target": false}\n'},
        ["runs/x"],
    ),
    # --- paths (item 7)
    "mistyped-local-data-path": Case(
        TRAIN,
        ["data.train = 'data/trian.jsonl'", "no such local file"],
        {},
        ["runs/x"],
        with_keys(data__train="data/trian.jsonl"),
    ),
    "mistyped-data-path-in-validate": Case(
        VALIDATE,
        ["no such local file"],
        {},
        [],
        with_keys(data__train="./countdown"),
    ),
    "data-path-of-an-unknown-user": Case(
        TRAIN,
        ["data.train = '~nosuchuser0/d.jsonl': no such local file"],
        {},
        ["runs/x"],
        with_keys(data__train="~nosuchuser0/d.jsonl"),
    ),
    "data-path-name-too-long": Case(
        TRAIN, ["File name too long"], {}, ["runs/x"], with_keys(data__train="x" * 300 + ".jsonl")
    ),
    "output-dir-with-nul-byte": Case(
        TRAIN, ["holds a NUL byte"], {}, [], with_keys(train__output_dir="runs/a\x00b")
    ),
    "chat-message-role-not-a-string": Case(
        TRAIN,
        ["data/train.jsonl:1", "column 'prompt' must be"],
        {"data/train.jsonl": '{"prompt": [{"role": 1, "content": "hi"}]}\n'},
        ["runs/x"],
        with_keys(data__template=None),
    ),
    "missing-student-path": Case(
        TRAIN,
        ["student.path = 'models/studnet'", "no such local directory"],
        {},
        ["runs/x"],
        with_keys(student__path="models/studnet"),
    ),
    # --- config values (item 8 and fuzzing classes)
    "seq-kd-with-lambda-1": Case(
        VALIDATE, ["train.seq_kd=true", "train.lambda = 1.0"], {}, [], with_keys(train__seq_kd=True)
    ),
    "huge-batch-with-generations": Case(
        [*VALIDATE, "train.per_device_batch_size=100000000001", "generation.num_generations=2"],
        ["a divisor of 100000000001"],
    ),
    "override-unbalanced-bracket": Case(
        [*VALIDATE, "train.lr=["], ["'train.lr=['", "not valid YAML"]
    ),
    "override-empty-key-part": Case([*VALIDATE, "train..lr=1"], ["is not key=value"]),
    "lr-infinite": Case([*VALIDATE, "train.lr=.inf"], ["'train.lr' = inf"]),
    "config-not-utf8": Case(VALIDATE, ["c.yaml is not UTF-8"], {"c.yaml": b"train:\n  lr: \xff\n"}),
    "config-is-a-directory-without-config": Case(
        ["config", "validate", "somedir"], ["somedir/config.yaml does not exist"], {"somedir/x": ""}
    ),
    "config-billion-laughs": Case(
        VALIDATE,
        ["more than 100000 values"],
        {
            "c.yaml": "a: &a [1,1,1,1,1,1,1,1,1,1]\n"
            + "".join(
                f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n"
                for p, n in zip("abcdefg", "bcdefgh", strict=True)
            )
        },
    ),
    "config-non-string-key": Case(VALIDATE, ["key 1 (int) is not a name"], {"c.yaml": "1: 2\n"}),
    "config-validate-vocab-mismatch": Case(
        VALIDATE,
        ["teacher's tokenizer differs from the student's", "cross-tokenizer loss"],
        {},
        [],
        with_keys(teacher__path="models/teacher_char"),
    ),
    "config-validate-bad-row": Case(
        VALIDATE,
        ["data/train.jsonl:1", "'nums' must be"],
        {"data/train.jsonl": '{"nums": [true, 3, 4], "target": 7}\n'},
    ),
    "prompt-far-over-max-tokens": Case(
        TRAIN,
        [
            "1 of 2 prompts are longer than data.max_prompt_tokens = 256",
            "data/train.jsonl:2",
            "data.overlong=truncate",
        ],
        {
            "data/train.jsonl": '{"prompt": "short", "completion": "a"}\n'
            + json.dumps({"prompt": "long text " * 400, "completion": "b"})
            + "\n"
        },
        ["runs/x"],
        with_keys(data__template=None),
    ),
    "completion-over-max-tokens-in-validate": Case(
        [*VALIDATE, "train.lambda=0", "data.max_completion_tokens=8"],
        ["1 of 1 completions are longer than data.max_completion_tokens = 8", "data/train.jsonl:1"],
        {"data/train.jsonl": json.dumps({"prompt": "p", "completion": "word " * 200}) + "\n"},
        [],
        with_keys(data__template=None),
    ),
    "teacher-top-k-with-cross-tokenizer-loss": Case(
        VALIDATE,
        ["teacher.top_k = 8 with loss.name = 'aligned_kl'", "teacher.top_k=null"],
        {},
        [],
        with_keys(teacher__top_k=8, loss__name="aligned_kl"),
    ),
    "config-validate-unknown-loss": Case(
        VALIDATE, ["loss.name='nope' is not a known loss"], {}, [], with_keys(loss__name="nope")
    ),
}
for tag in ("!!timestamp x", "!!bool maybe", "2001-13-45", "!!float x", "!!int x", "!!binary x"):
    CASES[f"yaml-file {tag}"] = Case(
        VALIDATE, ["c.yaml", "cannot build a value"], {"c.yaml": f"train:\n  lr: {tag}\n"}
    )
    CASES[f"yaml-override {tag}"] = Case(
        [*VALIDATE, f"train.lr={tag}"], [f"override 'train.lr={tag}'"]
    )
CASES["yaml-file !!binary x"].phrases = ["c.yaml is not valid YAML", "base64"]
CASES["yaml-override !!binary x"].phrases.append("base64")


@pytest.fixture
def workdir(tmp_path, monkeypatch, tiny_model_dir, char_tokenizer):
    (tmp_path / "models").mkdir()
    (tmp_path / "models/student").symlink_to(tiny_model_dir)
    save_tokenizer(char_tokenizer, tmp_path / "models/teacher_char")
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(root: Path, case: Case) -> None:
    files = {"data/train.jsonl": good_data(), **case.files}
    if "c.yaml" not in files:
        files["c.yaml"] = yaml.safe_dump(case.config or base_config())
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)


def run_cli(capsys, argv):
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


# `distil train` measures the rows' token lengths after the models load (the limits come from
# them); it still stops before the first step and writes nothing
LOADS_MODELS = {"prompt-far-over-max-tokens"}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_exits_2_with_one_paragraph(name, workdir, capsys, monkeypatch):
    from transformers import AutoModelForCausalLM

    case = CASES[name]
    write(workdir, case)
    before = sorted(p.relative_to(workdir) for p in workdir.rglob("*"))
    loads, real = [], AutoModelForCausalLM.from_pretrained

    def recorded(*args, **kwargs):
        loads.append(args[0] if args else kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", recorded)
    code, out, err = run_cli(capsys, case.argv)
    assert code == 2, (out, err)
    assert err.startswith("distil: error: ") and "Traceback" not in err
    for phrase in case.phrases:
        assert phrase in err, f"{phrase!r} not in {err!r}"
    # answered at once: no weights were read, except where the rows' token lengths need the
    # models' limits (those cases stop before the first step)
    assert (loads != []) == (name in LOADS_MODELS), loads
    for path in case.absent:
        assert not (workdir / path).exists()
    after = sorted(p.relative_to(workdir) for p in workdir.rglob("*"))
    assert after == before, "the failed command left files behind"


TRAIN_CASES = [name for name, case in CASES.items() if case.argv == TRAIN]


@pytest.mark.parametrize("name", TRAIN_CASES)
def test_config_validate_rejects_what_train_rejects(name, workdir, capsys):
    """`config validate` prints ok only when `distil train` would start."""
    write(workdir, CASES[name])
    code, out, err = run_cli(capsys, VALIDATE)
    assert code == 2 and ": ok" not in out, (out, err)
    assert err.startswith("distil: error: ") and "Traceback" not in err


def test_the_base_config_is_good(workdir, capsys):
    """The corpus's base config passes, so each case fails for its own reason only."""
    write(workdir, Case([], []))
    code, out, err = run_cli(capsys, VALIDATE)
    assert code == 0 and out.strip().endswith("c.yaml: ok"), err
