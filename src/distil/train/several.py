"""Several teachers (`teachers.models`) built for a run: each one as `teacher` alone would be
(`teacher.select.build_scorer`), behind one RoutedTeacher or MixedTeacher (teacher/several.py);
with seq-KD, routed teachers each write their own rows' completions (`RoutedGenerator`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distil.config import DistilConfig
from distil.errors import ConfigError
from distil.teacher.cache_sources import one_teacher_config
from distil.teacher.select import Rows, build_scorer, loads_teacher_model


def several_teachers(cfg: DistilConfig, load_teacher, model, tok, examples, rows: Rows,
                     device="cpu") -> tuple:  # fmt: skip
    """`build_scorer` for `teachers.models`: each teacher built as `teacher` alone would be (a
    model, `cache` or `url`; same- or cross-tokenizer), behind one RoutedTeacher or
    MixedTeacher (teacher/several.py). The `cross` returned is a `RoutedCollate` for routed
    cross-tokenizer teachers (each teacher's rows aligned in its own tokens). `load_teacher`
    (a one-teacher config) -> (model, tokenizer) loads a live teacher (in host memory when
    `offload`: `Offloaded` moves it to its `device`, default the student's, per scoring)."""
    from distil.teacher.several import MixedTeacher, RoutedCollate, RoutedTeacher, row_teachers

    names = list(cfg.teachers.models)
    built = []
    for name in names:
        one = one_teacher_config(cfg, name)  # with its privileged context (a cache checks it)
        t_model, t_tok = load_teacher(one) if loads_teacher_model(one) else (None,) * 2
        built.append(build_scorer(one, model, tok, t_model, t_tok, rows=rows))
    scorers, crosses = [b[0] for b in built], [b[2] for b in built]
    keep = _common_keep(model, built)
    if crosses[0] is None and keep is not None:  # one student vocabulary for every target
        for s in scorers:
            if hasattr(s, "vocab_size"):
                s.vocab_size = keep
    scorers = _offloaded(cfg, names, scorers, device)
    if cfg.teachers.weights is not None:
        if crosses[0] is not None:
            _one_teacher_vocabulary(names, crosses)
        teacher = MixedTeacher(scorers, [cfg.teachers.weights.get(n, 0.0) for n in names])
        return teacher, built[0][1], crosses[0], keep
    route_of = row_teachers(examples, cfg.teachers, names)
    teacher = RoutedTeacher(scorers, names, route_of)
    cross = None if crosses[0] is None else RoutedCollate(_shared(crosses), names, route_of)
    return teacher, built[0][1], cross, keep


def _offloaded(cfg: DistilConfig, names: list[str], scorers: list, device) -> list:
    """The scorers, those of `offload` teachers behind `Offloaded` (teacher/offload.py)."""
    from distil.teacher.offload import Offload, Offloaded

    out = []
    for name, s in zip(names, scorers, strict=True):
        tc = cfg.teachers.models[name]
        if tc.offload:
            s = Offloaded(s, Offload(s.model, tc.device or device, name))
        out.append(s)
    return out


def _common_keep(model, built) -> int | None:
    """The student logits every teacher's targets fit: the smallest of the teachers' (None:
    all of them)."""
    keeps = [b[3] for b in built if b[3] is not None]
    if not keeps:
        return None
    return min(model.get_output_embeddings().weight.shape[0], *keeps)


def _shared(crosses: list) -> list:
    """The teachers' CrossTokenizers, one object per distinct teacher tokenizer."""
    from distil.teacher.cache import tokenizer_sha256

    seen: dict[str, Any] = {}
    return [seen.setdefault(tokenizer_sha256(c.teacher_tok), c) for c in crosses]


def _one_teacher_vocabulary(names: list[str], crosses: list) -> None:
    """A cross-tokenizer mixture adds distributions over one teacher vocabulary."""
    from distil.teacher.cache import tokenizer_sha256

    shas = [tokenizer_sha256(c.teacher_tok) for c in crosses]
    if len(set(shas)) > 1:
        raise ConfigError(
            f"teachers.weights mixes teachers {', '.join(names)} with a cross-tokenizer loss, "
            "but their tokenizers differ: a mixture adds distributions over one vocabulary. "
            "Fix: mix teachers of one tokenizer, or route rows (teachers.column)"
        )


class RoutedPrompt(list):
    """A seq-KD prompt's token ids and `teacher`, the index of the teacher that writes after
    it (the buffer hands prompts to the generator as they are)."""

    teacher: int = 0


_OPTIONAL = ("logprobs_B_C", "stopped_B")  # Rollout fields a generator may leave None


class RoutedGenerator:
    """seq-KD with routed teachers: each prompt's completions written by its own teacher, one
    generate call per teacher with prompts in the call (its prompts in call order, the same
    sampling params), the rows put back in prompt order (`n` adjacent rows a prompt)."""

    def __init__(self, generators: list):
        self.generators = generators

    def generate(self, prompt_ids, params):
        import torch

        from distil.types import Rollout

        routes = [p.teacher for p in prompt_ids]
        parts = []  # (rows of the merged rollout, the teacher's rollout)
        for t in sorted(set(routes)):
            mine = [i for i, r in enumerate(routes) if r == t]
            out = self.generators[t].generate([prompt_ids[i] for i in mine], params)
            parts.append(([i * params.n + j for i in mine for j in range(params.n)], out))
        B = len(prompt_ids) * params.n
        C = max(out.completion_ids_B_C.shape[1] for _, out in parts)
        first = parts[0][1]
        ids = first.completion_ids_B_C.new_zeros((B, C))
        mask = first.completion_mask_B_C.new_zeros((B, C))
        has = {f: all(getattr(o, f) is not None for _, o in parts) for f in _OPTIONAL}
        lps = first.logprobs_B_C.new_zeros((B, C)) if has["logprobs_B_C"] else None
        stopped = first.stopped_B.new_zeros(B) if has["stopped_B"] else None
        for rows, out in parts:
            idx, c = torch.tensor(rows), out.completion_ids_B_C.shape[1]
            ids[idx, :c], mask[idx, :c] = out.completion_ids_B_C, out.completion_mask_B_C
            if lps is not None:
                lps[idx, :c] = out.logprobs_B_C
            if stopped is not None:
                stopped[idx] = out.stopped_B
        index = [i for i in range(len(prompt_ids)) for _ in range(params.n)]
        return Rollout(index, ids, mask, lps, stopped)

    def sync_weights(self, model) -> None:  # the teachers' weights do not follow the student
        pass

    def scratch_caches(self):
        from contextlib import ExitStack

        stack = ExitStack()
        for g in self.generators:
            stack.enter_context(g.scratch_caches())
        return stack


def routed_writers(cfg: DistilConfig, examples, prompt_ids, tok, models, build_gen):
    """(teacher prompt ids per example as `RoutedPrompt`s, `RoutedGenerator`) for seq-KD with
    routed teachers of the student's tokenizer: each row written by its own teacher (`models`,
    in teachers.models order; `build_gen(model)` its generator) after its own privileged
    prompt (the student's where its teacher has none). A mixture's rows (no teachers.column)
    are all teacher 0's, after the context its teachers share."""
    from distil.models.tokenizers import EncodedPrompts, prompt_format

    route_of, prompts = _writer_rows(cfg, examples)
    given = None
    if any(p is not None for p in prompts):  # "" stands where the student's prompt is read
        filled = [("" if p is None else p) for p in prompts]
        given = EncodedPrompts(tok, filled, name="teacher context", fmt=prompt_format(cfg.data))
    rows = _RoutedPrompts(prompt_ids, prompts, given, route_of)
    return rows, RoutedGenerator([build_gen(m) for m in models])


def _writer_rows(cfg: DistilConfig, examples) -> tuple[list[int], list]:
    """(each row's writing teacher, its teacher prompt or None for the student's): a mixture's
    rows are all teacher 0's (every teacher writes), after the context its teachers share."""
    from distil.data.context import row_prompts
    from distil.teacher.several import row_contexts, row_teachers

    names = list(cfg.teachers.models)
    route_of = row_teachers(examples, cfg.teachers, names) if cfg.teachers.column else None
    route_of = [0] * len(examples) if route_of is None else route_of
    contexts = row_contexts(cfg, examples)
    return route_of, row_prompts(examples, contexts) if contexts else [None] * len(examples)


class _RoutedPrompts(Sequence):
    """`routed_writers`' rows, each made (and its prompt encoded) when first read."""

    def __init__(self, student, prompts, given, route_of):
        self.student, self.prompts, self.given, self.route_of = student, prompts, given, route_of
        if len(student) != len(prompts) or len(route_of) != len(prompts):
            raise ValueError("one student prompt, teacher prompt and route per row")

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        p = self.prompts[i]
        row = RoutedPrompt(self.student[i] if p is None else self.given[i])
        row.teacher = self.route_of[i]
        return row


def several_write(cfg: DistilConfig) -> bool:
    """Whether several teachers write seq-KD completions (routed or mixed)."""
    return bool(cfg.teachers.models and cfg.train.seq_kd)


def writers_side(cfg: DistilConfig, examples, prompt_ids, tok, models, cross) -> Any:
    """The buffer's teacher side for seq-KD with several teachers (`models`, in
    teachers.models order): routed, each row's completion written by its own teacher
    (`routed_writers`); mixed, every token drawn from the teachers' mixture
    (generation/mixture.py), one generate call per window. Across tokenizers (`cross`: a
    RoutedCollate, or a mixture's one CrossTokenizer) each teacher writes after its own
    tokens of the row's prompt, and the text it wrote becomes the student's completion
    (`RoutedToStudent`), as one cross-tokenizer teacher's does."""
    from distil.generation.select import build_generator, teacher_backend
    from distil.models.tokenizers import id_rows, stop_token_ids
    from distil.train.buffer import PromptSide

    mixed = cfg.teachers.weights is not None
    crosses = None if cross is None else getattr(cross, "crosses", [cross] * len(models))
    toks = [tok] * len(models) if crosses is None else [c.teacher_tok for c in crosses]

    def build_gen(model, t_tok=tok):
        stops = stop_token_ids(t_tok, model)
        gen = build_generator(
            cfg,
            model,
            pad_id=t_tok.pad_token_id,
            stop_ids=stops,
            vocab_limit=id_rows(t_tok),
            backend=teacher_backend(cfg),
        )
        return gen  # several teachers are whole on a device (placement=replicate)

    writers = [] if mixed else models
    if crosses is None:
        ids, generator = routed_writers(cfg, examples, prompt_ids, tok, writers, build_gen)
        to_student = None
    else:
        ids, to_student = _teacher_token_rows(cfg, examples, crosses)
        generator = RoutedGenerator([build_gen(m, t) for m, t in zip(writers, toks, strict=False)])
    if mixed:  # its own decode loop, whatever generation.backend (generation/mixture.py)
        from distil.generation.mixture import mixture_generator

        weights = [cfg.teachers.weights.get(n, 0.0) for n in cfg.teachers.models]
        stops = sorted(  # any weighted teacher's end ends the row
            {s for m, t, w in zip(models, toks, weights, strict=True) if w > 0
             for s in stop_token_ids(t, m)}
        )  # fmt: skip
        generator = mixture_generator(
            models,
            weights,
            pad_id=toks[0].pad_token_id,
            stop_ids=stops,
            vocab_limit=id_rows(toks[0]),
        )
    return PromptSide(ids, generator, to_student=to_student)


def _teacher_token_rows(cfg: DistilConfig, examples, crosses: list) -> tuple:
    """(rows, to_student) for teachers of other tokenizers: each row's prompt (its teacher's
    privileged one, else the student's) in its teacher's tokens, as a `RoutedPrompt`."""
    from distil.models.tokenizers import EncodedPrompts, prompt_format

    names = list(cfg.teachers.models)
    route_of, given = _writer_rows(cfg, examples)
    prompts = [e.prompt if p is None else p for e, p in zip(examples, given, strict=True)]
    encoded: dict[int, Any] = {}  # one per distinct teacher tokenizer (crosses are shared)
    per_teacher = []
    for t, c in enumerate(crosses):
        if id(c) not in encoded:
            name = f"teachers.models.{names[t]} tokenizer"
            encoded[id(c)] = EncodedPrompts(
                c.teacher_tok,
                prompts,
                max_tokens=cfg.data.max_prompt_tokens,
                name=name,
                fmt=prompt_format(cfg.data),
                where=[e.meta.get("_where") for e in examples],
            )
        per_teacher.append(encoded[id(c)])
    return _TeacherRows(per_teacher, route_of), RoutedToStudent(crosses, route_of)


class _TeacherRows(Sequence):
    """Row i: its prompt in its own teacher's tokens, as a `RoutedPrompt` (made when read)."""

    def __init__(self, per_teacher: list, route_of: Sequence[int]):
        self.per_teacher, self.route_of = per_teacher, route_of

    def __len__(self) -> int:
        return len(self.route_of)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        row = RoutedPrompt(self.per_teacher[self.route_of[i]][i])
        row.teacher = self.route_of[i]
        return row


class RoutedToStudent:
    """A seq-KD completion its row's teacher wrote in its own tokens -> (student ids, text),
    by that teacher's CrossTokenizer."""

    def __init__(self, crosses: list, route_of: Sequence[int]):
        self.crosses, self.route_of = crosses, route_of

    def __call__(self, ids, *, prompt=None, example: int | None = None):
        assert example is not None, "routed teachers convert a row by its example index"
        return self.crosses[self.route_of[example]].to_student(ids, prompt=prompt)
