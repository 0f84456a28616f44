"""Several teachers (`teachers` + `routing`): each row is scored by its own teacher (recorded per
row), a mixture's targets are log sum_i w_i T_i, a mixture of one teacher with weight 1 trains
exactly like that teacher alone, and config validate names the mistakes."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from distil.config import build_config
from distil.errors import ConfigError, DataError
from distil.preflight import preflight
from distil.teacher.several import MixedTeacher, RoutedTeacher, row_teachers
from distil.testing import config_with, read_metrics
from distil.train import loop
from distil.train.setup import build


@pytest.fixture
def routed_data(tmp_path, countdown_dir):
    """The Countdown train rows, each with a `source` column: 'small' or 'big' by target."""
    rows = [json.loads(x) for x in (countdown_dir / "train.jsonl").read_text().splitlines()]
    for i, r in enumerate(rows):
        r["source"] = "small" if i % 2 else "big"
    path = tmp_path / "routed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, rows


def several(make_train_config, pair_dirs, second_teacher, data, **routing):
    raw = make_train_config(train={"max_steps": 2, "lambda": 0.0})
    raw["data"]["train"] = str(data)
    raw["teacher"] = {}
    models = {"a": {"path": str(pair_dirs[0])}, "b": {"path": str(second_teacher)}}
    raw["teachers"] = {"models": models, **routing}
    return raw


def test_each_row_is_scored_by_its_teacher(
    make_train_config, pair_dirs, second_teacher, routed_data
):
    data, rows = routed_data
    raw = several(
        make_train_config, pair_dirs, second_teacher, data,
        column="source", map={"small": "a", "big": "b"},
    )  # fmt: skip
    c = build(build_config(raw))
    assert isinstance(c.teacher, RoutedTeacher)

    def routes(batch):
        return ["a" if rows[s.example_id]["source"] == "small" else "b" for s in batch.samples]

    batches = [b for _ in range(4) for b in c.buffer.next_window().micro_batches]
    batch = next(b for b in batches if len(set(routes(b))) == 2)  # both teachers in one batch
    targets = c.teacher.score(batch).logprobs_B_T_V
    want = routes(batch)
    assert c.teacher.last_routes == want
    for i, name in enumerate(want):  # row i equals its own teacher's score of the row alone
        alone = c.teacher.teachers["ab".index(name)]
        from distil.teacher.several import _rows

        ref = alone.score(_rows(batch, torch.tensor([i]), [i])).logprobs_B_T_V[0]
        m = batch.mask_B_T[i]
        torch.testing.assert_close(targets[i][m], ref[m], rtol=0, atol=0)
        other = c.teacher.teachers[1 - "ab".index(name)]
        wrong = other.score(_rows(batch, torch.tensor([i]), [i])).logprobs_B_T_V[0]
        assert not torch.allclose(targets[i][m], wrong[m])


def test_a_mixture_is_the_hand_computed_mixture():
    class Fixed:
        temperature = 1.0

        def __init__(self, p):
            self.p = p

        def score(self, batch):
            from distil.types import TeacherTargets

            return TeacherTargets(logprobs_B_T_V=torch.log(self.p))

    p1 = torch.tensor([[[0.7, 0.2, 0.1]]], dtype=torch.float64)
    p2 = torch.tensor([[[0.1, 0.1, 0.8]]], dtype=torch.float64)
    batch = SimpleNamespace(teacher_input_ids_B_L=None, mask_B_T=torch.ones(1, 1, dtype=bool))
    mixed = MixedTeacher([Fixed(p1), Fixed(p2)], [3.0, 1.0]).score(batch).logprobs_B_T_V
    want = torch.log(torch.tensor([[[0.55, 0.175, 0.275]]], dtype=torch.float64))
    torch.testing.assert_close(mixed, want)
    assert math.isclose(float(mixed.exp().sum()), 1.0)


def test_a_mixture_of_one_teacher_with_weight_one_is_that_teacher(
    tmp_path, make_train_config, pair_dirs, second_teacher, routed_data
):
    data, _ = routed_data
    raw = several(make_train_config, pair_dirs, second_teacher, data, weights={"a": 1.0})
    raw["train"]["output_dir"] = str(tmp_path / "mixed")
    loop.train(build_config(raw))
    single = make_train_config(train={"max_steps": 2, "lambda": 0.0})
    single["data"]["train"] = str(data)
    single["train"]["output_dir"] = str(tmp_path / "single")
    loop.train(build_config(single))
    got = [m["loss"] for m in read_metrics(tmp_path / "mixed")]
    want = [m["loss"] for m in read_metrics(tmp_path / "single")]
    assert len(got) == 2 and got == want  # exactly


def test_validate_names_the_mistakes(make_train_config, pair_dirs, second_teacher, routed_data):
    data, _ = routed_data
    raw = several(
        make_train_config, pair_dirs, second_teacher, data,
        column="source", map={"small": "a", "big": "c"},
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"teachers.map/weights name \['c'\]"):
        build_config(raw)
    raw["teachers"] |= {"column": "source", "map": {"small": "a"}}  # 'big' is claimed by no one
    problems, _ = preflight(build_config(raw))
    assert any("'big': no teacher claims this value" in p for p in problems)
    assert any("routed.jsonl:1" in p for p in problems)
    raw["teachers"] |= {"column": "origin", "map": {}}
    problems, _ = preflight(build_config(raw))
    assert any("teachers.column = 'origin': this row has no such column" in p for p in problems)
    raw["teachers"] |= {"column": "source", "weights": {"a": 1.0}}
    with pytest.raises(ConfigError, match=r"exactly one of teachers\.column"):
        build_config(raw)
    raw["teachers"] |= {"column": None, "weights": {"a": 1.0}}
    assert config_with(raw, train={"seq_kd": True}).train.seq_kd  # a mixture writes
    with pytest.raises(ConfigError, match=r"teachers\.models\.b in a mixture .* top_k = 3"):
        config_with(
            raw, teachers={"models": {**raw["teachers"]["models"], "b": {"path": "x", "top_k": 3}}}
        )
    with pytest.raises(ConfigError, match=r"teacher\.path/cache/url and teachers\.models"):
        build_config({**raw, "teacher": {"path": str(pair_dirs[0])}})


def test_row_teachers_maps_values_to_names(routed_data):
    from distil.config.schema import TeachersConfig
    from distil.data.datasets import load_examples

    data, rows = routed_data
    examples = load_examples(str(data))
    routes = row_teachers(examples, TeachersConfig(column="source"), ["big", "small"])
    assert routes == [0 if r["source"] == "big" else 1 for r in rows]
    with pytest.raises(DataError, match=r"routed\.jsonl:1"):
        row_teachers(examples, TeachersConfig(column="source"), ["a", "b"])


def test_a_mistyped_key_of_one_teacher_is_named_with_its_fix(
    make_train_config, pair_dirs, second_teacher, routed_data
):
    data, _ = routed_data
    raw = several(make_train_config, pair_dirs, second_teacher, data, weights={"a": 1.0})
    raw["teachers"]["models"]["a"]["tokeniser"] = "x"
    raw["teachers"]["models"]["b"]["top_k"] = "abc"
    with pytest.raises(ConfigError) as err:
        build_config(raw)
    assert err.value.problems == [
        "unknown key 'teachers.models.a.tokeniser' in section 'teachers.models.a': did you "
        "mean 'teachers.models.a.tokenizer'?",
        "'teachers.models.b.top_k' = 'abc': Input should be a valid integer, unable to parse "
        "string as an integer",
    ]


def test_a_mixture_mixes_only_the_scored_rows_without_an_fp32_copy_of_the_targets():
    """gpu-review-2 finding 10: the mixture was computed in fp32 over every (B, T, V) position,
    fillers included. Now only the loss rows are mixed, a chunk at a time, into the first
    teacher's (bf16) output: no fp32 (B, T, V) tensor, the same values at the loss rows."""
    from alloc_probe import Created

    from distil.data.collate import collate
    from distil.teacher.live import LiveTeacher
    from distil.testing import tiny_llama
    from distil.types import Sample

    V = 1000
    teachers = [LiveTeacher(tiny_llama(V, seed=s).to(torch.bfloat16), chunk_rows=4) for s in (1, 2)]
    g = torch.Generator().manual_seed(0)
    samples = [Sample(i, torch.randint(3, V, (6,), generator=g).tolist(),
                      torch.randint(3, V, (n,), generator=g).tolist(), "off_policy")
               for i, n in enumerate((9, 3, 12))]  # fmt: skip
    batch = collate(samples, pad_id=0)
    b, t = batch.mask_B_T.shape
    with Created() as seen:
        got = MixedTeacher(teachers, [3.0, 1.0]).score(batch).logprobs_B_T_V
    assert got.dtype == torch.bfloat16
    assert seen.allocations(b * t * V * 4) == 0  # no fp32 (B, T, V)
    full = [x.score(batch).logprobs_B_T_V.float() for x in teachers]
    want = torch.logaddexp(full[0] + math.log(0.75), full[1] + math.log(0.25))
    m = batch.mask_B_T
    torch.testing.assert_close(got[m].float(), want[m].to(torch.bfloat16).float(), rtol=0, atol=0)
