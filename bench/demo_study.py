"""The demo recipe study: runs demo stages with overrides through distil's own
training API, then tabulates accuracy against steps and against student cost.

    OMP_NUM_THREADS=2 python bench/demo_study.py setup --root /work/study-runs --teacher-steps 1500
    OMP_NUM_THREADS=2 python bench/demo_study.py run NAME CONFIG [key=value ...] [--final]
    python bench/demo_study.py table [NAME ...]        # one row per run
    python bench/demo_study.py plot --png docs/img/study.png NAME ...

CONFIG is a stage under src/distil/demo/configs/ (e.g. distill_same_tokenizer); the run's student,
teacher and data paths point at the artefacts under --root unless overridden.

Cost (shared with the demo): student cost = 2 * N_student * (3 * T_train + T_prefill + T_gen),
from each step of metrics.jsonl: T_train = `tokens/input_local` (non-pad prompt + completion
tokens through the training forward/backward), and for the on-policy share p of the window
(`policy/on_policy_share`) of B rows with `completion/mean_tokens` m: T_gen = p * B * m and
T_prefill = p * (T_train - B * m) (prompt tokens of the rows the student sampled). Teacher
FLOPs (reported, not equalized): 2 * N_teacher * T_train for scoring (distillation losses),
plus 2 * N_teacher * (prompt + generated tokens) of teacher-written (seq-KD) rows.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path("/work/study-runs")
DISTILL_LOSSES = {"sft"}  # losses that need no teacher scores


def _paths(root: Path) -> dict[str, Path]:
    return {k: root / k for k in ("data", "tokenizers", "models", "runs")}


def _demo_run(root: Path, threads: int):
    from distil.demo.presets import manifest
    from distil.demo.run import DemoRun

    m = manifest()
    return DemoRun(root, "full", m.presets["full"], m, threads, root / "cache")


# ----------------------------------------------------------------------------- setup


def setup(root: Path, teacher_steps: int, start_steps: int, threads: int) -> None:
    """Data, tokenizers, a teacher trained for `teacher_steps` (WSD), both student starts."""
    import torch

    from distil.demo.stages import _init, make_data, make_tokenizers

    torch.set_num_threads(threads)
    run = _demo_run(root, threads)
    make_data(run)
    make_tokenizers(run)
    p = _paths(root)
    teacher = p["models"] / "teacher"
    if not (teacher / "config.json").exists():
        init = _init(run, "bpe", p["models"] / "teacher_init", run.preset.teacher, 0)
        train_run(
            root,
            "teacher",
            "teacher",
            [
                f"student.path={init}",
                f"data.train={p['data'] / 'train.jsonl'}",
                f"train.max_steps={teacher_steps}",
                "train.max_minutes=null",
            ],
            threads,
        )
        shutil.copytree(p["runs"] / "teacher" / "final", teacher)
    for tok, seed in (("char", 1), ("bpe", 2)):
        start = p["models"] / f"student_{tok}_start"
        if (start / "config.json").exists():
            continue
        init = _init(run, tok, p["models"] / f"student_{tok}_init", run.preset.student, seed)
        name = f"student_{tok}_start"
        train_run(
            root,
            name,
            "student_start",
            [
                f"student.path={init}",
                f"data.train={p['data'] / 'labelled.jsonl'}",
                f"train.max_steps={start_steps}",
            ],
            threads,
        )
        shutil.copytree(p["runs"] / name / "final", start)


# ----------------------------------------------------------------------------- runs


def _defaults(root: Path, config: str, name: str) -> list[str]:
    p = _paths(root)
    out = [f"train.output_dir={p['runs'] / name}", f"eval.data={p['data'] / 'test.jsonl'}"]
    student = "student_char_start" if "cross" in config or "control" in config else None
    if config == "distill_same_tokenizer":
        student = "student_bpe_start"
    if student:
        out.append(f"student.path={p['models'] / student}")
    if config.startswith("distill") or config == "control_seqkd":
        out += [
            f"teacher.path={p['models'] / 'teacher'}",
            f"data.train={p['data'] / 'prompts.jsonl'}",
        ]
    if config == "control_sft":
        out.append(f"data.train={p['data'] / 'labelled.jsonl'}")
    if config != "teacher" and config != "student_start":
        out.append("train.max_minutes=null")
    return out


def train_run(root: Path, name: str, config: str, overrides: list[str], threads: int) -> None:
    """configs/demo/<config>.yaml with the study's paths, then `overrides` (later wins)."""
    import torch

    from distil.config import load_config
    from distil.train.loop import train

    torch.set_num_threads(threads)
    items = _defaults(root, config, name) + list(overrides)
    items += [f"train.num_threads={threads}", "train.resume=never"]
    out = _paths(root)["runs"] / name
    shutil.rmtree(out, ignore_errors=True)
    from distil.demo.presets import CONFIG_DIR

    cfg = load_config(CONFIG_DIR / f"{config}.yaml", items)
    t0 = time.perf_counter()
    train(cfg)
    seconds = time.perf_counter() - t0
    (out / "study.json").write_text(
        json.dumps({"config": config, "overrides": overrides, "seconds": seconds}, indent=1)
    )
    print(f"{name}: {seconds / 60:.2f} min", flush=True)


