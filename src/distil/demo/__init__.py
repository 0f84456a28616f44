"""`distil demo`: the whole pipeline on a CPU in minutes, with models it trains itself.

1. Countdown data (3 numbers from 1-99): a large train split, two held-out splits drawn alike
   (dev: in-training curves and recipe choices; test: read once per model, for the table), a
   small labelled set and the prompts (no answers) the students are distilled on.
2. Two tokenizers that cut text differently: a byte-level BPE for the teacher, characters for
   the cross-tokenizer student (the same-tokenizer student uses the teacher's BPE).
3. The teacher (~5M parameters) trained on reference solutions, cached by its settings.
4. Two students (~1M parameters) with a short supervised start on the labelled set only.
5. The teacher writes a completion for each of the seed's prompts once, in large batches
   (configs/teacher_writes.yaml, `distil generate`).
6. The runs of configs/demo.yaml, in order, from prompts only: the char student distilled
   across tokenizers (token-level aligned KL on those teacher-written completions), then
   its controls at the same student compute (FLOPs): sequence-level KD (cross-entropy on the
   same completions) and continued supervised training on the labelled set; the bpe student
   distilled on-policy with the teacher's tokenizer (forward KL) on the same prompts, then its
   controls at equal compute: sequence-level KD on the teacher's completions of those prompts
   and continued SFT.
7. Every model evaluated with the Countdown checker on the test split: a table (accuracy, share
   of the teacher-student gap recovered, steps, student compute) as Markdown and JSON, the
   paired leads with the pre-stated analysis (demo.yaml `analysis`: Holm over every
   comparison), and a plot.

Budgets are optimizer steps and the controls' budget is a FLOP count, so the same command on
the same machine and thread count prints the same table. Every training stage is an ordinary
config in distil/demo/configs/ run through `distil train`'s code path; the demo only fills
paths and budgets, and prints the equivalent commands.

`--seeds N` runs steps 4-6 on N seeds (data order, sampling, the starts' init; the teacher is
trained once) and reports mean ± sd and paired differences with 95% intervals (stats.py); the
table also gives each distilled student's compute to match its continued-SFT control.

`--tune` runs every run of demo.yaml at each learning rate of its pre-stated grid on a tuning
seed, scored on the dev split (tune.py); the configs carry the chosen rates.

Modules: presets.py (configs/demo.yaml), run.py (the run's state), stages.py, records.py (what
a finished stage ran, for --resume), teachers.py (the cached teacher, the expected time),
report.py, lanes.py (the students' stages in order or in worker processes side by side),
summary.py (rows over seeds, paired differences, compute to match), stats.py, plot.py,
tune.py, cli.py (`distil demo` arguments). Imports point one way: cli -> here -> tune ->
teachers, lanes -> stages -> records, report -> summary -> run -> presets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def run_demo(
    out: str | Path,
    *,
    preset: str = "full",
    threads: int = 2,
    cache_dir: str | Path | None = None,
    distill_scale: float = 1.0,
    command: str = "",
    seeds: int = 1,
    resume: bool = False,
    lanes: int = 1,
    tune: bool = False,
) -> dict[str, Any]:
    """Run every stage; returns the results (also written to out/results.{md,json}).

    `distill_scale` multiplies the step budgets of the distillation runs (and so the compute
    of the controls that follow them); `command` is printed with the table. `seeds`: the
    students' starts, distillation runs and controls on seeds 0..seeds-1 (the data, tokenizers
    and teacher are shared); the table gives mean ± sd and each distilled student's paired
    difference to each control with its 95% interval. `resume`: reuse the stages an earlier
    run of the same command finished in `out` (a killed demo goes on where it stopped).
    `lanes`: the students' stages in that many worker processes side by side, the threads
    split among them (lanes.py); the same table as one after another. `tune`: instead of the
    table, every run at each lr of the pre-stated grid on the tuning seed, scored on the dev
    split (tune.py).
    """
    import torch

    from distil.demo import lanes as lanes_
    from distil.demo import stages, teachers
    from distil.demo.presets import manifest
    from distil.demo.run import DemoRun, default_cache_dir

    m = manifest()
    torch.set_num_threads(threads)
    run = DemoRun(
        Path(out),
        preset,
        m.presets[preset],
        m,
        threads,
        Path(cache_dir) if cache_dir else default_cache_dir(),
        distill_scale=distill_scale,
        command=command,
        n_seeds=seeds,
        resume=resume,
        lanes=lanes,
    )
    run.out.mkdir(parents=True, exist_ok=True)
    stages.make_data(run)
    stages.make_tokenizers(run)
    if estimate := teachers.expected_time(run, seeds, tune=tune):
        print(estimate, flush=True)
    if tune:
        from distil.demo.tune import run_tuning

        return run_tuning(run)
    teachers.train_teacher(run)
    seeded = [run.for_seed(k) for k in range(seeds)]
    lanes_.run_seeds(seeded)
    return stages.report(seeded)
