"""A run on rows with rendered prompts (data.template: null, e.g. `distil generate`'s output)
evaluates and records its student's prompt template, not none."""

import json
import shutil

from distil.config import build_config
from distil.eval.runner import run_template
from distil.models.load import read_model_meta, write_model_meta
from distil.tasks.countdown.templates import TEMPLATES, template_of
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
    # without either, the template that rendered the rows: these are countdown_plain's
    bare = build_config(make_train_config(data={"template": None}))
    assert run_template(bare) == "countdown_plain"


def test_rows_name_the_template_that_rendered_them(tmp_path, make_train_config):
    """`template_of`: the one template whose messages are every row's prompt (messages, or a
    single user turn's text); none for rows another way, mixed, or without nums/target."""
    chat, plain = TEMPLATES["countdown_chat"], TEMPLATES["countdown_plain"]
    probs = [([3, 5, 7], 8), ([10, 2, 4], 20)]
    rows = {
        name: [{"nums": n, "target": t, "prompt": tm.messages(n, t)} for n, t in probs]
        for name, tm in (("countdown_chat", chat), ("countdown_plain", plain))
    }
    assert template_of(rows["countdown_chat"]) == "countdown_chat"
    assert template_of(rows["countdown_plain"]) == "countdown_plain"
    text = [{"nums": n, "target": t, "q": plain.messages(n, t)[0]["content"]} for n, t in probs]
    assert template_of(text, prompt_field="q") == "countdown_plain"
    assert template_of(text) is None  # no "prompt" column
    mixed = [rows["countdown_chat"][0], rows["countdown_plain"][1]]
    assert template_of(mixed) is None
    other = [{"nums": [3, 5, 7], "target": 8, "prompt": "use 3 5 7 to make 8"}]
    assert template_of(other) is None
    assert template_of([{"prompt": "nums: 3 5 7 target: 8"}]) is None
    assert template_of([]) is None
    # a run on such rows, with a student that records nothing, takes it from the file
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows["countdown_chat"]))
    cfg = build_config(make_train_config(data={"train": str(path), "template": None}))
    assert run_template(cfg) == "countdown_chat"


def test_eval_says_when_it_guesses_the_template(tmp_path, make_train_config, capsys):
    """A model with no recorded template is prompted with countdown_chat, and told so."""
    from distil.eval.runner import with_model_template
    from distil.tasks import make_task

    student = make_train_config()["student"]["path"]
    task = make_task(build_config(make_train_config()).eval.model_copy(update={"template": None}))
    assert with_model_template(task, student) is task
    assert "no Countdown template is recorded" in capsys.readouterr().err
    named = make_task(task.cfg.model_copy(update={"template": "countdown_plain"}))
    with_model_template(named, student)
    assert capsys.readouterr().err == ""