def final_eval(root: Path, name: str, n: int) -> float:
    """Greedy accuracy of runs/<name>/final (or models/<name>) on the first n test problems."""
    from distil.config import EvalConfig
    from distil.eval.runner import evaluate_model
    from distil.tasks.countdown import Countdown

    p = _paths(root)
    model = p["runs"] / name / "final"
    if not model.exists():
        model = p["models"] / name
    cfg = EvalConfig(
        data=str(p["data"] / "test.jsonl"),
        n=n,
        max_new_tokens=32,  # as the demo's report
        batch_size=128,
        template="countdown_plain",
    )
    t0 = time.perf_counter()
    acc = evaluate_model(str(model), Countdown(cfg), name=name, progress=False).summary["accuracy"]
    record = p["runs"] / name / "final_eval.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"n": n, "accuracy": acc, "seconds": time.perf_counter() - t0}))
    print(f"{name}: final accuracy {100 * acc:.1f}% on {n} test problems", flush=True)
    return acc


# ----------------------------------------------------------------------------- cost


def n_params(model_dir: Path) -> int:
    from safetensors import safe_open

    total = 0
    for f in model_dir.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():  # noqa: SIM118 (safe_open is not iterable)
                total += _numel(st, k)
    return total


def _numel(st, key: str) -> int:
    n = 1
    for d in st.get_slice(key).get_shape():
        n *= d
    return n


def step_cost(m: dict[str, Any], batch: int, n_student: int, n_teacher: int, teacher_scores: bool):
    """(student FLOPs, teacher FLOPs) of one logged step (see the module doc)."""
    from distil.train.cost import student_flops, teacher_flops

    t_train = m["tokens/input_local"]
    completion = batch * m.get("completion/mean_tokens", 0.0)
    prompts = max(t_train - completion, 0.0)
    on = m.get("policy/on_policy_share", 0.0)
    seqkd = m.get("policy/seq_kd_share", 0.0)
    student = student_flops(n_student, t_train, on * prompts, on * completion)
    score = t_train if teacher_scores else 0
    teacher = teacher_flops(n_teacher, score, seqkd * prompts, seqkd * completion)
    return student, teacher


