"""Generation buffer: one generate call per window, lambda schedule, slices, resume, ranks."""

import pytest
from buffer_fakes import EOS, FakeGenerator, make_buffer

from distil.errors import ConfigError
from distil.train.buffer import OFF, ON, SEQ_KD


def test_one_generate_call_per_window_covering_every_on_policy_prompt():
    buf, gen = make_buffer(batch=4, accum=4, n=2, lam=1.0)
    window = buf.next_window()
    assert len(gen.calls) == 1
    assert len(gen.calls[0]) == 8  # generation_batch_size = 4 * 4 / 2 unique prompts
    assert len(window.micro_batches) == 4
    assert all(b.input_ids_B_L.shape[0] == 4 for b in window.micro_batches)
    buf.next_window()
    assert len(gen.calls) == 2


def test_rows_hold_n_adjacent_copies_with_distinct_samples():
    buf, _ = make_buffer(batch=4, accum=2, n=2, lam=1.0)
    window = buf.next_window()
    samples = [s for b in window.micro_batches for s in b.samples]
    for a, b in zip(samples[::2], samples[1::2], strict=True):
        assert a.example_id == b.example_id  # copies of one prompt are adjacent
        assert a.completion_ids[1] == 20 and b.completion_ids[1] == 21  # different samples
        assert a.source == ON and a.sampling_logprobs == [-0.5, -0.5, -0.5]


def test_lambda_mix_is_seeded_and_off_policy_uses_the_reference():
    buf, gen = make_buffer(batch=2, accum=8, n=2, lam=0.5, seed=3)
    window = buf.next_window()
    assert set(window.policies) == {ON, OFF}  # seed 3 draws both kinds in 8 slices
    assert window.policies == buf.policies(0)
    on_prompts = sum(p == ON for p in window.policies)
    assert len(gen.calls) == 1 and len(gen.calls[0]) == on_prompts  # one prompt per slice
    for policy, batch in zip(window.policies, window.micro_batches, strict=True):
        for s in batch.samples:
            assert s.source == policy
            if policy == OFF:
                assert s.completion_ids == [300 + s.example_id, EOS]
                assert s.sampling_logprobs is None
    assert window.metrics["policy/on_policy_share"] == on_prompts / 8
    other, _ = make_buffer(batch=2, accum=8, n=2, lam=0.5, seed=4)
    assert [other.policies(w) for w in range(5)] != [buf.policies(w) for w in range(5)]


def test_lambda_extremes():
    on, _ = make_buffer(lam=1.0)
    off, gen = make_buffer(lam=0.0)
    assert all(p == ON for w in range(20) for p in on.policies(w))
    assert all(p == OFF for w in range(20) for p in off.policies(w))
    off.next_window()
    assert gen.calls == []


def test_schedule_and_data_order_identical_after_resume():
    full, _ = make_buffer(n_examples=20, batch=2, accum=2, n=1, lam=0.5, seed=7)
    ref = [full.next_window() for _ in range(12)]  # crosses several epochs
    first, _ = make_buffer(n_examples=20, batch=2, accum=2, n=1, lam=0.5, seed=7)
    for _ in range(5):
        first.next_window()
    saved = first.state.to_dict()
    resumed, _ = make_buffer(n_examples=20, batch=2, accum=2, n=1, lam=0.5, seed=7)
    resumed.load_state(saved)
    for expected in ref[5:]:
        got = resumed.next_window()
        assert got.policies == expected.policies
        assert [s.example_id for b in got.micro_batches for s in b.samples] == [
            s.example_id for b in expected.micro_batches for s in b.samples
        ]


def test_epochs_drop_the_incomplete_tail_and_reshuffle():
    buf, _ = make_buffer(n_examples=10, batch=4, accum=1, n=1)
    seen = [[s.example_id for s in buf.next_window().micro_batches[0].samples] for _ in range(4)]
    assert len(set(seen[0] + seen[1])) == 8  # epoch 0: 2 windows of 4, the last 2 dropped
    assert buf.state.epoch == 1
    assert seen[2] + seen[3] != seen[0] + seen[1]  # epoch 1 has another order


def test_ranks_get_disjoint_prompts_and_identical_policies():
    r0, _ = make_buffer(n_examples=40, batch=2, accum=2, n=1, lam=0.5, rank=0, world=2)
    r1, _ = make_buffer(n_examples=40, batch=2, accum=2, n=1, lam=0.5, rank=1, world=2)
    for _ in range(4):
        w0, w1 = r0.next_window(), r1.next_window()
        ids0 = {s.example_id for b in w0.micro_batches for s in b.samples}
        ids1 = {s.example_id for b in w1.micro_batches for s in b.samples}
        assert not ids0 & ids1
        assert w0.policies == w1.policies


def test_seq_kd_slices_are_written_by_the_teacher_in_one_call():
    teacher = FakeGenerator(offset=1000)
    buf, _gen = make_buffer(
        batch=2, accum=6, n=1, lam=0.5, seed=3, seq_kd=True, teacher_gen=teacher
    )
    window = buf.next_window()
    n_kd = window.policies.count(SEQ_KD)
    assert n_kd > 0 and len(teacher.calls) == 1 and len(teacher.calls[0]) == 2 * n_kd
    for policy, batch in zip(window.policies, window.micro_batches, strict=True):
        for s in batch.samples:
            if policy == SEQ_KD:
                assert s.completion_ids[0] == 1010 + 100 + s.example_id
                assert s.sampling_logprobs is None


def test_loss_mask_covers_completion_only():
    buf, _ = make_buffer(batch=2, accum=1, n=1, lam=0.0)
    batch = buf.next_window().micro_batches[0]
    # prompt [100+i, 5, 6], completion [300+i, EOS]: targets are positions 2 and 3 (shifted)
    assert batch.mask_B_T.tolist() == [[False, False, True, True]] * 2
    ex = batch.samples[0].example_id
    assert batch.labels_B_T[0].tolist() == [5, 6, 300 + ex, EOS]


def test_too_small_dataset_and_missing_completions_are_config_errors():
    with pytest.raises(ConfigError, match="dataset has 3"):
        make_buffer(n_examples=3, batch=4, accum=1, n=1)
    with pytest.raises(ConfigError, match="have no completion"):
        make_buffer(lam=0.5, completions=False)
    make_buffer(lam=1.0, completions=False)  # on-policy only needs prompts
