"""The demo's char student trained by sequence-level KD with the teacher writing 1 and K windows
per generate call (`generation.teacher_windows`), side by side in one run.

The demo's cross-tokenizer distillation and its sequence-level KD control read completions the
teacher wrote beforehand; here both write them step by step instead (`train.seq_kd=true` on the
prompts, as the demo did until 2026-11-26). For each of the two configs and each K, `distil train` runs `--steps` steps from a finished demo's models and
data, and the mean seconds per step of each phase (generate, teacher, train) over the steps after
the first block are printed with the ratio to K = 1. Run it on an otherwise idle machine.

    python bench/teacher_windows.py --demo runs/demo --windows 1,8 --steps 40
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

CONFIGS = {"distill_cross_tokenizer": "cross-tokenizer, aligned KL", "control_seqkd": "seq-KD"}
PHASES = ("time/step", "time/generate", "time/teacher", "time/train")


def run(demo: Path, config: str, k: int, steps: int, threads: int, out: Path) -> dict:
    from distil.config import load_config
    from distil.demo.presets import CONFIG_DIR
    from distil.train.loop import train

    student = sorted(demo.glob("**/models/student_char_start"))[0]
    items = [
        f"data.train={demo / 'data' / 'prompts.jsonl'}",
        "data.template=countdown_plain",
        "train.seq_kd=true",
        "train.lambda=0.0",
        "generation.max_new_tokens=48",
        "generation.temperature=0.7",
        f"student.path={student}",
        f"teacher.path={demo / 'models' / 'teacher'}",
        f"train.output_dir={out}",
        f"eval.data={demo / 'data' / 'test.jsonl'}",
        "train.eval_every=1000000",
        f"train.max_steps={steps}",
        f"train.num_threads={threads}",
        "train.resume=never",
        "train.save_every_minutes=null",
        "logging.progress=false",
        "train.log_every=1",
        f"generation.teacher_windows={k}",
    ]
    train(load_config(CONFIG_DIR / f"{config}.yaml", items))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["step"] > max(k, 8)]  # past the first block and warm-up
    return {p: statistics.mean(r.get(p, 0.0) for r in rows) for p in PHASES}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demo", type=Path, required=True, help="a finished `distil demo --out` dir")
    p.add_argument("--windows", default="1,8", help="comma-separated K values")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    ks = [int(x) for x in a.windows.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        for config, label in CONFIGS.items():
            res = {
                k: run(a.demo, config, k, a.steps, a.threads, Path(tmp) / f"{config}{k}")
                for k in ks
            }
            print(f"\n{label} ({config}), {a.steps} steps, {a.threads} threads, mean s/step")
            print("K    " + "  ".join(f"{ph[5:]:>9}" for ph in PHASES) + "  step vs K=1")
            for k in ks:
                cells = "  ".join(f"{res[k][ph]:9.3f}" for ph in PHASES)
                print(f"{k:<4} {cells}  {res[k]['time/step'] / res[ks[0]]['time/step']:.2f}x")


if __name__ == "__main__":
    main()