def load_run(root: Path, name: str) -> dict[str, Any]:
    """Steps, evals and cumulative costs of runs/<name>."""
    import yaml

    d = _paths(root)["runs"] / name
    cfg = yaml.safe_load((d / "config.yaml").read_text())
    batch = cfg["train"]["per_device_batch_size"] * cfg["train"].get("grad_accum_steps", 1)
    n_s = n_params(Path(cfg["student"]["path"]))
    teacher_path = (cfg.get("teacher") or {}).get("path")
    n_t = n_params(Path(teacher_path)) if teacher_path else 0
    scores = cfg["loss"]["name"] not in DISTILL_LOSSES
    rows, evals, s_cost, t_cost, seen = [], [], 0.0, 0.0, set()
    for line in (d / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "tokens/input_local" in m and m["step"] not in seen:
            seen.add(m["step"])
            s, t = step_cost(m, batch, n_s, n_t, scores)
            s_cost, t_cost = s_cost + s, t_cost + t
            rows.append((m["step"], s_cost, t_cost))
        if "eval/accuracy" in m:
            evals.append((m["step"], s_cost, m["eval/accuracy"]))
    study = json.loads((d / "study.json").read_text()) if (d / "study.json").exists() else {}
    final = d / "final_eval.json"
    return {
        "name": name,
        "steps": rows[-1][0] if rows else 0,
        "student_flops": s_cost,
        "teacher_flops": t_cost,
        "evals": evals,
        "final": json.loads(final.read_text()) if final.exists() else None,
        "minutes": study.get("seconds", 0.0) / 60,
        "overrides": study.get("overrides", []),
        "config": study.get("config", ""),
    }


def matched_steps(root: Path, name: str, reference: str) -> int:
    """Steps of a run like `reference` (its mean student cost per step) that cost what `name`
    cost: the equal-cost control's budget."""
    run, ref = load_run(root, name), load_run(root, reference)
    per_step = ref["student_flops"] / max(ref["steps"], 1)
    return round(run["student_flops"] / per_step)


def table(root: Path, names: list[str]) -> str:
    head = "| run | config | steps | min | student TF | teacher TF | evals (step: acc) | final |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for name in names:
        r = load_run(root, name)
        ev = " ".join(f"{s}:{100 * a:.0f}" for s, _, a in r["evals"])
        fin = r["final"]
        fin_s = f"{100 * fin['accuracy']:.1f}% (n={fin['n']})" if fin else ""
        lines.append(
            f"| {name} | {r['config']} {' '.join(r['overrides'])} | {r['steps']} | "
            f"{r['minutes']:.2f} | {r['student_flops'] / 1e12:.2f} | "
            f"{r['teacher_flops'] / 1e12:.2f} | {ev} | {fin_s} |"
        )
    return "\n".join(lines)


def plot(root: Path, names: list[str], png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name in names:
        r = load_run(root, name)
        if not r["evals"]:
            continue
        steps, cost, acc = zip(*r["evals"], strict=True)
        a.plot(steps, [100 * x for x in acc], marker=".", label=name)
        b.plot([c / 1e12 for c in cost], [100 * x for x in acc], marker=".", label=name)
    a.set(xlabel="step", ylabel="accuracy (%)", title=title)
    b.set(xlabel="student TFLOPs", ylabel="accuracy (%)")
    a.legend(fontsize=7)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(png, dpi=90)


# ----------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--threads", type=int, default=2)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("setup")
    s.add_argument("--teacher-steps", type=int, default=1500)
    s.add_argument("--start-steps", type=int, default=300)
    r = sub.add_parser("run")
    r.add_argument("name")
    r.add_argument("config")
    r.add_argument("overrides", nargs="*")
    r.add_argument("--final", type=int, default=0, help="then evaluate on this many test rows")
    r.add_argument("--eval-only", action="store_true", help="no training: --final only")
    e = sub.add_parser("eval")
    e.add_argument("names", nargs="+")
    e.add_argument("--n", type=int, default=500)
    m = sub.add_parser("match", help="equal-cost steps of a run like REFERENCE")
    m.add_argument("name")
    m.add_argument("reference")
    t = sub.add_parser("table")
    t.add_argument("names", nargs="*")
    p = sub.add_parser("plot")
    p.add_argument("names", nargs="+")
    p.add_argument("--png", type=Path, required=True)
    p.add_argument("--title", default="")
    a = ap.parse_args(argv)
    if a.cmd == "setup":
        setup(a.root, a.teacher_steps, a.start_steps, a.threads)
    elif a.cmd == "run":
        if not a.eval_only:
            train_run(a.root, a.name, a.config, a.overrides, a.threads)
        if a.final:
            final_eval(a.root, a.name, a.final)
    elif a.cmd == "eval":
        for name in a.names:
            final_eval(a.root, name, a.n)
    elif a.cmd == "match":
        print(matched_steps(a.root, a.name, a.reference))
    elif a.cmd == "table":
        names = a.names or sorted(
            d.name for d in _paths(a.root)["runs"].iterdir() if (d / "metrics.jsonl").exists()
        )
        print(table(a.root, names))
    else:
        plot(a.root, a.names, a.png, a.title)


if __name__ == "__main__":
    sys.exit(main())
