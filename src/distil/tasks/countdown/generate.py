"""Countdown problems drawn at random, deterministic for a seed, and disjoint splits of them
(train, dev, test): sizes, numbers and targets as the solver's rules allow (solver.py)."""

from __future__ import annotations

import contextlib
import gc
import itertools
import math
import random
from collections.abc import Sequence

from distil.errors import ConfigError
from distil.tasks.countdown.solver import (
    MAX_SIZE,
    MIN_SIZE,
    Problem,
    _render,
    _targets,
    _values,
)


def parse_numbers(spec: str | int | Sequence[int]) -> tuple[int, ...]:
    """Problem sizes from "3", "4" or a range "3-4" (sizes between 2 and 5) -> (3,), (4,), (3, 4)."""
    if isinstance(spec, int) and not isinstance(spec, bool):
        spec = str(spec)
    if not isinstance(spec, str):
        sizes = tuple(spec)
        _check_sizes(sizes)
        return sizes
    lo, sep, hi = spec.strip().partition("-")
    if lo.isdigit() and (hi.isdigit() if sep else True):
        first, last = int(lo), int(hi) if sep else int(lo)
        if MIN_SIZE <= first <= last <= MAX_SIZE:
            return tuple(range(first, last + 1))
    raise ConfigError(
        f"numbers={spec!r} is not a problem size; use '3', '4' or a range like '3-4' "
        f"(sizes from {MIN_SIZE} to {MAX_SIZE}, low-high)"
    )


def _check_sizes(sizes: tuple[int, ...]) -> None:
    if not sizes or any(type(k) is not int or not MIN_SIZE <= k <= MAX_SIZE for k in sizes):
        raise ConfigError(
            f"numbers={sizes!r}: give problem sizes between {MIN_SIZE} and {MAX_SIZE}, "
            "e.g. (3,), (4,) or (3, 4)"
        )


def _check_settings(n: int, numbers: tuple[int, ...], max_number: int, max_target: int) -> None:
    problems = []
    if type(n) is not int or n < 0:
        problems.append(f"n={n!r}: the number of problems must be an int >= 0")
    if type(max_number) is not int or max_number < 1:
        problems.append(f"max_number={max_number!r}: must be an int >= 1 (default 99)")
    if type(max_target) is not int or max_target < 1:
        problems.append(f"max_target={max_target!r}: must be an int >= 1 (default max_number)")
    if problems:
        raise ConfigError(problems)
    _check_sizes(numbers)


def count_problems(numbers: tuple[int, ...], max_number: int, max_target: int) -> int:
    """How many distinct problems (sorted nums, target) exist for these settings (enumerates)."""
    return sum(
        sum(1 for v in _values(nums) if v <= max_target)
        for k in numbers
        for nums in itertools.combinations_with_replacement(range(1, max_number + 1), k)
    )


_EXACT_COUNT_LIMIT = 3000  # multisets; enumerating more for an error message takes seconds


def _check_supply(n: int, numbers: tuple[int, ...], max_number: int, max_target: int) -> None:
    """Fail fast when more problems are asked for than exist (counted exactly when cheap);
    otherwise the bounded draw loop in `generate_problems` reports a shortfall."""
    multisets = sum(math.comb(max_number + k - 1, k) for k in numbers)
    if n <= multisets or (multisets > _EXACT_COUNT_LIMIT and n <= multisets * max_target):
        return
    if multisets <= _EXACT_COUNT_LIMIT:
        exist = count_problems(numbers, max_number, max_target)
        how_many = f"only {exist}"
    else:
        exist = multisets * max_target
        how_many = f"at most {exist}"
    if n > exist:
        raise ConfigError(
            f"asked for {n} distinct problems but {how_many} exist with numbers={numbers}, "
            f"max_number={max_number}, max_target={max_target}; ask for fewer problems, or "
            "raise max_number / max_target, or allow more problem sizes (numbers '3-4')"
        )


