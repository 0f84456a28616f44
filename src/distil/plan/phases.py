"""Per device and per phase, the terms that make its peak.

A step runs, in order: generation (on-policy slices), then for each micro-batch teacher
scoring and the student's forward/backward with the loss, then the optimizer step; eval runs
every `train.eval_every` steps. Each phase's peak is the sum of what stays resident (weights,
optimizer states, kept KV caches, a colocated vLLM engine) and what that phase adds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from distil.config import DistilConfig
from distil.generation.static import bucket
from distil.plan import memory as m
from distil.plan.memory import Term
from distil.plan.shapes import ModelShape
from distil.plan.sizes import Sizes
from distil.plan.target import Target

# a remote or cached teacher's top-k, per position: int64 ids + fp32 log-probs, and the rest
TOPK_BYTES, REST_BYTES = 8 + 4, 4


@dataclass
class Phase:
    name: str
    terms: list[Term] = field(default_factory=list)
    flops: float = 0.0
    bytes_moved: float = 0.0  # memory traffic that bounds it when compute does not
    seconds: float = 0.0

    @property
    def peak(self) -> int:
        return sum(t.bytes for t in self.terms)

    def add(self, name: str, value: int, note: str = "") -> None:
        if value:
            self.terms.append(Term(name, int(value), note))


def resident(cfg: DistilConfig, z: Sizes, s: ModelShape, target: Target, *, grads: bool):
    """Terms every phase of the student's device holds (after the first optimizer step)."""
    out = Phase("resident")
    how = f"{s.params:,} params x {z.student_bytes} B" + (
        f" / {z.shards} FSDP shards" if z.shards > 1 else ""
    )
    out.add("student weights", m.weights(s.params, z.student_bytes, z.shards), how)
    state_bytes = 4 if z.master or z.lora else z.student_bytes
    if z.master:
        out.add("fp32 master weights", m.weights(z.trainable, 4, z.shards), "train.bf16_weights")
    if z.lora:
        out.add("LoRA adapters (fp32)", m.weights(z.trainable, 4), f"{z.trainable:,} params")
    out.add(
        "optimizer states",
        m.adam_states(z.trainable, state_bytes, z.shards),
        f"AdamW: 2 x {z.trainable:,} x {state_bytes} B",
    )
    if grads:
        out.add(*gradients(z, s))
    g = cfg.generation
    if z.gen_rows and g.backend == "hf_static":  # one cache per (row, width) bucket reached
        rows = static_call_rows(z.gen_rows, g.static_batch_buckets)
        top = bucket(z.prompt, g.static_length_buckets)
        widths = sorted({*(b for b in g.static_length_buckets if b < top), top})
        kv = sum(
            m.kv_cache(s, r, w + g.max_new_tokens, z.student_bytes) for r in rows for w in widths
        )
        out.add("hf_static KV cache (kept)", kv, f"{' + '.join(map(str, rows))} rows x (prompt "
                f"bucket + {g.max_new_tokens}) tokens for prompt buckets {widths}")  # fmt: skip
    if z.gen_rows and g.backend == "vllm" and g.vllm.sleep_level == 0:
        out.add("vLLM engine (sleep_level 0)", int(g.vllm.gpu_memory_utilization * target.memory))
    return out.terms


def static_call_rows(gen_rows: int, buckets: list[int]) -> list[int]:
    """The row buckets of the hf_static calls sampling `gen_rows` rows: calls past the largest
    bucket are split at it, and the rest's call is padded to its own bucket, a second set of
    kept caches when that bucket is another (70 rows over [8, 16, 32, 64]: 64 and 8)."""
    top = max(buckets)
    if gen_rows <= top:
        return [bucket(gen_rows, buckets)]
    rest = gen_rows % top
    return sorted({top, bucket(rest, buckets) if rest else top}, reverse=True)


def teacher_weights(cfg: DistilConfig, z: Sizes, t: ModelShape) -> int:
    """A live teacher's weights on its device: none for `teacher.from_student=current` (the
    student itself), a whole copy for `initial`/`ema`, a shard under `placement=shard`."""
    if cfg.teacher.from_student == "current":
        return 0
    shards = z.shards if cfg.teacher.placement == "shard" else 1
    return m.weights(t.params, z.teacher_bytes, shards)


def gradients(z: Sizes, s: ModelShape) -> tuple[str, int, str]:
    grad_bytes = 4 if z.lora else z.student_bytes
    value = m.weights(z.trainable, grad_bytes, z.shards)
    if z.master:
        value += m.weights(z.trainable, 4, z.shards)  # the fp32 master gradients
    return (
        "gradients",
        value,
        f"{z.trainable:,} x {grad_bytes} B" + (" + fp32 master grads" if z.master else ""),
    )


