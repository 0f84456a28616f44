"""The generation buffer's test doubles, shared by the buffer and async-generation tests: a
fake generator with predictable rows and a small buffer over 40 numbered examples."""

import torch

from distil.generation.base import SamplingParams
from distil.train.buffer import GenerationBuffer, PromptSide
from distil.types import Example, Rollout

EOS, PAD = 2, 0


class FakeGenerator:
    """Completion for prompt p, sample j: [10 + p[0], 20 + j, EOS]; records every call."""

    def __init__(self, offset=0):
        self.calls = []
        self.offset = offset

    def generate(self, prompt_ids, params):
        self.calls.append([list(p) for p in prompt_ids])
        rows = []
        index = []
        for i, p in enumerate(prompt_ids):
            for j in range(params.n):
                rows.append([10 + self.offset + p[0], 20 + j, EOS])
                index.append(i)
        ids = torch.tensor(rows)
        mask = torch.ones_like(ids, dtype=torch.bool)
        return Rollout(
            index, ids, mask, torch.full(ids.shape, -0.5), torch.ones(len(rows), dtype=torch.bool)
        )

    def sync_weights(self, model):
        pass


def make_buffer(
    n_examples=40,
    *,
    batch=4,
    accum=2,
    n=2,
    lam=1.0,
    seed=0,
    rank=0,
    world=1,
    seq_kd=False,
    completions=True,
    generator=None,
    teacher_gen=None,
):
    examples = [
        Example(i, f"prompt {i}", f"answer {i}" if completions else None) for i in range(n_examples)
    ]
    prompt_ids = [[100 + i, 5, 6] for i in range(n_examples)]
    completion_ids = [[300 + i, EOS] if completions else None for i in range(n_examples)]
    gen = generator or FakeGenerator()
    teacher = PromptSide(prompt_ids, teacher_gen) if teacher_gen else None
    return GenerationBuffer(
        examples,
        PromptSide(prompt_ids, gen),
        completion_ids=completion_ids,
        params=SamplingParams(8, 1.0, 1.0, 0, n),
        per_device_batch_size=batch,
        grad_accum_steps=accum,
        lambda_=lam,
        pad_id=PAD,
        seed=seed,
        seq_kd=seq_kd,
        teacher=teacher,
        rank=rank,
        world_size=world,
    ), gen