@contextlib.contextmanager
def paused_gc():
    """Pause the cyclic garbage collector (as it was on exit). Generating a dataset makes
    millions of lists and dicts and no reference cycles, so reference counting frees all of them,
    and each collection would walk the solver's caches and the rows made so far: with it running,
    generating 200,000 problems took over twice as long (40 s against 18 s here)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _draw(rng: random.Random, numbers: tuple[int, ...], max_number: int, max_target: int):
    """One random problem, or None when the drawn numbers reach no target in range."""
    nums = tuple([rng.randint(1, max_number) for _ in range(rng.choice(numbers))])
    values = _targets(tuple(sorted(nums)), max_target)  # the reachable values up to max_target
    if not values:
        return None
    # Target weighted by the number of expression trees reaching it: values that many
    # expressions reach come up more often, as when a random expression is picked.
    weights = [node[2] for node in values.values()]
    target = rng.choices(list(values), weights=weights)[0]
    return Problem(nums, target, _render(values[target], " "))


def generate_problems(
    n: int,
    *,
    numbers: str | Sequence[int] = (3,),
    max_number: int = 99,
    max_target: int | None = None,
    seed: int | str = 0,
    exclude: frozenset = frozenset(),
) -> list[Problem]:
    """`n` distinct solvable problems, deterministic for a seed.

    Each problem: a size drawn from `numbers`, numbers drawn uniformly from [1, max_number], a
    target drawn from the reachable values in [1, max_target] weighted by how many expression
    trees reach each (redrawn when none). Keys in `exclude` (see `problem_key`) and repeats are
    skipped. `seed` is an int or a str (random.Random hashes a str with sha512, so it is stable
    across processes). Raises ConfigError when fewer than `n` problems exist for the settings.
    """
    max_target = max_number if max_target is None else max_target
    numbers = parse_numbers(numbers)  # also accepts "3-4"
    _check_settings(n, numbers, max_number, max_target)
    _check_supply(n, numbers, max_number, max_target)
    rng = random.Random(seed)
    seen = set(exclude)
    problems: list[Problem] = []
    max_draws = 50 * n + 2000  # coupon-collector slack; rare keys may need many draws
    with paused_gc():
        for _ in range(max_draws):
            if len(problems) == n:
                return problems
            problem = _draw(rng, numbers, max_number, max_target)
            if problem is not None and (key := problem.key) not in seen:
                seen.add(key)
                problems.append(problem)
    if len(problems) == n:
        return problems
    raise ConfigError(
        f"found only {len(problems)} of {n} distinct problems in {max_draws} random draws "
        f"(numbers={numbers}, max_number={max_number}, max_target={max_target}, "
        f"{len(exclude)} keys excluded); ask for fewer problems, or raise max_number / max_target"
    )


def generate_splits(
    n_train: int,
    n_test: int,
    *,
    numbers: str | Sequence[int] = (3,),
    max_number: int = 99,
    max_target: int | None = None,
    seed: int = 0,
) -> tuple[list[Problem], list[Problem]]:
    """Disjoint (train, test) splits (`split_set` without a dev split)."""
    splits = split_set(n_train, n_test, 0, numbers=numbers, max_number=max_number,
                       max_target=max_target, seed=seed)  # fmt: skip
    return splits["train"], splits["test"]


def split_set(
    n_train: int,
    n_test: int,
    n_dev: int = 0,
    *,
    numbers: str | Sequence[int] = (3,),
    max_number: int = 99,
    max_target: int | None = None,
    seed: int = 0,
) -> dict[str, list[Problem]]:
    """Disjoint train, dev and test splits, by name. The test split is drawn first and depends
    only on the seed and settings; the dev split is drawn the same way (its own seed) with the
    test keys excluded; train excludes both. So growing the training set, or adding a dev split,
    keeps the test set fixed, and dev is a second held-out set from the test's distribution
    (recipe choices are made on it; the test set is read once per model)."""
    target_cap = max_number if max_target is None else max_target
    numbers = parse_numbers(numbers)
    _check_settings(n_train, numbers, max_number, target_cap)
    for name, n in (("n_test", n_test), ("n_dev", n_dev)):
        if type(n) is not int or n < 0:
            raise ConfigError(f"{name}={n!r}: the number of held-out problems must be an int >= 0")
    _check_supply(n_train + n_test + n_dev, numbers, max_number, target_cap)
    common = dict(numbers=numbers, max_number=max_number, max_target=max_target)
    test = generate_problems(n_test, seed=f"countdown-test-{seed}", **common)
    exclude = frozenset(p.key for p in test)
    dev = generate_problems(n_dev, seed=f"countdown-dev-{seed}", exclude=exclude, **common)
    exclude |= frozenset(p.key for p in dev)
    train = generate_problems(n_train, seed=seed, exclude=exclude, **common)
    return {"train": train, "dev": dev, "test": test}
