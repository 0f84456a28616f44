"""A generate call on another thread waits while the student's step has the output head
swapped for an identity (models/inuse.py), so it never reads hidden states as logits; a
synchronous call re-enters the lock freely. A teacher that writes and scores (seq-KD with
`generation.async`) scores through its decoder with the module untouched: it never waits for
its own background writer (gpu-review-2 finding 7)."""

from __future__ import annotations

import threading

import torch

from distil.data.packing import head_bypassed
from distil.generation.base import SamplingParams
from distil.generation.hf import HFGenerator
from distil.generation.mixture import mixture_generator
from distil.models.inuse import module_lock


def test_a_generate_call_waits_while_scoring_has_the_head_swapped(tiny_llama_model):
    model = tiny_llama_model
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    for gen in (
        HFGenerator(model, pad_id=0, stop_ids=[2]),
        mixture_generator([model, model], [1.0, 1.0], pad_id=0, stop_ids=[2]),
    ):
        want = gen.generate([[5, 6, 7]], params).completion_ids_B_C
        got = {}
        thread = threading.Thread(
            target=lambda g=gen, into=got: into.update(out=g.generate([[5, 6, 7]], params))
        )
        with head_bypassed(model):
            assert isinstance(model.get_output_embeddings(), torch.nn.Identity)
            thread.start()
            thread.join(timeout=1.0)
            assert thread.is_alive() and not got  # it waits for the head
        thread.join(timeout=60)
        assert not thread.is_alive()
        torch.testing.assert_close(got["out"].completion_ids_B_C, want)


def test_the_lock_is_reentrant_and_one_per_module(tiny_llama_model):
    lock = module_lock(tiny_llama_model)
    assert module_lock(tiny_llama_model) is lock
    with head_bypassed(tiny_llama_model), lock:  # the same thread again: no deadlock
        pass
    assert module_lock(torch.nn.Linear(2, 2)) is not lock


def test_a_teacher_scores_while_its_background_writer_holds_the_module(tiny_llama_model):
    """The writer's generate call holds the teacher's lock for its whole call (seconds, minutes
    with teacher_windows); scoring the next micro-batch neither waits for it nor swaps the
    head the writer is reading."""
    from distil.data.collate import collate
    from distil.teacher.live import LiveTeacher
    from distil.types import Sample

    model = tiny_llama_model
    head = model.get_output_embeddings()
    batch = collate([Sample(0, [5, 6, 7], [8, 9, 2], "seq_kd")], 0)
    want = LiveTeacher(model).score(batch).logprobs_B_T_V
    seen_heads = []
    model.model.register_forward_hook(lambda *a: seen_heads.append(model.get_output_embeddings()))
    writing, done = threading.Event(), threading.Event()

    def writer():  # a generate call in flight: the lock held until told to stop
        with module_lock(model):
            writing.set()
            done.wait(timeout=60)

    thread = threading.Thread(target=writer)
    thread.start()
    writing.wait(timeout=10)
    got = {}
    scorer = threading.Thread(target=lambda: got.update(t=LiveTeacher(model).score(batch)))
    scorer.start()
    scorer.join(timeout=30)
    done.set()
    thread.join(timeout=10)
    assert "t" in got, "scoring waited for the writer's lock"
    assert all(h is head for h in seen_heads)  # the head was never swapped
    torch.testing.assert_close(got["t"].logprobs_B_T_V, want)
