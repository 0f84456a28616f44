"""The Countdown task, one package: the solver (solver.py), the seeded generator (generate.py), the prompt
templates (templates.py), the dataset files (files.py), the strict checker with its failure
categories (checker.py), the TinyZero-compatible reward (tinyzero.py) and the task behind the
evaluation interface (task.py).

Import from here; the modules underneath do not import this one.
"""

from distil.tasks.countdown.checker import NUMBER_USAGE, OUTCOMES, check, extract_answer, summarize
from distil.tasks.countdown.files import generate_dataset, read_rows, to_rows, write_rows
from distil.tasks.countdown.generate import (
    count_problems,
    generate_problems,
    generate_splits,
    parse_numbers,
    split_set,
)
from distil.tasks.countdown.solver import (
    MAX_SIZE,
    MIN_SIZE,
    Problem,
    compact,
    problem_key,
    reachable_targets,
    solution_steps,
    solve,
)
from distil.tasks.countdown.task import COLUMNS, Countdown
from distil.tasks.countdown.templates import (
    TEMPLATES,
    CountdownChat,
    CountdownPlain,
    Template,
    get_template,
)
from distil.tasks.countdown.tinyzero import tinyzero_score

__all__ = [
    "COLUMNS",
    "MAX_SIZE",
    "MIN_SIZE",
    "NUMBER_USAGE",
    "OUTCOMES",
    "TEMPLATES",
    "Countdown",
    "CountdownChat",
    "CountdownPlain",
    "Problem",
    "Template",
    "check",
    "compact",
    "count_problems",
    "extract_answer",
    "generate_dataset",
    "generate_problems",
    "generate_splits",
    "get_template",
    "parse_numbers",
    "problem_key",
    "reachable_targets",
    "read_rows",
    "solution_steps",
    "solve",
    "split_set",
    "summarize",
    "tinyzero_score",
    "to_rows",
    "write_rows",
]