def generation(cfg: DistilConfig, z: Sizes, s: ModelShape, target: Target) -> Phase | None:
    """Sampling the window's on-policy completions: one generate call of `gen_rows` rows."""
    if not z.gen_rows:
        return None
    g = cfg.generation
    p = Phase("generation", resident(cfg, z, s, target, grads=False))
    tokens = z.prompt + g.max_new_tokens
    if g.backend == "vllm":
        if g.vllm.sleep_level:
            p.add("vLLM engine", int(g.vllm.gpu_memory_utilization * target.memory),
                  f"generation.vllm.gpu_memory_utilization={g.vllm.gpu_memory_utilization}")  # fmt: skip
    elif g.backend == "hf":
        p.add("KV cache", m.kv_cache(s, z.gen_rows, tokens, z.student_bytes),
              f"{z.gen_rows} rows x {tokens} tokens (num_generations x prompts)")  # fmt: skip
    if g.backend != "vllm":
        p.add("prefill forward", m.inference_forward(s, z.gen_rows * z.prompt, z.act_bytes))
        p.add("sampling logits", m.logits_chunk(z.gen_rows, s.vocab, m.GEN_LOGITS_COPIES),
              f"{z.gen_rows} rows x {s.vocab:,} x fp32 x {m.GEN_LOGITS_COPIES}")  # fmt: skip
    p.flops = 2 * s.active_params * z.gen_rows * tokens
    weight_reads = s.active_params * z.student_bytes * g.max_new_tokens  # decode reads them
    p.bytes_moved = weight_reads + m.kv_cache(s, z.gen_rows, tokens, z.student_bytes) * (
        g.max_new_tokens / 2
    )
    return p


def teacher_generation(cfg: DistilConfig, z: Sizes, s: ModelShape, t: ModelShape | None,
                       target: Target, *, student_here: bool) -> Phase | None:  # fmt: skip
    """`train.seq_kd`: the live teacher writes the off-policy slices' completions (hf or
    hf_static; a colocated vLLM engine serves the student only)."""
    if not z.seq_kd_rows or t is None or z.teacher_kind != "live":
        return None
    g = cfg.generation
    p = Phase("teacher generation (seq-KD)")
    if student_here:
        p.terms = resident(cfg, z, s, target, grads=False)
    p.add("teacher weights", teacher_weights(cfg, z, t))
    tokens = z.prompt + g.max_new_tokens
    p.add("teacher KV cache", m.kv_cache(t, z.seq_kd_rows, tokens, z.teacher_bytes),
          f"{z.seq_kd_rows} rows x {tokens} tokens")  # fmt: skip
    p.add("prefill forward", m.inference_forward(t, z.seq_kd_rows * z.prompt, z.teacher_bytes))
    p.add("sampling logits", m.logits_chunk(z.seq_kd_rows, t.vocab, m.GEN_LOGITS_COPIES))
    p.flops = 2 * t.active_params * z.seq_kd_rows * tokens
    p.bytes_moved = t.active_params * z.teacher_bytes * g.max_new_tokens
    return p


def targets_terms(z: Sizes, t: ModelShape | None, rows_bt: int) -> list[Term]:
    """The teacher's targets of one micro-batch, held until its loss is done."""
    p = Phase("targets")
    if z.teacher_kind == "none":
        return []
    if z.teacher_kind == "live" and z.top_k is None and t is not None:
        full = rows_bt * t.vocab * z.teacher_bytes
        p.add("teacher log-probs (B, T, V)", full, f"{rows_bt} x {t.vocab:,} x {z.teacher_bytes} B")
        return p.terms
    k = z.top_k or 1
    p.add("teacher top-k targets", rows_bt * (k * TOPK_BYTES + REST_BYTES), f"k={k}")
    return p.terms


def teacher_scoring(cfg: DistilConfig, z: Sizes, s: ModelShape, t: ModelShape | None,
                    target: Target, *, student_here: bool = True,
                    model_here: bool = True) -> Phase | None:  # fmt: skip
    """One micro-batch through the teacher (live), or its targets read (cache) / received.
    `student_here`: the student's resident terms share the device; `model_here`: the live
    teacher runs on it (else only its targets arrive)."""
    if z.teacher_kind == "none":
        return None
    base = resident(cfg, z, s, target, grads=z.accum > 1) if student_here else []
    p = Phase("teacher scoring", base)
    rows_bt = z.batch * (z.seq - 1)
    if z.teacher_kind == "live" and t is not None and model_here:
        p.add("teacher weights", teacher_weights(cfg, z, t),
              f"{t.params:,} params x {z.teacher_bytes} B")  # fmt: skip
        tokens = z.batch * (z.seq + z.context)  # privileged context lengthens its sequences
        how = f"+ {z.context} context tokens a row" if z.context else ""
        p.add("teacher forward", m.inference_forward(t, tokens, z.teacher_bytes), how)
        # the head is bypassed: final hidden states, then the head on the loss rows only
        p.add("teacher hidden states", (tokens - z.batch) * t.hidden * z.teacher_bytes, how)
        rows = min(z.teacher_rows, z.loss_rows)
        p.add("scoring chunk (fp32)", m.logits_chunk(rows, t.vocab, m.TEACHER_CHUNK_COPIES),
              f"{rows} loss positions (auto chunk) x {t.vocab:,} x 4 B x "
              f"{m.TEACHER_CHUNK_COPIES}")  # fmt: skip
        p.flops = 2 * t.active_params * tokens
        p.bytes_moved = t.active_params * z.teacher_bytes
    for term in targets_terms(z, t, rows_bt):
        p.add(term.name, term.bytes, term.note)
    if z.teacher_kind in ("cache", "remote"):
        k = z.top_k or 1
        p.add("transfer buffer", rows_bt * (k * TOPK_BYTES + REST_BYTES),
              "read from the cache" if z.teacher_kind == "cache" else "decoded from the server")  # fmt: skip
    return p


