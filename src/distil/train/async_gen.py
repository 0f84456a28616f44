"""`generation.async`: the next window is sampled while the current one trains.

    step k:  window_k = in_flight.result()           # sampled from the weights of step k-1
             snapshot <- student's weights (step k)  # trainable parameters only
             in_flight = background(buffer.next_window())   # window k+1, from the snapshot
             train on window_k                       # the student moves on to step k+1

The sampler reads a snapshot of the student (trainable parameters copied, frozen ones and
buffers shared), so an optimizer step never changes weights under a running `generate`; the
on-policy samples a step trains on are one optimizer step stale, logged as `policy/staleness`
(0 for the first window, and for windows without on-policy slices). Each generate call draws
from its own seed (`SamplingParams.seed`, distil.generation.seeded), so the samples do not
depend on thread timing, and every rank's in-flight window is the one the synchronous buffer
would give it: the buffer itself runs in the background thread, one window ahead.

A teacher that follows the student writes its seq-KD slices from a snapshot too: with
`teacher.from_student: current` the teacher is the student, so its writer samples from the
student's snapshot (never from weights the optimizer is writing, which no lock orders against
the background stream), one step stale like the on-policy samples. `from_student: ema` with
seq-KD is refused with generation.async (config/rules_backends.py): its average is lerped in
place after every step, and a second snapshot would have to be saved with every checkpoint.

Checkpoints: the window in flight is not saved. A checkpoint holds the buffer state before it
and the snapshot's trainable weights (`sampler.safetensors`); a resumed run samples that window
again from them, with the same prompts, weights and seed, so it trains on exactly what the
uninterrupted run trained on.

The sampling runs on one long-lived worker thread for the whole run (`_Worker`). On CPU it
overlaps because torch releases the GIL inside its ops; on CUDA it runs on its own stream. An error in the background is raised again in the training thread
(with its traceback) when the window is collected, at the latest at the next step.
"""

from __future__ import annotations

import contextlib
import copy
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from distil.train.buffer import ON, BufferState, GenerationBuffer, Window

SAMPLER_FILE = "sampler.safetensors"


