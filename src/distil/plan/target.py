"""The machine a plan is made for: memory per device, number of devices, and the peak compute
and memory bandwidth the FLOPs are turned into seconds with.

Presets: H100 SXM (80 GB HBM3, 989 TFLOP/s dense bf16, 3.35 TB/s) and H200 (141 GB HBM3e,
989 TFLOP/s, 4.8 TB/s), with the memory nvidia-smi reports. `cpu` takes the host's memory and
a short measurement of its matmul FLOP/s and copy bandwidth, unless they are stated.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace

from distil.errors import ConfigError

MiB, GiB = 2**20, 2**30
# CUDA context, cuBLAS workspaces and the caching allocator's slack, on each GPU
CUDA_RESERVE = 2 * GiB


@dataclass(frozen=True)
class Target:
    kind: str  # h100 | h200 | cpu
    memory: int  # bytes per device
    gpus: int = 1
    fsdp: bool = False  # the student (and a teacher with placement=shard) sharded over gpus
    tflops: float = 989.0  # dense bf16 peak, TFLOP/s
    bandwidth: float = 3.35e12  # bytes/s
    reserve: int = CUDA_RESERVE

    @property
    def cuda(self) -> bool:
        return self.kind != "cpu"

    @property
    def usable(self) -> int:
        """Bytes a run's tensors may take on one device."""
        return self.memory - self.reserve


PRESETS = {
    "h100": Target("h100", 81_559 * MiB, tflops=989.0, bandwidth=3.35e12),
    "h200": Target("h200", 143_771 * MiB, tflops=989.0, bandwidth=4.8e12),
}


def parse_bytes(text: str, key: str = "--gpu-memory") -> int:
    """'80GiB', '80GB', '141 GB', '512MiB', '1e9' -> bytes."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]i?B|B)?\s*", text or "")
    units = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
    units.update({"KiB": 2**10, "MiB": MiB, "GiB": GiB, "TiB": 2**40})
    try:
        value = float(m.group(1)) * units[m.group(2) or "B"] if m else -1.0
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ConfigError(
            f"{key} = {text!r} is not an amount of memory. Fix: write it like 80GiB, 141GB or "
            "512MiB"
        )
    return int(value)


def make_target(
    device: str = "h100",
    *,
    memory: str | None = None,
    gpus: int = 1,
    fsdp: bool = False,
    tflops: float | None = None,
    bandwidth: float | None = None,
) -> Target:
    """The Target of `--device`, with `--gpu-memory`, `--gpus`, `--fsdp`, `--tflops` and
    `--bandwidth` (bytes/s) applied."""
    if device == "cpu":
        target = Target("cpu", _host_memory(), reserve=0, tflops=0.0, bandwidth=0.0)
        if tflops is None or bandwidth is None:
            measured = measure_cpu()
            tflops = measured[0] if tflops is None else tflops
            bandwidth = measured[1] if bandwidth is None else bandwidth
    elif device in PRESETS:
        target = PRESETS[device]
    else:
        raise ConfigError(
            f"--device = {device!r} is not a device preset. Fix: use one of "
            f"{', '.join([*PRESETS, 'cpu'])}"
        )
    if gpus < 1 or (fsdp and gpus < 2):
        raise ConfigError(
            f"--gpus = {gpus}{' with --fsdp' if fsdp else ''}: FSDP shards over 2 or more "
            "devices. Fix: --gpus 2 or more, or drop --fsdp"
        )
    updates = {"gpus": gpus, "fsdp": fsdp}
    if memory is not None:
        updates["memory"] = parse_bytes(memory)
    if tflops is not None:
        updates["tflops"] = float(tflops)
    if bandwidth is not None:
        updates["bandwidth"] = float(bandwidth)
    return replace(target, **updates)


def for_device(device, gpus: int = 1, fsdp: bool = False) -> Target:
    """The Target of the device a run trains on: a GPU's total memory (the H200 preset's
    speeds for an H200, else the H100's), or the host's memory for CPU (no speeds)."""
    import torch

    if getattr(device, "type", device) == "cuda":
        props = torch.cuda.get_device_properties(device)
        preset = PRESETS["h200" if "h200" in props.name.lower() else "h100"]
        return replace(preset, kind=props.name, memory=props.total_memory, gpus=gpus,
                       fsdp=fsdp and gpus > 1)  # fmt: skip
    return Target("cpu", _host_memory(), gpus=gpus, fsdp=fsdp and gpus > 1, tflops=0.0,
                  bandwidth=0.0, reserve=0)  # fmt: skip


def _host_memory() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 16 * GiB


def measure_cpu(seconds: float = 0.2) -> tuple[float, float]:
    """(TFLOP/s of an fp32 matmul, bytes/s of a large copy) on this host, measured briefly."""
    import torch

    n = 512
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds / 2:
        a @ b
        count += 1
    tflops = 2 * n**3 * count / (time.perf_counter() - t0) / 1e12
    src = torch.empty(16 * MiB // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds / 2:
        dst.copy_(src)
        count += 1
    bandwidth = 2 * src.nbytes * count / (time.perf_counter() - t0)  # read + write
    return tflops, bandwidth
