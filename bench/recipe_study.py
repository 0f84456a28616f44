"""The same-tokenizer recipe study: one recipe of the demo's on-policy
distillation of the bpe student, run on every seed of a multi-seed demo from that seed's own
start, with the demo's teacher, data and budgets, then judged as the demo judges (500 test
problems, greedy, 32 new tokens).

    OMP_NUM_THREADS=2 python bench/recipe_study.py run --demo runs/demo3 --name lr1e3 \\
        train.lr=1.0e-3                       # overrides of distill_same_tokenizer.yaml
    python bench/recipe_study.py table --demo runs/demo3 [NAME ...]

`run` takes the demo's own `distil train` command of the same-tokenizer stage for seed k (from
results.json), moves its output under --root, appends the overrides (`{seed_dir}` in one reads
as that seed's directory, e.g. `data.train={seed_dir}/written/teacher.jsonl`: the seed's
teacher-written completions) and evaluates the final model. `table` prints, per recipe:
accuracy per seed, mean ± sd, the gap recovered (teacher and start from the demo's results.json), student compute relative to the demo's recipe, and the
paired lead (95% t interval) over the demo's continued-SFT control and over the demo's recipe.
A recipe with more student compute than the demo's is marked: its comparison is not at equal
cost.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from distil.demo.stats import mean_sd, paired

STAGE = "distill_same_tokenizer"
CONTROL = "control_sft_bpe"
DISTILLED = "on-policy distilled, same tokenizer"


def _results(demo: Path) -> dict:
    path = demo / "results.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _seed_dirs(demo: Path, n: int) -> list[Path]:
    return [demo / f"seed{k}" for k in range(n)] if n > 1 else [demo]


def _stage_command(results: dict, demo: Path, seed_dir: Path, seed: int) -> list[str]:
    """The demo's `distil train` command of the same-tokenizer stage of this seed: from
    results.json, or (a demo still running) as the full preset's stage runs it."""
    marker = f"train.output_dir={seed_dir}/runs/{STAGE}"
    for cmd in results.get("commands", []):
        if marker in cmd.split():
            return shlex.split(cmd)
    from distil.demo.presets import CONFIG_DIR, manifest

    preset = manifest().presets["full"]
    return [
        "distil", "train", str(CONFIG_DIR / f"{STAGE}.yaml"),
        f"data.train={demo}/data/prompts.jsonl",
        f"student.path={seed_dir}/models/student_bpe_start",
        f"teacher.path={demo}/models/teacher", marker, f"eval.data={demo}/data/test.jsonl",
        f"eval.n={preset.eval_n}", f"train.seed={seed}", f"train.max_steps={preset.steps['same']}",
        "train.num_threads=2", "train.save_every_minutes=null",
    ]  # fmt: skip


def run(
    demo: Path, root: Path, name: str, overrides: list[str], seeds: list[int], n_seeds: int
) -> None:
    results = _results(demo)
    dirs = _seed_dirs(demo, int(results.get("seeds") or n_seeds))
    for k in seeds:
        out = root / name / f"seed{k}"
        if (out / "final.json").exists():
            print(f"{name} seed {k}: done already")
            continue
        cmd = _stage_command(results, demo, dirs[k], k)
        cmd = [c for c in cmd if not c.startswith("train.output_dir=")]
        if not Path(cmd[2]).is_file():  # the demo ran from another checkout
            from distil.demo.presets import CONFIG_DIR

            cmd[2] = str(CONFIG_DIR / Path(cmd[2]).name)
        own = [o.replace("{seed_dir}", str(dirs[k])) for o in overrides]
        cmd += [f"train.output_dir={out / 'run'}", "train.resume=never", *own]
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "distil", *cmd[1:]], check=True)
        train_s = time.perf_counter() - t0
        report = out / "eval"
        subprocess.run(
            [sys.executable, "-m", "distil", "eval", "--model", str(out / "run" / "final"),
             "--data", str(demo / "data" / "test.jsonl"), "--n", "500",
             "--max-new-tokens", "32", "--batch-size", "128", "--template", "countdown_plain",
             "--out", str(report), "--no-progress"],
            check=True,
        )  # fmt: skip
        acc = _accuracy(report)
        flops = _last(out / "run" / "metrics.jsonl", "cost/student_flops")
        (out / "final.json").write_text(
            json.dumps(
                {
                    "accuracy": acc,
                    "student_flops": flops,
                    "train_seconds": train_s,
                    "overrides": overrides,
                }
            )
        )
        print(f"{name} seed {k}: {100 * acc:.1f}% in {train_s / 60:.1f} min")


