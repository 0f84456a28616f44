"""The Countdown task, public module: the solver and the seeded generator
(`countdown_solver.py`), the prompt templates and dataset files (`countdown_io.py`).

Import from here; the two modules underneath do not import this one (no import circle).
"""

from distil.data.countdown_io import (
    TEMPLATES,
    CountdownChat,
    CountdownPlain,
    Template,
    generate_dataset,
    get_template,
    read_rows,
    to_rows,
    write_rows,
)
from distil.data.countdown_solver import (
    MAX_SIZE,
    MIN_SIZE,
    Problem,
    compact,
    count_problems,
    generate_problems,
    generate_splits,
    parse_numbers,
    problem_key,
    reachable_targets,
    solution_steps,
    solve,
)

__all__ = [
    "MAX_SIZE",
    "MIN_SIZE",
    "TEMPLATES",
    "CountdownChat",
    "CountdownPlain",
    "Problem",
    "Template",
    "compact",
    "count_problems",
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
    "to_rows",
    "write_rows",
]
