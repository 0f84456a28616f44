"""Countdown generation is pinned byte for byte: the sha256 of the files `generate_dataset`
writes (train.jsonl, test.jsonl, meta.json) and of every reachable table of small problems, as
the solver and generator wrote them before they were made faster (e2a8a7c). A change to the
random draws, the order of the DP, the choice of the simplest expression or the rendering of the
rows changes a hash. The parquet files hold the same rows (checked here) but their bytes depend
on the pyarrow version, so they are not hashed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random

import pytest

from distil.tasks.countdown import generate_dataset, reachable_targets, read_rows
from distil.tasks.countdown import solver as cd

COMMON = dict(n=3000, test_n=100)
CASES = [
    (dict(numbers=(3,), seed=0, template="countdown_plain", **COMMON), "0816a0a66c05494f"),
    (dict(numbers=(3,), seed=1, template="countdown_chat", **COMMON), "9715d9084bfbb2a1"),
    (dict(numbers=(3, 4), seed=0, template="countdown_chat", **COMMON), "1cc27cb8d654eb59"),
    (dict(numbers=(3, 4), seed=1, template="countdown_plain", **COMMON), "bad390e86f46c708"),
    (
        dict(numbers="2-3", seed=3, max_number=12, max_target=150, n=400, test_n=30,
             template="countdown_plain"),
        "16da1c8f05d04eb8",
    ),
    (
        dict(numbers=(5,), seed=4, max_number=9, max_target=300, n=200, test_n=20,
             template="countdown_chat"),
        "278bfeee1027b6f5",
    ),
]  # fmt: skip


@pytest.mark.parametrize("kwargs,digest", CASES, ids=[str(i) for i in range(len(CASES))])
def test_generated_files_match_the_pinned_bytes(tmp_path, kwargs, digest):
    generate_dataset(tmp_path, **kwargs)
    h = hashlib.sha256()
    for name in ("train.jsonl", "test.jsonl", "meta.json"):
        h.update((tmp_path / name).read_bytes())
    assert h.hexdigest()[:16] == digest
    for split in ("train", "test"):
        assert read_rows(tmp_path / f"{split}.parquet") == read_rows(tmp_path / f"{split}.jsonl")


def test_reachable_tables_match_the_pinned_bytes():
    h = hashlib.sha256()
    for k, top in ((2, 30), (3, 12), (4, 6)):
        for nums in itertools.combinations_with_replacement(range(1, top + 1), k):
            h.update(json.dumps([nums, reachable_targets(nums)]).encode())
    assert h.hexdigest()[:16] == "78158e14358bde6e"


def test_a_capped_table_is_the_whole_table_cut_at_the_cap():
    """The generator builds a drawn problem's table only up to max_target: the same values in
    the same order with the same nodes (weights, costs, expressions) as the whole table."""
    rng = random.Random(5)
    for _ in range(400):
        nums = tuple(sorted(rng.randint(1, 30) for _ in range(rng.choice((2, 3, 4)))))
        cap = rng.choice((1, 7, 30, 99, 500))
        whole = cd._values(nums)
        assert list(cd._build(nums, cap).items()) == [(v, n) for v, n in whole.items() if v <= cap]