def _accuracy(report: Path) -> float:
    """The accuracy in `distil eval`'s report.json (one model)."""
    return float(json.loads((report / "report.json").read_text())["models"][0]["accuracy"])


def _last(path: Path, key: str) -> float | None:
    value = None
    for line in path.read_text().splitlines():
        row = json.loads(line)
        value = row.get(key, value)
    return value


def _demo_rows(results: dict, label: str) -> list[dict]:
    """The row's result on each seed (accuracy, student_flops, ...)."""
    row = next(r for r in results["rows"] if r["model"] == label)
    return row.get("per_seed") or [row]


def table(demo: Path, root: Path, names: list[str]) -> None:
    results = _results(demo)
    labels = {r["model"] for r in results["rows"]}
    control = _demo_rows(results, next(x for x in labels if "continued SFT" in x and "bpe" in x))
    default = _demo_rows(results, next(x for x in labels if DISTILLED in x))
    teacher = _demo_rows(results, next(x for x in labels if x.startswith("teacher")))
    start = _demo_rows(results, next(x for x in labels if "bpe" in x and "start" in x))
    n = len(default)
    print(
        "| recipe | overrides | accuracy per seed | mean ± sd | gap | compute vs demo | "
        "lead over SFT (95% CI) | lead over demo recipe (95% CI) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in names or sorted(p.name for p in root.glob("*") if p.is_dir()):
        seeds = [root / name / f"seed{k}" / "final.json" for k in range(n)]
        if not all(p.exists() for p in seeds):
            print(f"| {name} | (incomplete: {sum(p.exists() for p in seeds)}/{n} seeds) |")
            continue
        runs = [json.loads(p.read_text()) for p in seeds]
        acc = [r["accuracy"] for r in runs]
        m, sd = mean_sd(acc)
        gaps = [
            (a - s["accuracy"]) / max(t["accuracy"] - s["accuracy"], 1e-9)
            for a, s, t in zip(acc, start, teacher, strict=True)
        ]
        ratio = sum(r["student_flops"] for r in runs) / sum(d["student_flops"] for d in default)
        lead_c = paired(acc, [c["accuracy"] for c in control])
        lead_d = paired(acc, [d["accuracy"] for d in default])
        print(
            f"| {name} | {' '.join(runs[0]['overrides'])} | "
            f"{' / '.join(f'{100 * a:.1f}' for a in acc)} | {100 * m:.1f} ± {100 * (sd or 0):.1f} | "
            f"{100 * sum(gaps) / n:.0f}% | {ratio:.2f}{' (more)' if ratio > 1.01 else ''} | "
            f"{_ci(lead_c)} | {_ci(lead_d)} |"
        )


def _ci(d) -> str:
    if d.half_width is None:
        return f"{100 * d.mean:+.1f}"
    return f"{100 * d.mean:+.1f} ± {100 * d.half_width:.1f}{'' if d.significant else ' (ns)'}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["run", "table"])
    p.add_argument("--demo", type=Path, required=True, help="a `distil demo --seeds N` --out")
    p.add_argument("--root", type=Path, default=None, help="default: <demo>/recipes")
    p.add_argument("--name", default=None)
    p.add_argument("--seeds", default=None, help="comma-separated seeds (default: all)")
    p.add_argument("--n-seeds", type=int, default=3, help="the demo's --seeds while it runs")
    p.add_argument("rest", nargs="*", help="run: config overrides; table: recipe names")
    a = p.parse_intermixed_args()
    root = a.root or a.demo / "recipes"
    if a.what == "run":
        n = int(_results(a.demo).get("seeds") or a.n_seeds)
        seeds = [int(s) for s in a.seeds.split(",")] if a.seeds else list(range(n))
        run(a.demo, root, a.name or "recipe", a.rest, seeds, n)
    else:
        table(a.demo, root, a.rest)


if __name__ == "__main__":
    main()
