"""What crosses between the grader and the child process that runs a notebook's code.

The grader sends requests as any picklable objects (the child trusts the grader). The child answers with
:func:`pack`, which keeps only plain values (numbers, strings, tensors, tuples, lists, dicts,
numpy scalars and arrays as values) and writes them with ``torch.save``; the grader reads them
with :func:`unpack`, ``torch.load(weights_only=True)``, which builds nothing else: an answer can
make the grader hold a value, never run code. Anything else a student's function returns comes
back as an :class:`Opaque` object of the same type name, which every checker refuses as the
wrong type, as it would the object itself.

Each message is framed by its length (8 bytes, big-endian) on a pipe.
"""
from __future__ import annotations

import io
import os
import select
import time

import numpy as np
import torch

#: The most a child's answer may hold: anything larger is refused, as a student's answer.
MAX_BYTES = 1 << 30
#: How deep and how many nested values an answer may have.
_MAX_DEPTH, _MAX_NODES = 32, 200_000


class TooLarge(Exception):
    """An answer beyond :data:`MAX_BYTES` or the nesting limits."""


class Opaque:
    """Stands for a value of a type the wire does not carry; its class is named after the original's."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} object>"


def _opaque(type_name: str) -> Opaque:
    return type(str(type_name)[:100], (Opaque,), {})()


def to_plain(value, _depth: int = 0, _count: list | None = None):
    """``value`` as a tree of tagged plain values: a container is ``[tag, ...]``, a leaf is itself."""
    count = _count if _count is not None else [0]
    count[0] += 1
    if _depth > _MAX_DEPTH or count[0] > _MAX_NODES:
        raise TooLarge("the value is nested too deeply or holds too many items")
    if value is None or isinstance(value, (bool, int, float, complex, str)):
        return value
    if isinstance(value, torch.Tensor):
        return ["tensor", value.detach(), bool(value.requires_grad)]
    if isinstance(value, (torch.dtype, torch.device)):
        return ["torch", str(value)]
    if isinstance(value, np.generic) and value.dtype.kind in "biufc":
        return ["np", value.dtype.str, value.item()]
    if isinstance(value, np.ndarray) and value.dtype.kind in "biufc":
        return ["ndarray", torch.from_numpy(np.ascontiguousarray(value)).clone(), value.dtype.str]
    if isinstance(value, torch.Size):
        return ["size", list(value)]
    if type(value) in (tuple, list):
        return ["tuple" if type(value) is tuple else "list", [to_plain(v, _depth + 1, count) for v in value]]
    if type(value) is dict:
        return ["dict", [[to_plain(k, _depth + 1, count), to_plain(v, _depth + 1, count)] for k, v in value.items()]]
    return ["opaque", type(value).__name__]


def from_plain(tree):
    """The value :func:`to_plain` encoded (an :class:`Opaque` where it could not)."""
    if not isinstance(tree, list):
        return tree
    tag, *rest = tree
    if tag == "tensor":
        t, grad = rest
        return t.requires_grad_(True) if grad and (t.is_floating_point() or t.is_complex()) else t
    if tag == "torch":
        text = str(rest[0])
        if text.startswith("torch."):
            dtype = getattr(torch, text[len("torch."):], None)
            return dtype if isinstance(dtype, torch.dtype) else _opaque("dtype")
        try:
            return torch.device(text)
        except (RuntimeError, ValueError):
            return _opaque("device")
    if tag == "np":
        try:
            return np.dtype(rest[0]).type(rest[1])
        except (TypeError, ValueError):
            return _opaque("numpy scalar")
    if tag == "ndarray":
        return rest[0].numpy().astype(np.dtype(rest[1]), copy=False)
    if tag == "size":
        return torch.Size(rest[0])
    if tag in ("tuple", "list"):
        items = [from_plain(v) for v in rest[0]]
        return tuple(items) if tag == "tuple" else items
    if tag == "dict":
        out = {}
        for k, v in rest[0]:
            key = from_plain(k)
            try:
                out[key] = from_plain(v)
            except TypeError:               # a key that cannot be one (a tensor, a list): not a dict we take
                return _opaque("dict")
        return out
    return _opaque(rest[0] if rest else "object")


def pack(message: dict) -> bytes:
    """A child's answer (a dict of plain values) as bytes :func:`unpack` reads back safely."""
    buf = io.BytesIO()
    torch.save(message, buf)
    return buf.getvalue()


def unpack(data: bytes) -> dict:
    """:func:`pack`'s bytes as the dict, built from plain values only (``weights_only``)."""
    return torch.load(io.BytesIO(data), weights_only=True, map_location=None)


def send(fd: int, data: bytes) -> None:
    """Write one framed message."""
    view = memoryview(len(data).to_bytes(8, "big") + data)
    while view:
        view = view[os.write(fd, view):]


class Closed(Exception):
    """The other side closed the pipe (the child ended)."""


class TimedOut(Exception):
    """No whole message came in the time given."""


def receive(fd: int, timeout: float | None = None, limit: int = MAX_BYTES) -> bytes:
    """Read one framed message, waiting at most ``timeout`` seconds (None: for ever)."""
    deadline = None if timeout is None else time.monotonic() + timeout

    def read(n: int) -> bytes:
        chunks, left = [], n
        while left:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], wait)[0]:
                raise TimedOut()
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                raise Closed()
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    size = int.from_bytes(read(8), "big")
    if size > limit:
        raise TooLarge(f"a message of {size} bytes")
    return read(size)


def request(obj) -> bytes:
    """A request from the grader: any picklable objects (only the child reads it, and trusts it),
    written with ``torch.save``, whose format keeps every tensor dtype (plain pickle loses e4m3's)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def read_request(data: bytes):
    """:func:`request`'s objects, in the child."""
    return torch.load(io.BytesIO(data), weights_only=False)