def weight_snapshot(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` for the sampler: trainable parameters copied, everything else shared.

    Frozen parameters (a LoRA base) and buffers (rotary tables) never change in training, so
    sharing them costs no memory; the snapshot only holds what the optimizer moves.
    """
    memo: dict[int, Any] = {id(p): p for p in model.parameters() if not p.requires_grad}
    memo.update({id(b): b for b in model.buffers()})
    snapshot = copy.deepcopy(model, memo)
    for m in snapshot.modules():  # accelerate's autocast wraps forward as a bound method
        bound = m.__dict__.get("forward")
        if bound is not None and getattr(bound, "__self__", m) is not m:
            raise RuntimeError("the sampler snapshot's forward is bound to another module")
    snapshot.requires_grad_(False)
    return snapshot.eval()


def _worker_copy(generator):
    """The generator's copy for the worker thread (`worker_copy`: hf_static on torch < 2.12
    compiles it without CUDA graphs), or a plain copy."""
    make = getattr(generator, "worker_copy", None)
    return make() if make is not None else copy.copy(generator)


def trainable(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


class _Job:
    """One call of `fn` on the worker; `result()` waits for it and re-raises its error."""

    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def run(self, stream) -> None:
        try:
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                self._value = self.fn()
                if stream is not None:
                    stream.synchronize()
        except BaseException as e:  # handed to the training thread
            self._error = e
        finally:
            self._done.set()

    def result(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value

    def join(self) -> None:
        self._done.wait()


class _Worker:
    """ONE daemon thread that runs every window's sampling for the whole run, a job at a time.

    One thread, not one per window: a compiled generator's CUDA graphs (cudagraph trees) keep
    their state per host thread, so a new thread per window re-warms and re-records every
    bucket. One thread does not make a torch without pytorch PR #184357 (the GPU image's 2.11)
    safe: there cudagraph trees assert in any thread but the one that first imported them
    (pytorch#123177), which a compiled call on the main thread (an evaluation, a notebook)
    makes the main thread, so the worker's hf_static copy runs without CUDA graphs there
    (`StaticCacheGenerator.worker_copy`). A daemon thread fed by a queue rather
    than a ThreadPoolExecutor: the executor's threads are joined at interpreter exit, so a stop
    (SIGTERM) would wait for a window being sampled.
    """

    def __init__(self, stream=None):
        self._stream = stream
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._num_threads = torch.get_num_threads()  # intra-op threads are set per OS thread

    def submit(self, fn: Callable[[], Any]) -> _Job:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name="distil-async-generation", daemon=True
            )
            self._thread.start()
        job = _Job(fn)
        self._jobs.put(job)
        return job

    def _loop(self) -> None:
        torch.set_num_threads(self._num_threads)
        while (job := self._jobs.get()) is not None:
            job.run(self._stream)

    def close(self, wait: bool = True) -> None:
        """End the thread after its current job (joined when `wait`)."""
        if self._thread is None:
            return
        self._jobs.put(None)
        if wait:
            self._thread.join()
        self._thread = None


class AsyncWindows:
    """Drop-in for the buffer in the loop (`next_window`, `state`, `load_state`, `close`), one
    window ahead of it. `state` is the buffer state before the window in flight: what a
    checkpoint saves."""

    def __init__(
        self,
        buffer: GenerationBuffer,
        student: torch.nn.Module,
        *,
        max_steps: int,
        teacher_is_student: bool = False,
    ):
        self.buffer, self.max_steps = buffer, max_steps
        self.snapshot = weight_snapshot(student)
        # what the optimizer moves, paired once: (names, live parameters, snapshot parameters)
        live = trainable(student)
        snap = dict(self.snapshot.named_parameters())
        self._names = list(live)
        self._live_params = list(live.values())
        self._snap_params = [snap[name] for name in live]
        buffer.seeded = True  # each generate call draws from its own seed, not the global RNG
        gen = buffer.student.generator
        if gen is not None:  # a copy of the generator samples from the snapshot
            buffer.student.generator = _worker_copy(gen)
            buffer.student.generator.sync_weights(self.snapshot)
        writer = buffer.teacher.generator if buffer.teacher is not None else None
        if writer is not None:  # the teacher's writer runs on the worker thread too
            buffer.teacher = replace(buffer.teacher, generator=_worker_copy(writer))
            if teacher_is_student:  # from_student=current: it samples the snapshot too
                buffer.teacher.generator.sync_weights(self.snapshot)
        self.state: BufferState = replace(buffer.state)
        self.version = 0  # optimizer steps the snapshot's weights have had
        self._in_flight: _Job | None = None
        self._version_in_flight = 0
        self._restored = False
        device = next(student.parameters()).device
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._worker = _Worker(self._stream)  # one sampler thread for the whole run

    def next_window(self) -> Window:
        """The window to train now; starts sampling the next one from the current weights."""
        if self._in_flight is None:  # the first step, or the first after a resume
            if not self._restored:
                self._refresh(self.buffer.state.windows)
            self._restored = False
            self._launch()
        step = self.state.windows  # window k is trained at step k (k optimizer steps done)
        t0 = time.perf_counter()
        assert self._in_flight is not None
        window: Window = self._in_flight.result()  # a background error is raised here
        waited = time.perf_counter() - t0
        version, self._in_flight = self._version_in_flight, None
        if step + 1 < self.max_steps:
            self._refresh(step)
            self._launch()
        else:  # the last step: nothing more to sample
            self.state = replace(self.buffer.state)
        sampled = ON in window.policies
        window.metrics["policy/staleness"] = float(step - version) if sampled else 0.0
        window.metrics["time/generate_wait"] = waited
        return window

    def _refresh(self, step: int) -> None:
        """snapshot <- the student's current weights."""
        with torch.no_grad():
            torch._foreach_copy_(self._snap_params, self._live_params)
        self.version = step

    def _launch(self) -> None:
        self.state = replace(self.buffer.state)  # what a checkpoint taken meanwhile resumes at
        self._version_in_flight = self.version
        if self._stream is not None:  # the snapshot copy happens before the sampler reads it
            self._stream.wait_stream(torch.cuda.current_stream(self._stream.device))
        self._in_flight = self._worker.submit(self.buffer.next_window)

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_tensors(self) -> dict[str, dict[str, torch.Tensor]]:
        """{file name: tensors} to save with a checkpoint: the in-flight window's weights
        (none after the last step: nothing is in flight, a resume samples from its weights)."""
        if self._in_flight is None:
            return {}
        tensors = {
            n: p.detach().to("cpu").contiguous()
            for n, p in zip(self._names, self._snap_params, strict=True)
        }
        tensors["__version__"] = torch.tensor([self._version_in_flight], dtype=torch.int64)
        return {SAMPLER_FILE: tensors}

    def load_state(self, state: dict[str, int]) -> None:
        self.buffer.load_state(state)
        self.state = replace(self.buffer.state)

    def load_sampler(self, checkpoint: Path) -> None:
        """Resume: the window in flight at the checkpoint is sampled again from its weights."""
        path = Path(checkpoint) / SAMPLER_FILE
        if not path.exists():  # nothing was in flight (or a synchronous run wrote it)
            print(
                f"note: {checkpoint} has no {SAMPLER_FILE} (no window was in flight: it was the "
                "run's last step, or generation.async was off); the first window is sampled "
                "from the resumed weights",
                file=sys.stderr,
                flush=True,
            )
            return
        from safetensors.torch import load_file

        saved = load_file(str(path))
        with torch.no_grad():
            for name, p in zip(self._names, self._snap_params, strict=True):
                p.copy_(saved[name].to(p.device, p.dtype))
        self.version = int(saved["__version__"][0])
        self._restored = True

    @property
    def teacher(self):
        """The buffer's teacher side (its seq-KD writer), as on the buffer."""
        return self.buffer.teacher

    def settle(self) -> None:
        """Wait until nothing samples in the background (the window in flight is kept for
        `next_window`): an evaluation then has the student and the generator to itself."""
        if self._in_flight is not None:
            self._in_flight.join()

    def close(self, wait: bool = True) -> None:
        """Stop: join the window in flight and the sampler thread (`wait`), or leave them to
        the daemon thread (an error or a signal is on its way out and must not wait for a
        generate call; the thread ends after its job, or with the process)."""
        if self._in_flight is not None and wait:
            self._in_flight.join()
        self._in_flight = None
        self._worker.close(wait)
        self.buffer.close()
