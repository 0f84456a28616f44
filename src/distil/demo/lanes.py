"""The students' stages of `distil demo` as a graph, run one after another or in lanes: worker
processes side by side, the threads split among them.

Each seed's stages are its students' starts, the teacher writing its completions and the runs
of configs/demo.yaml; a run waits for its student's start, for the run whose compute it gets
(`cost_of`) and, when it trains on them, for the teacher's written completions. One lane runs
them in that order in this process (the demo's order before lanes). With several, a free lane
takes the first stage, in that order over the seeds, whose inputs are finished: on two cores
the students' small matrices gain little from a second thread, so two one-thread lanes train
~1.4x faster than one two-thread process (docs/LOG.md). A stage's numbers do not depend on its
lane or thread count (tests/integration/test_demo.py runs the smoke demo both ways); its
output goes to <seed dir>/logs/<stage>.log and this process prints when it starts and ends.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from distil.demo import stages
from distil.demo.run import DemoRun, Stage
from distil.progress import console


@dataclass(frozen=True)
class Task:
    seed: int
    kind: str  # start | writes | run | summary (a study seed's, after its stages)
    name: str  # the student, the writes config or the run's key
    after: tuple[str, ...] = ()  # keys of the seed's stages it reads

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.name}"


def seed_tasks(run: DemoRun) -> list[Task]:
    """A seed's stages in the order one lane runs them, each with the stages it reads."""
    m = run.manifest
    out = [Task(run.seed, "start", name) for name in m.students]
    if m.writes is not None:
        out.append(Task(run.seed, "writes", m.writes.config))
    for r in m.runs:
        after = [f"start:{r.student}"]
        if r.cost_of is not None:
            after.append(f"run:{r.cost_of}")
        if m.writes is not None and stages.reads_written(r):
            after.append(f"writes:{m.writes.config}")
        out.append(Task(run.seed, "run", r.key, tuple(after)))
    return out


def do(run: DemoRun, task: Task) -> None:
    if task.kind == "summary":  # a study's seed, its stages done: its models through the checker
        from distil.demo.study_report import write_seed_summary

        with run.timed(_label(run, task)):
            write_seed_summary(task.name, run)
    elif task.kind == "start":
        stages.start_student(run, task.name)
    elif task.kind == "writes":
        assert run.manifest.writes is not None
        stages.teacher_writes(run, run.manifest.writes)
    else:
        stages.run_one(run, _run(run, task))


def all_tasks(seeded: list[DemoRun], study: str | None = None) -> list[Task]:
    """The seeds' stages in the order one lane runs them; a `study`'s seed ends with its summary,
    which waits for every stage of its seed and comes before the next seed's stages (so that a
    free lane takes it first: a study cut off later keeps the seeds it finished)."""
    todo = []
    for r in seeded:
        todo += (tasks := seed_tasks(r))
        if study is not None:
            todo.append(Task(r.seed, "summary", study, tuple(t.key for t in tasks)))
    return todo


def run_seeds(seeded: list[DemoRun], study: str | None = None) -> None:
    """Every seed's stages: in this process, in order, with one lane (`DemoRun.lanes`); else
    in that many worker processes. The stages and commands land in the runs' shared lists
    (commands in the order one lane would have run them, so the printed recipe does not depend
    on timing). A `study`'s seed ends with its summary (study_report.write_seed_summary), as
    soon as its stages are done."""
    todo = all_tasks(seeded, study)
    by_seed = {r.seed: r for r in seeded}
    lanes = seeded[0].lanes
    if lanes <= 1:
        for t in todo:
            do(by_seed[t.seed], t)
        return
    first = seeded[0]
    threads = max(1, first.threads // lanes)
    console.print(
        f"the students' stages run in {lanes} lanes of {threads} thread(s); each stage's "
        f"output goes to {first.seed_dir.parent if first.n_seeds > 1 else first.out}/"
        f"{'seed<k>/' if first.n_seeds > 1 else ''}logs/"
    )
    workers = {s: replace(r, threads=threads, stages=[], commands=[]) for s, r in by_seed.items()}
    commands = _in_lanes(todo, workers, lanes, first)
    for t in todo:
        first.commands.extend(commands[(t.seed, t.key)])


def _in_lanes(todo: list[Task], workers: dict[int, DemoRun], lanes: int, shared: DemoRun):
    """Run `todo` in `lanes` worker processes (each task sent with an empty copy of its seed's
    run); the finished stages land in `shared`'s list; returns each task's commands."""
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    pending, done, running, commands = list(todo), set(), {}, {}
    with ProcessPoolExecutor(lanes, mp_context=mp.get_context("spawn")) as pool:
        while pending or running:
            for t in [t for t in pending if all((t.seed, a) in done for a in t.after)]:
                if len(running) == lanes:
                    break
                pending.remove(t)
                log = workers[t.seed].seed_dir / "logs" / f"{t.kind}_{t.name}.log"
                running[pool.submit(_work, workers[t.seed], t, log)] = (t, log)
                console.print(f"[dim]started: {_label(workers[t.seed], t)} ({log})[/dim]")
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                t, log = running.pop(future)
                try:
                    new_stages, commands[(t.seed, t.key)] = future.result()
                except BaseException:
                    console.print(
                        f"[red]{_label(workers[t.seed], t)} failed: its output is in {log}; "
                        "waiting for the stage in the other lane(s) to end (kept for --resume)"
                    )
                    raise
                done.add((t.seed, t.key))
                _report(shared, new_stages)
    return commands


def _report(run: DemoRun, new: list[Stage]) -> None:
    """A finished task's stages into the shared list, printed with the demo's clock."""
    for s in new:
        run.stages.append(s)
        console.print(
            f"done: {s.name} in {s.seconds / 60:.1f} min (demo time "
            f"{(time.perf_counter() - run.t0) / 60:.1f} min)" + (f"; {s.note}" if s.note else "")
        )


def _label(run: DemoRun, t: Task) -> str:
    if t.kind == "start":
        return stages.start_label(run, t.name)
    if t.kind == "writes":
        return f"{run.tag}the teacher writes its completions"
    if t.kind == "summary":
        return f"{run.tag}the seed's models through the checker (its summary)"
    return stages.run_label(run, _run(run, t))


def _run(run: DemoRun, t: Task):
    return next(r for r in run.manifest.runs if r.key == t.name)


def _work(run: DemoRun, task: Task, log: Path) -> tuple[list[Stage], list[str]]:
    """In a worker process: one task with the lane's threads, its output to `log`."""
    import torch

    torch.set_num_threads(run.threads)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f, _output_to(f):
        try:
            do(run, task)
        except BaseException:
            traceback.print_exc()  # into the log, next to the stage's output
            raise
    return run.stages, run.commands


@contextmanager
def _output_to(f) -> Iterator[None]:
    """stdout and stderr (the file descriptors: progress, warnings, C libraries) into `f`."""
    sys.stdout.flush(), sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(f.fileno(), 1), os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(saved[0], 1), os.dup2(saved[1], 2)
        os.close(saved[0]), os.close(saved[1])
