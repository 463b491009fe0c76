"""The env worker's wire format when the worker runs under another interpreter (`env.python`).

An env whose packages conflict with ours (LIBERO pins robosuite 1.4, RoboCasa its own mujoco and
numpy) runs in a child process of another virtual environment, so nothing may cross the pipe as
a pickle: a numpy 2 pickle names `numpy._core`, which numpy 1 cannot import, and a pickled
RunConfig would need our config module's version on the other side. A message is a JSON header
plus the raw bytes of its arrays:

    4-byte little-endian header length | header (UTF-8 JSON) | array 0 bytes | array 1 bytes | ...

The header is the message as JSON, each array replaced by {"__nd__": [dtype, shape]} (dtypes as
numpy's portable `dtype.str`, e.g. "<f4", "|u1"), each dataclass of `DATACLASSES` by
{"__dc__": name, ...its fields}, each tuple by {"__tuple__": [...]}. Only numpy and the stdlib
are imported here: this module runs under the other interpreter too.
"""
from __future__ import annotations

import dataclasses
import json
import struct
from types import SimpleNamespace

import numpy as np

from .base import Obs, StepOut

DATACLASSES = {c.__name__: c for c in (Obs, StepOut)}


def encode(msg) -> bytes:
    arrays: list[np.ndarray] = []
    header = json.dumps(_to_tree(msg, arrays), separators=(",", ":")).encode()
    return b"".join([struct.pack("<I", len(header)), header, *(a.tobytes() for a in arrays)])


def decode(data: bytes):
    (n,) = struct.unpack_from("<I", data)
    tree = json.loads(data[4:4 + n])
    offset = [4 + n]
    return _from_tree(tree, data, offset)


def _to_tree(x, arrays: list):
    if isinstance(x, np.ndarray):
        a = np.ascontiguousarray(x)
        arrays.append(a)
        return {"__nd__": [a.dtype.str, list(a.shape)]}
    if isinstance(x, np.generic):
        return x.item()
    if dataclasses.is_dataclass(x) and type(x).__name__ in DATACLASSES:
        return {"__dc__": type(x).__name__, **{f.name: _to_tree(getattr(x, f.name), arrays) for f in dataclasses.fields(x)}}
    if isinstance(x, tuple):
        return {"__tuple__": [_to_tree(v, arrays) for v in x]}
    if isinstance(x, list):
        return [_to_tree(v, arrays) for v in x]
    if isinstance(x, dict):
        return {str(k): _to_tree(v, arrays) for k, v in x.items()}
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    raise TypeError(f"env worker wire: cannot send a {type(x).__name__} (numpy arrays, the env dataclasses, "
                    "JSON values, lists, tuples and dicts only)")


def _from_tree(t, data: bytes, offset: list):
    if isinstance(t, list):
        return [_from_tree(v, data, offset) for v in t]
    if not isinstance(t, dict):
        return t
    if "__nd__" in t:
        dtype, shape = np.dtype(t["__nd__"][0]), tuple(t["__nd__"][1])
        count = int(np.prod(shape, dtype=np.int64))
        a = np.frombuffer(data, dtype, count=count, offset=offset[0]).reshape(shape)
        offset[0] += count * dtype.itemsize
        return a.copy()   # writable, and independent of the message buffer
    if "__tuple__" in t:
        return tuple(_from_tree(v, data, offset) for v in t["__tuple__"])
    if "__dc__" in t:
        cls = DATACLASSES[t["__dc__"]]
        return cls(**{k: _from_tree(v, data, offset) for k, v in t.items() if k != "__dc__"})
    return {k: _from_tree(v, data, offset) for k, v in t.items()}


def config_tree(cfg) -> dict:
    """A RunConfig as plain JSON values (the worker rebuilds attribute access with `namespace`)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def namespace(tree):
    """Nested dicts as nested SimpleNamespaces: `cfg.env.task` reads as it does on a RunConfig."""
    if isinstance(tree, dict):
        return SimpleNamespace(**{k: namespace(v) for k, v in tree.items()})
    return tree


class WireConnection:
    """A multiprocessing Connection that carries wire messages instead of pickles (the same
    send / recv / poll / close as the Connection a spawned child gets)."""

    def __init__(self, conn):
        self.conn = conn

    def send(self, msg) -> None:
        self.conn.send_bytes(encode(msg))

    def recv(self):
        return decode(self.conn.recv_bytes())

    def poll(self, timeout: float = 0.0) -> bool:
        return self.conn.poll(timeout)

    def fileno(self) -> int:
        return self.conn.fileno()

    @property
    def closed(self) -> bool:
        return self.conn.closed

    def close(self) -> None:
        self.conn.close()
