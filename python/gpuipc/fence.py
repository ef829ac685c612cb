"""GPU fences between processes: stream-ordered signal and wait on a 64-bit counter in a small
cuda-vmm buffer (crosses containers), or on a CUDA IPC event (openers need another PID than the
creator's and the same /dev/shm).

    f = c.create_fence('train/step')                  g = c.open_fence('train/step')
    ... kernels on stream s ...                       g.wait(n, stream=s2)   # GPU waits, host does not
    f.signal(n, stream=s)                             ... kernels on s2 read what s wrote ...
"""
from typing import Any, Optional

from . import _lib
from .errors import StateError


def stream_handle(stream: Any) -> Optional[int]:
    """The raw CUstream of a torch.cuda.Stream, a CuPy stream, an object with __cuda_stream__, an int,
    or None (the legacy default stream)."""
    if stream is None:
        return None
    if isinstance(stream, int):
        return stream or None
    if hasattr(stream, '__cuda_stream__'):
        return stream.__cuda_stream__()[1] or None
    for attr in ('cuda_stream', 'ptr', 'handle'):
        value = getattr(stream, attr, None)
        if isinstance(value, int):
            return value or None
    raise TypeError(f'not a CUDA stream: {stream!r} (give a torch.cuda.Stream, a CuPy stream, an int or None)')


def torch_current_stream(ordinal: int) -> Optional[int]:
    """torch's current stream on device `ordinal` as a raw CUstream; None (the legacy default
    stream) when torch is not loaded."""
    import sys
    torch = sys.modules.get('torch')
    if torch is None:
        return None
    return torch.cuda.current_stream(max(ordinal, 0)).cuda_stream


class Fence:
    """A fence from `Client.create_fence()` (its creator) or `Client.open_fence()`. Close it (or leave
    a ``with`` block) before its client, and only once no queued GPU work still refers to it."""

    # The package's internal interface to it: what other modules use, and why (tests/python/layers.py).
    _INTERNAL = {
        '_handle': 'the client forgets it when it closes or loses the connection',
    }

    def __init__(self, client, handle, name, created):
        self._client, self._handle, self.name, self.created = client, handle, name, created
        self._lib = _lib.load()
        self._next = 0

    def __repr__(self):
        return f'<gpuipc.Fence {self.name!r}{" (creator)" if self.created else ""}>'

    def _h(self):
        if not self._handle:
            raise StateError(f'fence {self.name!r} is closed')
        return self._handle

    def _call(self, what, fn, *args):
        """fn(handle, *args) under the client's lock; raises the exception for a failure."""
        client = self._client
        h = self._h()
        with client._locked():
            client._check(fn(h, *args), f'fence {what}')

    def signal(self, value: Optional[int] = None, stream: Any = None) -> int:
        """Enqueues in `stream` a write of `value` after all prior work in that stream. Without a
        value: the next value of this fence's own counter (1, 2, ...). Returns the value written."""
        value = self._next + 1 if value is None else int(value)
        self._call('signal', self._lib.gpuipc_fence_signal, stream_handle(stream), value)
        self._next = max(self._next, value)
        return value

    def wait(self, value: int, stream: Any = None) -> None:
        """Enqueues in `stream` a wait until the counter reaches `value` (the host does not wait)."""
        self._call('wait', self._lib.gpuipc_fence_wait, stream_handle(stream), int(value))

    @property
    def value(self) -> int:
        """The counter, read from the host (never waits behind queued fence waits)."""
        import ctypes
        v = ctypes.c_uint64()
        self._call('read', self._lib.gpuipc_fence_value, ctypes.byref(v))
        return v.value

    def close(self) -> None:
        """Closes the fence: the creator unpublishes and frees it, an opener releases it (idempotent)."""
        handle, self._handle = self._handle, None
        if handle:
            self._client._fence_closed(self, handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