def student_step(cfg: DistilConfig, z: Sizes, s: ModelShape, t: ModelShape | None,
                 target: Target, *, teacher_here: bool) -> Phase:  # fmt: skip
    """One micro-batch's forward, loss and backward."""
    p = Phase("student fwd/bwd + loss", resident(cfg, z, s, target, grads=False))
    if teacher_here and z.teacher_kind == "live" and t is not None:
        p.add("teacher weights", teacher_weights(cfg, z, t))
    acts = m.activations(s, z.tokens, z.act_bytes, checkpointing=cfg.student.gradient_checkpointing)
    how = "gradient checkpointing" if cfg.student.gradient_checkpointing else "all layers kept"
    p.add("activations", acts, f"{z.tokens} tokens x {s.act_per_token_layer:,.0f} elements a "
          f"layer x {z.act_bytes} B ({how})")  # fmt: skip
    name, grads, note = gradients(z, s)
    head = 0 if z.lora else (s.head_params or s.embed_params) * (4 if z.master else z.student_bytes)
    if z.accum > 1:  # earlier micro-batches' gradients are there for the whole forward
        p.add(name, grads, note + " (accumulated)")
    else:  # backward frees layer activations as it writes their gradients
        p.add(name, max(head, grads - acts), "at backward's peak: the head's, then replacing "
              "activations")  # fmt: skip
    rows_bt = z.batch * (z.seq - 1)
    for term in targets_terms(z, t, rows_bt):
        p.add(term.name, term.bytes, term.note)
    vocab = s.vocab + (z.teacher_vocab if z.cross else 0)
    rows = min(z.chunk_rows or z.loss_rows, z.loss_rows)
    copies = m.LOSS_CHUNK_COPIES.get(cfg.loss.name, m.LOSS_CHUNK_DEFAULT)
    copies += m.RECOMPUTE_COPIES if rows < z.loss_rows else 0  # checkpointed chunks
    what = f"{rows} positions x {vocab:,} x 4 B x {copies}"
    p.add("loss logits chunk" if z.chunk_rows else "loss logits (unchunked)",
          m.logits_chunk(rows, vocab, copies), what)  # fmt: skip
    ckpt = 1 if cfg.student.gradient_checkpointing else 0
    p.flops = (6 + 2 * ckpt) * s.active_params * z.tokens + 2 * s.hidden * s.vocab * z.loss_rows
    p.bytes_moved = 3 * s.active_params * z.student_bytes
    return p


def optimizer_step(cfg: DistilConfig, z: Sizes, s: ModelShape, target: Target) -> Phase:
    """Clip and AdamW: weights, gradients, moments, and the update's temporaries."""
    p = Phase("optimizer step", resident(cfg, z, s, target, grads=True))
    fused = cfg.train.fused_adamw is True or (cfg.train.fused_adamw == "auto" and target.cuda)
    if not fused and target.cuda:  # foreach: one temporary the size of all trainable params
        p.add("AdamW temporaries", m.weights(z.trainable, 4, z.shards), "foreach (not fused)")
    elif not fused:  # single-tensor loop: sqrt and division temporaries of one parameter
        largest = min(s.largest_param, z.trainable)
        p.add("AdamW temporaries", 2 * largest * 4, "per-parameter loop: 2 x the largest")
    p.bytes_moved = z.trainable * 28 / z.shards  # read p, g, m, v; write p, m, v (fp32)
    return p


def evaluation(cfg: DistilConfig, z: Sizes, s: ModelShape, target: Target) -> Phase | None:
    """`train.eval_every`: greedy/sampled completions of `eval.batch_size` prompts at a time."""
    if not cfg.train.eval_every:
        return None
    e = cfg.eval
    rows, tokens = e.batch_size * e.samples, z.prompt + e.max_new_tokens
    p = Phase("eval", resident(cfg, z, s, target, grads=False))
    p.add(
        "KV cache", m.kv_cache(s, rows, tokens, z.student_bytes), f"{rows} rows x {tokens} tokens"
    )
    p.add("prefill forward", m.inference_forward(s, rows * z.prompt, z.act_bytes))
    p.add("sampling logits", m.logits_chunk(rows, s.vocab, m.GEN_LOGITS_COPIES))
    p.flops = 2 * s.active_params * rows * tokens
    p.bytes_moved = s.active_params * z.student_bytes * e.max_new_tokens
    return p
