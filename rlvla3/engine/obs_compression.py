"""Observation compression on the request path (runtime.obs_compression): none | lz4 | delta-lz4.

An observation buffer (protocol.obs_codec) is mostly images. Between nodes a LIBERO-class
request is ~0.3-3 MiB, and consecutive frames of one env differ in few pixels, so XOR against
the group's previous frame makes long runs of zeros that LZ4 removes cheaply (the idea RLinf
reports, ~40% of the bytes). On one node, MPI moves the raw buffer through shared memory faster
than any codec runs, so the default is none; `python -m rlvla3.bench obs` measures bytes and CPU
per step on rendered frames.

Wire format of a compressed request: the buffer's header and non-image fields as they are, then
the LZ4 frame of the images (XORed with the previous frame with delta-lz4). Each group has one
request in flight and MPI keeps a (source, tag) pair in order, so the Simulator's and the
Generator's previous frames are always the same one: both start from zeros.
"""
from __future__ import annotations

import numpy as np

from ..config import OBS_COMPRESSIONS


def _lz4():
    from numcodecs import LZ4

    return LZ4(acceleration=1)


class ObsWire:
    """One group's end of the compressed observation path (the Simulator's or the Generator's):
    `encode` turns a packed obs buffer into the wire bytes, `decode` back into the buffer."""

    def __init__(self, mode: str, codec, n: int):
        """codec: protocol.obs_codec(spec) (its images field first, after the header); n samples."""
        if mode not in OBS_COMPRESSIONS[1:]:
            raise ValueError(f"runtime.obs_compression={mode!r}: use one of {', '.join(OBS_COMPRESSIONS)}")
        name, _, _, self.img_off, self.img_bytes = codec.layout(n)[0]
        assert name == "images", codec
        self.buf_bytes = codec.nbytes(n)
        self.delta = mode == "delta-lz4"
        self.prev = np.zeros(self.img_bytes, np.uint8)
        self.codec = _lz4()
        # LZ4's worst case (incompressible input) plus numcodecs' 4-byte length prefix.
        self.wire = np.zeros(self.buf_bytes + self.img_bytes // 255 + 32, np.uint8)

    def _raw(self, buf: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        i0, i1 = self.img_off, self.img_off + self.img_bytes
        return buf[:i0], buf[i0:i1], buf[i1:self.buf_bytes]

    def encode(self, buf: np.ndarray) -> np.ndarray:
        """The wire bytes of packed buffer `buf` (a view of this end's wire buffer, valid until
        the next encode)."""
        head, images, tail = self._raw(buf)
        if self.delta:
            frame = np.bitwise_xor(images, self.prev)
            self.prev[:] = images
        else:
            frame = images
        packed = self.codec.encode(frame)
        n0 = head.size + tail.size
        self.wire[:head.size] = head
        self.wire[head.size:n0] = tail
        self.wire[n0:n0 + len(packed)] = np.frombuffer(packed, np.uint8)
        return self.wire[:n0 + len(packed)]

    def decode(self, wire: np.ndarray, buf: np.ndarray) -> None:
        """Unpack wire bytes into the packed buffer `buf` (what the sender's encode was given)."""
        head, images, tail = self._raw(buf)
        n0 = head.size + tail.size
        head[:] = wire[:head.size]
        tail[:] = wire[head.size:n0]
        self.codec.decode(wire[n0:].tobytes(), out=images)
        if self.delta:
            np.bitwise_xor(images, self.prev, out=images)
            self.prev[:] = images


def obs_wire(cfg, codec, n: int) -> ObsWire | None:
    """One group's end of the path for runtime.obs_compression (None: no compression)."""
    mode = cfg.runtime.obs_compression
    return None if mode == "none" else ObsWire(mode, codec, n)
