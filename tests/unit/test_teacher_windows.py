"""generation.teacher_windows: the teacher writes the seq-KD slices of several windows in one
call. Same windows as one call per window; fewer, larger calls; a resume inside a block writes
the block again, identically; config rules."""

import pytest
import torch
from buffer_fakes import EOS, FakeGenerator, make_buffer

from distil.config import build_config
from distil.errors import ConfigError
from distil.testing import read_metrics, train_killed_after_checkpoint
from distil.train import loop
from distil.train.buffer import ON, SEQ_KD
from distil.types import Rollout


def rows_of(window):
    return [
        (s.example_id, tuple(s.completion_ids), s.source)
        for b in window.micro_batches
        for s in b.samples
    ]


def windows(buf, n):
    return [rows_of(buf.next_window()) for _ in range(n)]


def ahead(k, **kw):
    buf, gen = make_buffer(**kw)
    buf.ahead = k
    return buf, gen


@pytest.mark.parametrize("lam", [0.0, 0.5])
def test_blocks_write_the_same_windows_in_fewer_calls(lam):
    kw = {"n_examples": 30, "batch": 2, "accum": 2, "n": 2, "lam": lam, "seed": 3, "seq_kd": True}
    one_gen, four_gen = FakeGenerator(offset=50), FakeGenerator(offset=50)
    ref, _ = make_buffer(**kw, teacher_gen=one_gen)
    blk, _ = ahead(4, **kw, teacher_gen=four_gen)
    a, b = windows(ref, 11), windows(blk, 11)  # crosses two epochs (7 windows of 4 prompts)
    assert a == b
    sources = {s for w in a for _, _, s in w}
    assert SEQ_KD in sources and (lam == 0.0) == (ON not in sources)
    # one call per block that has teacher-written slices: blocks 0-3, 4-7, 8-11
    assert len(four_gen.calls) == 3 and len(one_gen.calls) > 3
    # every teacher-written prompt of the 11 windows, once (block 8-11 also writes window 11's)
    written = [p[0] - 100 for c in four_gen.calls for p in c]
    assert written[: sum(map(len, one_gen.calls))] == [p[0] - 100 for c in one_gen.calls for p in c]


class SeedAndPositionGenerator(FakeGenerator):
    """Completion = [a number from the call's seed and the row's place in the call, EOS]: a
    block generated with another seed or other rows writes different completions."""

    def generate(self, prompt_ids, params):
        self.calls.append([list(p) for p in prompt_ids])
        assert params.seed is not None  # blocks are always seeded
        g = torch.Generator().manual_seed(params.seed % 2**31)
        draws = torch.randint(0, 1000, (len(prompt_ids) * params.n,), generator=g).tolist()
        rows = [[400 + d, EOS] for d in draws]
        ids = torch.tensor(rows)
        n = len(rows)
        index = [i for i in range(len(prompt_ids)) for _ in range(params.n)]
        return Rollout(
            index,
            ids,
            torch.ones_like(ids, dtype=torch.bool),
            None,
            torch.ones(n, dtype=torch.bool),
        )


@pytest.mark.parametrize("stop", [4, 5, 6])
def test_resume_inside_a_block_writes_the_block_again_identically(stop):
    kw = {"n_examples": 40, "batch": 2, "accum": 2, "n": 1, "lam": 0.5, "seed": 1, "seq_kd": True}
    full, _ = ahead(4, **kw, teacher_gen=SeedAndPositionGenerator())
    ref = windows(full, 10)
    first, _ = ahead(4, **kw, teacher_gen=SeedAndPositionGenerator())
    head = windows(first, stop)
    resumed, _ = ahead(4, **kw, teacher_gen=SeedAndPositionGenerator())
    resumed.load_state(first.state.to_dict())
    assert head + windows(resumed, 10 - stop) == ref
    # what it writes depends on the block's whole call: writing from the resumed window on
    # (not the block's first) would differ, so the equality above is not trivial
    other, _ = ahead(4, **kw, teacher_gen=SeedAndPositionGenerator())
    state = first.state.to_dict()
    other.load_state({**state, "block_window": stop, "block_position": state["position"]})
    if stop % 4 and any(s == SEQ_KD for _, _, s in ref[stop]):
        assert windows(other, 1)[0] != ref[stop]


def test_checkpoint_state_without_a_block_starts_one_at_the_resumed_window():
    kw = {"n_examples": 40, "batch": 2, "accum": 2, "n": 1, "lam": 0.0, "seed": 1, "seq_kd": True}
    gen = SeedAndPositionGenerator()
    buf, _ = ahead(4, **kw, teacher_gen=gen)
    buf.load_state({"epoch": 0, "position": 12, "windows": 6})  # an older checkpoint
    out = windows(buf, 3)  # windows 6, 7 from a block of two; window 8 opens the next block
    assert [len(c) for c in gen.calls] == [8, 16]  # 4 prompts a window
    assert all(s == SEQ_KD for w in out for _, _, s in w)


def test_config_rules(make_train_config):
    def problems(**over):
        with pytest.raises(ConfigError) as err:
            build_config(make_train_config(**over))
        return str(err.value)

    msg = problems(generation={"teacher_windows": 4}, train={"lambda": 0.5})
    assert "generation.teacher_windows" in msg and "seq_kd" in msg
    msg = problems(
        generation={"teacher_windows": 4},
        train={"lambda": 0.0, "seq_kd": True},
        teacher={"path": None, "from_student": "current", "system": "Be brief."},
    )
    assert "teacher.from_student" in msg and "stale" in msg


def test_training_with_blocks_resumes_exactly(tmp_path, make_train_config, monkeypatch):
    over = {
        "loss": {"name": "sft"},
        "train": {"lambda": 0.0, "seq_kd": True, "max_steps": 6, "save_every": 3},
        "generation": {"teacher_windows": 4},
    }
    cfg = build_config(make_train_config(**over))
    metrics = loop.train(cfg)
    assert metrics["policy/seq_kd_share"] == 1.0
    full = read_metrics(tmp_path / "run")
    raw = make_train_config(**over)
    raw["train"]["output_dir"] = str(tmp_path / "killed")
    train_killed_after_checkpoint(monkeypatch, build_config(raw), step=3)  # inside block 0-3
    resumed = read_metrics(tmp_path / "killed")
    assert [m["step"] for m in resumed] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(full[3:], resumed[3:], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6), a["step"]
        assert a["tokens/seq_kd_generated"] == b["tokens/seq_kd_generated"]
