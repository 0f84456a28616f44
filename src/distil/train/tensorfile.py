"""safetensors files written as a stream, hashed as they are written.

A checkpoint's manifest holds the sha256 of every file. Hashing the bytes on their way to the
file, instead of reading each file back after writing it, saves one full read of the
checkpoint (8 GB and more for a 0.6B student with master weights), and each tensor is copied
to the host only when its turn comes, so no second host copy of the whole state exists. The
files are ordinary safetensors (an 8-byte header length, a JSON header padded to 8 bytes, the
tensors' little-endian bytes in header order), read back by `safetensors.torch.load_file`.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
from pathlib import Path

import torch

SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


class HashingFile:
    """A binary file opened for writing whose `write`s also feed a sha256; `close` fsyncs."""

    def __init__(self, path: str | os.PathLike):
        self.fh = open(path, "wb")  # noqa: SIM115 (closed in close())
        self.hash = hashlib.sha256()

    def write(self, data) -> None:
        self.hash.update(data)
        self.fh.write(data)

    def close(self) -> str:
        """Flush, fsync and close; the hex sha256 of everything written."""
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        return self.hash.hexdigest()


def write_text(path: str | os.PathLike, text: str) -> str:
    """Write `text` (UTF-8), fsynced; returns its sha256."""
    out = HashingFile(path)
    try:
        out.write(text.encode("utf-8"))
    finally:
        digest = out.close()
    return digest


def write_safetensors(
    tensors: dict[str, torch.Tensor],
    path: str | os.PathLike,
    metadata: dict[str, str] | None = None,
) -> str:
    """Write `tensors` (any device) to `path` in the safetensors format, fsynced; returns the
    file's sha256, computed from the bytes as they were written."""
    if sys.byteorder != "little":  # safetensors is little-endian; torch's bytes are native
        raise RuntimeError("writing safetensors needs a little-endian machine")
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for name, t in tensors.items():
        if t.dtype not in SAFETENSORS_DTYPES:
            raise ValueError(f"tensor {name!r}: dtype {t.dtype} has no safetensors name here")
        size = t.numel() * t.element_size()
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned
    out = HashingFile(Path(path))
    try:
        out.write(struct.pack("<Q", len(head)))
        out.write(head)
        for t in tensors.values():
            if t.numel():
                host = t.detach().to("cpu").contiguous().reshape(-1)
                out.write(memoryview(host.view(torch.uint8).numpy()))
    finally:
        digest = out.close()
    return digest
