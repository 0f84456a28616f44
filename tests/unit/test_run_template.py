"""A run on rows with rendered prompts (data.template: null, e.g. `distil generate`'s output)
evaluates and records its student's prompt template, not none."""

import json
import shutil

from distil.config import build_config
from distil.eval.runner import run_template
from distil.models.load import read_model_meta, write_model_meta
from distil.train import loop
from distil.train.evaluation import eval_set as eval_problems


def rendered_rows(countdown_dir, tmp_path):
    """The tests' train rows as `distil generate` writes them: chat-message prompt, completion."""
    out = tmp_path / "written.jsonl"
    rows = [json.loads(x) for x in (countdown_dir / "train.jsonl").read_text().splitlines()]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def test_rendered_rows_take_the_students_template(tmp_path, make_train_config, countdown_dir):
    student = tmp_path / "student"
    shutil.copytree(make_train_config()["student"]["path"], student)
    write_model_meta(student, template="countdown_plain")
    over = {
        "data": {"train": str(rendered_rows(countdown_dir, tmp_path)), "template": None},
        "student": {"path": str(student)},
    }
    cfg = build_config(make_train_config(**over, loss={"name": "sft"}, train={"lambda": 0.0}))
    assert run_template(cfg) == "countdown_plain"
    task, problems = eval_problems(cfg)
    assert task.cfg.template == "countdown_plain"
    # the prompt the student is evaluated on is the one it was trained on, arrow included
    assert task.messages(problems[0])[0]["content"].startswith("nums:")
    loop.train(cfg)
    assert read_model_meta(tmp_path / "run" / "final")["template"] == "countdown_plain"
    # eval.template still wins; without a recorded template there is none to take
    named = build_config(make_train_config(**over, eval={"template": "countdown_chat"}))
    assert eval_problems(named)[0].cfg.template == "countdown_chat"
    bare = build_config(make_train_config(data={"template": None}))
    assert run_template(bare) is None
