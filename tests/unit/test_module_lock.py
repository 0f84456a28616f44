"""A teacher that writes and scores (seq-KD with `generation.async`): a generate call on another
thread waits while scoring has the output head swapped for an identity (models/inuse.py), so
it never reads hidden states as logits; a synchronous call re-enters the lock freely."""

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
