"""Rings: a producer's K slots in shared memory and members that take frames from them without a
broker round trip per frame (docs/design.md "Rings"; gpuipc.h section "rings").

    with c.ring('cam0', shape=(1080, 1920, 3), dtype='uint8', slots=8) as ring:      # producer
        for image in camera:
            with ring.acquire() as frame:          # a writable frame; publish()ed when the block ends
                frame.numpy()[...] = image

    with c.join_ring('cam0', timeout_ms=5000) as ring:                               # member
        for frame in ring:                         # each frame is released when the next is taken
            x = torch.from_dlpack(frame)           # zero-copy, valid until the frame is released

Two host doorbells (futexes in the ring's control page; `fileno()` for event loops) in modes
'backpressure' (every member gets every frame) and 'latest' (the newest frame, the rest dropped for a
slow member), and the GPU doorbell in mode 'stream': cuda-vmm slots handed over in stream order
(``stream=`` takes a torch.cuda.Stream, a CuPy stream or a raw CUstream), so the host never waits for
a frame.

The ring carries no metadata of its own, so the producer also publishes a one-byte buffer named
``NAME@meta`` whose metadata says the frames' dtype and shape, the ring's geometry and the user's
own `meta`; members read it when they join (and check that its producer is the ring's). A ring made
by a C producer has none: its frames are bytes (uint8, the slot's size).
"""
import asyncio
import ctypes
import sys
import threading
import warnings
import weakref
from typing import Any, AsyncIterator, Iterator, Optional, Tuple

from . import _lib, arrays, dlpack, dtypes, errors, meta as _meta
from ._args import shape_arg, size_arg, text_bytes
from .buffer import KINDS, KIND_NAMES, View
from ._core import SLICE_MS, Deadline, exiting
from .fence import stream_handle

MODES = {'backpressure': 0, 'latest': 1, 'stream': 2}
META_SUFFIX = '@meta'

# A take_async() looks at the ring this often even when its fd stays quiet: the fd wakes for frames
# and for the broker's news (libgpuipc's ring thread reads it, and reconnects after a restart), so
# this is only a bound on a wake-up that went missing.
_ASYNC_NEWS_S = 0.25


class _SlotMemory:
    """The memory of one frame: a ring slot, usable while this side holds the frame (a member until
    it releases it, the producer until it publishes it). A View's `memory`."""

    # The package's internal interface to it: what other modules use, and why (tests/python/layers.py).
    _INTERNAL = {
        '_handle': "the slot's handle: no buffer of a client (the client looks up every View's memory by it)",
        '_usable_ptr': "a View's pointer, checked usable (buffer.View, as of every memory)",
        '_copy': "a View's read and write of host bytes (buffer.View, as of every memory)",
    }

    def __init__(self, ring, handle, facts, readonly):
        self._client, self._lib, self._handle = ring._client, _lib.load(), handle
        self.ring = ring
        self.ptr, self.size, self.kind, self.device_ordinal = facts
        self.readonly = readonly
        self.live = True

    def _usable_ptr(self):
        if not self.live:
            raise errors.StateError(f"ring '{self.ring.name}': the frame was "
                                    f"{'published' if self.ring.producer else 'released'}; its slot may be "
                                    f'rewritten: do not use views of it any more')
        return self.ptr

    def __dlpack_device__(self):
        if self.kind == 'memfd':
            return (dlpack.KDL_CPU, 0)
        return (dlpack.KDL_CUDA, max(self.device_ordinal, 0))

    def _copy(self, offset, host, length, to_host):
        self._usable_ptr()
        client = self._client
        fn = self._lib.gpuipc_buffer_read if to_host else self._lib.gpuipc_buffer_write
        with client._locked():
            client._check(fn(self._handle, offset, host, length), 'read' if to_host else 'write')


class Frame(View):
    """One frame of a ring: a zero-copy array of the ring's dtype and shape over the slot it is in
    (DLPack, `.torch()`, `.numpy()`, `.cupy()`, `.jax()`, `read()`, `write()`).

    A member's frame (`Ring.take()`) is read-only and stays valid until `release()`; leaving a
    ``with`` block releases it, and so does iterating on. Release raises `Overwritten` if the frame
    changed while held. The producer's frame (`Ring.acquire()`) is writable until `publish()`;
    leaving a ``with`` block without an exception publishes it. `number` is the frame's number (1,
    2, 3, ...; None for the producer's until published). In a 'stream' ring, `stream` is the CUDA
    stream the frame is ordered in: use the frame's memory in that stream (DLPack consumers that pass
    another stream, as torch.from_dlpack and cupy.from_dlpack do, are ordered after it).
    """

    def __init__(self, ring: 'Ring', memory: _SlotMemory, number: Optional[int], stream: Optional[int]) -> None:
        shape = ring.shape
        if shape is None:
            shape = (memory.size // dtypes.itemsize(ring.dtype),)
        View.__init__(self, memory, 0, ring.dtype, shape)
        self.ring, self.number, self.stream = ring, number, stream

    def __repr__(self):
        state = 'held' if self.held else 'gone'
        return f'<gpuipc.Frame {self.number} of ring {self.ring.name!r}: {self.dtype}{list(self.shape)}, {state}>'

    @property
    def held(self) -> bool:
        """True while this side may use the frame's memory."""
        return self.memory.live

    def release(self, stream: Any = None) -> None:
        """Member: gives the frame back (idempotent). Raises `Overwritten` if it changed while held.
        Stream rings: enqueues "done" in `stream` (default: the stream it was taken on), after the
        work queued there."""
        self.ring._release(self, stream)

    def publish(self, stream: Any = None) -> int:
        """Producer: `Ring.publish(stream)` of this frame; returns its number."""
        if self.ring._acquired is not self:
            raise errors.StateError(f"ring '{self.ring.name}': this frame is not the one acquired")
        return self.ring.publish(stream)

    def __dlpack__(self, *, stream: Any = None, max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None, copy: Optional[bool] = None) -> Any:
        """View.__dlpack__; in a stream ring, the consumer's `stream` (DLPack's convention: an int,
        1 the legacy default stream, None likewise, -1 no ordering) is first made to wait for the
        frame's stream."""
        if self.ring.mode == 'stream' and stream != -1:
            self.memory._usable_ptr()
            _order_after(0 if stream in (None, 1) else stream, self.stream or 0, self.memory.device_ordinal)
        return View.__dlpack__(self, max_version=max_version, dl_device=dl_device, copy=copy)

    def torch(self) -> Any:
        """A torch tensor over the frame (no copy); in a stream ring, ordered after the frame's stream
        in torch's current stream. Each slot has one tensor, made at its first frame and handed out
        again for every later frame in it (a DLPack import costs more than a small frame's hand-over):
        do not resize it or keep it past the frame's release."""
        ptr = self.memory._usable_ptr()  # raises once the frame is gone
        ring = self.ring
        cached = ring._tensors.get(ptr)
        if ring.mode != 'stream':
            if cached is None:
                cached = ring._tensors[ptr] = View.torch(self)
            return cached
        ordinal = max(self.memory.device_ordinal, 0)
        current = ring._torch_stream(ordinal) or 0
        if cached is None:
            import torch
            cached = ring._tensors[ptr] = torch.from_dlpack(self.__dlpack__(stream=current or 1))
        elif current != (self.stream or 0):
            _order_after(current, self.stream or 0, ordinal)
        return cached

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self.ring.producer:
            if exc_type is None and self.held:
                self.publish()
            return
        if exc_type is None:
            self.release()
        else:
            self.ring._release(self, None, quiet=True)  # the body's exception is the one to see

    def __del__(self):
        ring = getattr(self, 'ring', None)
        if ring is not None and not ring.producer and self.memory.live and ring._handle:
            warnings.warn(f"gpuipc: frame {self.number} of ring {ring.name!r} was not released; releasing it now",
                          ResourceWarning, stacklevel=2)
            ring._release_later(self)


class Ring:
    """A ring, from `Client.ring()` (its producer) or `Client.join_ring()` (a member). Use it as a
    context manager, or call `close()`: the producer closes the ring (members' takes then raise
    `RingClosed`, and iterations end), a member leaves it.

    Properties: `name`, `producer`, `mode` ('backpressure', 'latest' or 'stream'), `dtype`, `shape`
    (None for a ring of bytes whose frames are as long as a slot), `slot_size`, `slots`, `kind`,
    `max_members`, `lease_ms`, `meta` (the producer's own metadata). A member of a ring made without
    gpuipc's metadata (a C producer's) knows only `name`, `dtype` ('uint8') and, after its first
    take, `slot_size` and `kind`; the rest are None.
    """

    # The package's internal interface to it: what other modules use, and why (tests/python/layers.py).
    _INTERNAL = {
        '_handle': 'the client forgets it when it closes or loses the connection (libgpuipc closes the ring)',
        '_lock': "the ring's calls: the client closes the ring after its per-frame call in flight",
        '_forget': 'the client closes: libgpuipc closes (or forgets) the ring',
    }

    def __init__(self, client, handle, name, producer, layout, device, meta_buffer=None):
        self._client, self._handle, self.name, self.producer = client, handle, name, producer
        self._lib = _lib.load()
        self._device, self._meta_buffer = device, meta_buffer
        self.dtype = layout.get('dtype', 'uint8')
        self.shape = tuple(layout['shape']) if layout.get('shape') is not None else None
        geometry = layout.get('ring', {})
        self.mode = geometry.get('mode')
        self.slots = geometry.get('slots')
        self.slot_size = geometry.get('slot_size')
        self.kind = geometry.get('kind')
        self.max_members = geometry.get('max_members')
        self.lease_ms = geometry.get('lease_ms')
        self.meta = {k: v for k, v in layout.items() if k not in _meta.RESERVED}
        self._slot_proto = {}   # slot handle -> (its memory's attributes, a frame's), made at its first frame
        self._tensors = {}      # slot pointer -> the torch tensor its frames hand out (Frame.torch)
        self._acquired = None   # producer: the frame acquired and not yet published
        self._held = None       # member: a weak reference to the frame it holds
        self._fd = None
        # The per-frame calls: libgpuipc's data plane takes no lock of the connection's, so neither
        # does this side: a ring is used by one thread at a time (as libgpuipc wants it), and closing
        # waits for the call in flight. The out-parameters are made once.
        self._lock = threading.Lock()
        self._out_slot, self._out_number = ctypes.c_void_p(), ctypes.c_uint64()
        self._p_slot, self._p_number = ctypes.byref(self._out_slot), ctypes.byref(self._out_number)
        self._torch_stream_fn = None

    def __repr__(self):
        role = 'producer' if self.producer else 'member'
        state = '' if self._handle else ', closed'
        shape = list(self.shape) if self.shape is not None else '[slot]'
        return f'<gpuipc.Ring {self.name!r} {role}, {self.mode or "?"}, {self.dtype}{shape}{state}>'

    # ---- plumbing ----

    def _h(self):
        if not self._handle:
            raise errors.StateError(f"ring '{self.name}' is closed")
        return self._handle

    def _need(self, producer, what):
        if self.producer != producer:
            raise TypeError(f"ring '{self.name}': {what} is the {'producer' if producer else 'members'}'s "
                            f"(this side is {'its producer' if self.producer else 'a member'})")

    def _stream_arg(self, stream):
        """The raw CUstream for a stream ring's call (default: torch's current stream when torch is
        loaded, else the legacy default stream); refuses a stream for a host ring."""
        if self.mode != 'stream':
            if stream is not None:
                raise errors.InvalidArgument(f"ring '{self.name}' hands frames over with host doorbells; only "
                                 f"mode='stream' rings take a stream")
            return None
        if stream is None:
            return self._torch_stream(max(self._device, 0))
        return stream_handle(stream)

    def _torch_stream(self, ordinal):
        """torch's current CUDA stream on ordinal (raw handle) when torch is loaded, else None."""
        fn = self._torch_stream_fn
        if fn is None:
            fn = _torch_stream_getter()
            if fn is None:
                return None
            self._torch_stream_fn = fn
        return fn(ordinal) or None

    def _fail(self, r, what, closed=False):
        """Raises the exception for libgpuipc's r of a per-frame call (RingClosed when closed: the
        ring's gpuipc_ring_closed, read with the handle the call used)."""
        try:
            self._client._check(r, f"{what} (ring '{self.name}')")
        except errors.Revoked as e:
            raise _ring_ended(e, closed) from None

    def _data_call(self, what, fn, args, timeout_ms):
        """fn(handle, *args, ms, slot out, number out) for a per-frame call that may wait: at once
        with the whole timeout when it fits in one slice, else slice by slice (so that Ctrl-C and
        closing get a word in). False when it timed out."""
        first = timeout_ms if 0 <= timeout_ms <= SLICE_MS else SLICE_MS
        deadline = None
        while True:
            ms = first if deadline is None else deadline.next_slice()[0]
            with self._lock:
                h = self._handle
                if not h:
                    raise errors.StateError(f"ring '{self.name}' is closed")
                r = fn(h, *args, ms, self._p_slot, self._p_number)
                closed = r == errors.E_REVOKED and self._lib.gpuipc_ring_closed(h) == 1
            if r >= 0:
                return True
            if r != errors.E_TIMEOUT:
                self._fail(r, what, closed)
            if deadline is None:
                if 0 <= timeout_ms <= SLICE_MS:
                    return False
                deadline = Deadline(timeout_ms - SLICE_MS if timeout_ms > 0 else timeout_ms)
            elif deadline.left_ms() == 0:
                return False

    def _slot(self, handle):
        """What every frame of slot `handle` shares: its memory's facts and a frame's layout, checked
        once, at its first frame."""
        lib = self._lib
        facts = (lib.gpuipc_buffer_ptr(handle) or 0, lib.gpuipc_buffer_size(handle),
                 KIND_NAMES.get(lib.gpuipc_buffer_kind(handle), '?'), lib.gpuipc_buffer_device_ordinal(handle))
        if self.shape is not None and arrays.numel(self.shape) * dtypes.itemsize(self.dtype) > facts[1]:
            raise errors.MetadataError(f"ring '{self.name}': its metadata says {self.dtype}{list(self.shape)}, "
                                       f'which does not fit its {facts[1]}-byte slots')
        self.slot_size = self.slot_size or facts[1]
        self.kind = self.kind or facts[2]
        memory = _SlotMemory(self, handle, facts, readonly=not self.producer)
        frame = Frame(self, memory, None, None)
        proto = self._slot_proto[handle] = (dict(memory.__dict__), dict(frame.__dict__))
        memory.live = False  # the prototype is no frame: its finalizer must not release the real one
        return proto

    def _frame(self, handle, number, stream):
        """A Frame of slot `handle`: two small objects made from the slot's prototypes (no layout
        checks, no DLPack, no library call)."""
        memory_attrs, frame_attrs = self._slot_proto.get(handle) or self._slot(handle)
        memory = _SlotMemory.__new__(_SlotMemory)
        memory.__dict__.update(memory_attrs)
        frame = Frame.__new__(Frame)
        frame.__dict__.update(frame_attrs)
        frame.memory, frame.number, frame.stream = memory, number, stream
        return frame

    def _call(self, what, fn, slices=None):
        """fn(ring) under the client's lock; with slices (a _core.Deadline), fn(ring, ms) repeated while
        it times out and time is left. Raises the exception for a failure (RingClosed for a closed ring)."""
        while True:
            ms, last = slices.next_slice() if slices is not None else (None, True)
            with self._client._locked():
                h = self._h()
                r = fn(h) if slices is None else fn(h, ms)
                if r == errors.E_TIMEOUT and not last:
                    continue
                try:
                    self._client._check(r, f"{what} (ring '{self.name}')")
                except errors.Revoked as e:
                    raise _ring_ended(e, self._lib.gpuipc_ring_closed(h) == 1) from None
                return r

    # ---- producer ----

    def acquire(self, timeout_ms: int = -1, stream: Any = None) -> Frame:
        """Producer: the writable frame the next publish() makes. Backpressure: waits (up to
        timeout_ms; Timeout) until every member released the frame the slot held, evicting a member
        that holds it up past the lease. Stream rings: enqueues that wait in `stream` instead and
        returns at once. Acquiring again before publishing returns the same frame."""
        self._need(True, 'acquire()')
        if self._acquired is not None:
            return self._acquired
        cu = self._stream_arg(stream)
        lib = self._lib
        if self.mode == 'stream':
            got = self._data_call('acquire', _stream_acquire(lib), (cu,), timeout_ms)
        else:
            got = self._data_call('acquire', _host_acquire(lib), (), timeout_ms)
        if not got:
            self._fail(errors.E_TIMEOUT, 'acquire')
        self._acquired = self._frame(self._out_slot.value, None, cu)
        return self._acquired

    def publish(self, stream: Any = None) -> int:
        """Producer: makes the acquired frame the next one and wakes members that wait; returns its
        number. CUDA slots of a host ring: after a device synchronization. Stream rings: enqueues
        "frame n is ready" in `stream` (default: the stream it was acquired in) after the work
        queued there, and returns at once."""
        self._need(True, 'publish()')
        frame = self._acquired
        if frame is None:
            raise errors.StateError(f"ring '{self.name}': acquire() a frame before publishing")
        lib = self._lib
        with self._lock:
            h = self._h()
            if self.mode == 'stream':
                cu = frame.stream if stream is None else stream_handle(stream)
                r = lib.gpuipc_ring_stream_publish(h, cu, self._p_number)
            else:
                self._stream_arg(stream)
                r = lib.gpuipc_ring_publish(h, self._p_number)
        if r < 0:
            self._fail(r, 'publish')
        number = self._out_number.value
        frame.memory.live = False
        frame.number = number
        self._acquired = None
        return number

    def put(self, array: Any, timeout_ms: int = -1, stream: Any = None) -> int:
        """Producer: acquire(), copy `array` (any framework's, of the ring's shape) into the frame with
        the array's own framework (stream rings: in the frame's stream), publish(); returns the
        frame's number. A stream ring takes torch tensors and CuPy arrays only: a host copy would not
        wait in the stream for the members' release."""
        if self.mode == 'stream' and arrays.framework_of(array) not in ('torch', 'cupy'):
            raise TypeError(f"ring '{self.name}' is stream-ordered: put() copies with torch or CuPy in the "
                            f'frame\'s stream; copy a {type(array).__name__} into acquire()\'s frame yourself')
        frame = self.acquire(timeout_ms, stream)
        with _in_stream(frame.stream, self._device):
            arrays.copy_into(frame, array)
        return self.publish()

    # ---- member ----

    def take(self, timeout_ms: int = -1, stream: Any = None) -> Frame:
        """Member: the next frame (backpressure: every frame in order; latest: the newest one not taken
        yet), waiting up to timeout_ms (negative: as long as it takes; Timeout otherwise). Release it
        (or use ``with ring.take() as frame:``) before taking the next. Stream rings: enqueues in
        `stream` a wait until the frame is ready and returns at once. Raises RingClosed once the
        producer closed the ring, Revoked if it died or evicted this member."""
        frame = self._take(timeout_ms, stream)
        if frame is None:
            raise errors.Timeout(f"ring '{self.name}': no frame within {timeout_ms} ms", errors.E_TIMEOUT, 'take', '',
                                 '', 'timeout')
        return frame

    def _take(self, timeout_ms, stream):
        """take(), or None when timeout_ms passed without a frame."""
        self._need(False, 'take()')
        held = self._held() if self._held is not None else None
        if held is not None and held.held:
            raise errors.StateError(f"ring '{self.name}': frame {held.number} is still held; release it first "
                                    f'(or take frames with `for frame in ring` or `with ring.take() as frame`)')
        cu = self._stream_arg(stream)
        lib = self._lib
        if self.mode == 'stream':
            got = self._data_call('take', _stream_take(lib), (cu,), timeout_ms)
        else:
            got = self._data_call('take', _host_take(lib), (), timeout_ms)
        if not got:
            return None
        try:
            frame = self._frame(self._out_slot.value, self._out_number.value, cu)
        except BaseException:
            self._call('release', self._release_fn(cu))  # a frame we cannot describe goes back at once
            raise
        self._held = weakref.ref(frame)
        return frame

    def _release_fn(self, cu):
        lib = self._lib
        if self.mode == 'stream':
            return lambda r: lib.gpuipc_ring_stream_release(r, cu)
        return lib.gpuipc_ring_release

    def _release(self, frame, stream, quiet=False):
        memory = frame.memory
        if self.producer or not memory.live:
            return
        memory.live = False
        lib = self._lib
        with self._lock:
            h = self._handle
            if not h:
                return  # the ring (or its client) is closed: nothing is held any more
            if self.mode == 'stream':
                r = lib.gpuipc_ring_stream_release(h, frame.stream if stream is None else stream_handle(stream))
            else:
                r = lib.gpuipc_ring_release(h)
        if r >= 0 or quiet:
            return
        try:
            self._fail(r, 'release')
        except errors.Revoked as e:
            raise _recast(e, errors.Overwritten) from None

    def _release_later(self, frame):
        """From a finalizer: release now if the ring is free, else once the call in flight is done
        (never blocks, never raises)."""
        frame.memory.live = False
        if exiting():
            return  # the connection's end lets go of the frame (at exit nothing is released one by one)
        release = self._release_fn(frame.stream)

        def call():
            with self._lock:
                if self._handle:
                    release(self._handle)
        if self._lock.acquire(blocking=False):
            try:
                if self._handle:
                    release(self._handle)
            finally:
                self._lock.release()
        else:
            self._client._call_later(call)

    def frames(self, timeout_ms: int = -1, stream: Any = None) -> Iterator[Frame]:
        """Member: yields frames as they come, releasing each when the next is asked for; stops when
        the producer closes the ring, or when none came for timeout_ms (negative: never). Release
        raising Overwritten comes out of the loop; the frame held when the loop is left early is
        released without a word (release it yourself to hear about it)."""
        while True:
            try:
                frame = self._take(timeout_ms, stream)
            except errors.RingClosed:
                return
            if frame is None:
                return
            try:
                yield frame
            except GeneratorExit:
                self._release(frame, None, quiet=True)
                raise
            frame.release()

    def __iter__(self) -> Iterator[Frame]:
        """`frames()`: every frame until the producer closes the ring."""
        return self.frames()

    def fileno(self) -> int:
        """Member: an fd that is readable when a frame may be ready, for event loops (take with
        timeout_ms=0 until it raises Timeout: that resets it), and as soon as news from the broker
        ends the ring for this member (the producer died, it was evicted: take then raises). A helper
        thread of libgpuipc sleeps on the ring's doorbell for it, from the first call on."""
        self._need(False, 'fileno()')
        if self._fd is None:
            self._fd = self._call('fd', lambda r: self._lib.gpuipc_ring_fd(r))
        return self._fd

    async def take_async(self, stream: Any = None) -> Frame:
        """Member: take() for asyncio: waits on fileno() in the running loop, never blocks it."""
        loop = asyncio.get_running_loop()
        fd = self.fileno()
        while True:
            frame = self._take(0, stream)
            if frame is not None:
                return frame
            ready = loop.create_future()
            loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
            try:
                await asyncio.wait_for(ready, _ASYNC_NEWS_S)
            except asyncio.TimeoutError:
                pass
            finally:
                loop.remove_reader(fd)

    async def _aframes(self, stream):
        while True:
            try:
                frame = await self.take_async(stream)
            except errors.RingClosed:
                return
            try:
                yield frame
            except GeneratorExit:
                self._release(frame, None, quiet=True)
                raise
            frame.release()

    def __aiter__(self) -> AsyncIterator[Frame]:
        """``async for frame in ring``: take_async() until the producer closes the ring, each frame
        released when the next is asked for."""
        return self._aframes(None)

    # ---- either side ----

    def set_spin(self, spin_us: int) -> None:
        """Busy-waits up to spin_us before sleeping: a member for a frame, the producer for a free
        slot (lower latency, a core spent)."""
        spin_us = int(spin_us)
        if spin_us < 0:
            raise errors.InvalidArgument('spin_us must not be negative')
        with self._client._locked():
            self._lib.gpuipc_ring_set_spin(self._h(), spin_us)

    def _forget(self):
        """The client closes: libgpuipc closes the ring itself; nothing of it may be used any more."""
        with self._lock:  # after the per-frame call in flight, if any
            self._handle, self._meta_buffer = None, None
        for frame in (self._acquired, self._held() if self._held is not None else None):
            if frame is not None:
                frame.memory.live = False
        self._acquired = None

    @property
    def closed(self) -> bool:
        """True after close() (or the client's close())."""
        return not self._handle

    def close(self) -> None:
        """Producer: closes the ring and unpublishes its metadata; member: leaves it, releasing a frame
        it holds. Idempotent. Views of its frames must not be used afterwards."""
        if not self._handle:
            return
        client = self._client
        if self._meta_buffer is not None and not client.closed:
            meta_buffer, self._meta_buffer = self._meta_buffer, None
            try:
                client.free(meta_buffer)
            except errors.Error:
                pass  # the ring goes anyway; the buffer goes with the client
        for frame in (self._acquired, self._held() if self._held is not None else None):
            if frame is not None:
                frame.memory.live = False
        self._acquired = None
        self._tensors.clear()
        client._ring_closed(self)  # libgpuipc releases a frame still held

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, '_handle', None):
            warnings.warn(f'gpuipc: ring {self.name!r} was not closed; closing it now', ResourceWarning,
                          stacklevel=2)
            handle, self._handle = self._handle, None
            client, meta_buffer, lib = self._client, self._meta_buffer, self._lib

            def close():
                if meta_buffer is not None and meta_buffer._handle:
                    client._free_held(meta_buffer)  # first, as close() does
                lib.gpuipc_ring_close(handle)
            client._call_later(close)


_HINTS = {
    'RingClosed': 'the producer closed the ring: no frame comes any more',
    'Revoked': "this membership of the ring ended (its producer died or did not come back within a broker "
               "restart's grace, or evicted this member): no frame comes from it any more; join the ring again "
               'to take the frames of its next producer',
    'Overwritten': 'the producer evicted this member, which held the ring up past its lease: release frames '
                   'sooner, or make the ring with a longer lease_ms',
}


def _ring_ended(e, closed):
    """A ring call's Revoked as the ring's failure, with a hint about rings, never libgpuipc's about
    buffers (whose 'publish broker-held' no ring can do): RingClosed when its producer closed it
    (closed: gpuipc_ring_closed, never the text of the failure)."""
    return _recast(e, errors.RingClosed if closed else errors.Revoked)


def _recast(e, cls):
    """The same failure as an instance of cls (a subclass of e's class that names it better), with a
    hint about rings rather than libgpuipc's about buffers."""
    return errors.from_code(e.code, e.operation, e.detail, _HINTS[cls.__name__], e.name, cls)


# The per-frame calls as _data_call wants them: (handle, [stream,] ms, slot out, number out).
def _stream_acquire(lib):
    return lambda h, cu, ms, p_slot, p_number: lib.gpuipc_ring_stream_acquire(h, cu, ms, p_slot)


def _host_acquire(lib):
    return lambda h, ms, p_slot, p_number: lib.gpuipc_ring_acquire(h, ms, p_slot)


def _stream_take(lib):
    return lib.gpuipc_ring_stream_take


def _host_take(lib):
    return lib.gpuipc_ring_take


def _torch_stream_getter():
    """A function ordinal -> torch's current raw CUDA stream, once torch is loaded (its own raw getter
    when it has one: no Stream object per call), else None."""
    torch = sys.modules.get('torch')
    if torch is None or not torch.cuda.is_available():
        return None
    raw = getattr(torch._C, '_cuda_getCurrentRawStream', None)
    if raw is not None:
        return raw
    return lambda ordinal: torch.cuda.current_stream(ordinal).cuda_stream


def _current_torch_stream(ordinal):
    """torch's current CUDA stream (raw handle) when torch is loaded, else None (the legacy default)."""
    torch = sys.modules.get('torch')
    if torch is None or not torch.cuda.is_available():
        return None
    return torch.cuda.current_stream(max(ordinal, 0)).cuda_stream or None


def _in_stream(handle, ordinal):
    """A context in which torch's and CuPy's current stream is `handle` (a raw CUstream; None or 0:
    leave them as they are)."""
    import contextlib
    stack = contextlib.ExitStack()
    if handle:
        torch = sys.modules.get('torch')
        if torch is not None:
            stack.enter_context(torch.cuda.stream(torch.cuda.ExternalStream(handle, device=ordinal)))
        cupy = sys.modules.get('cupy')
        if cupy is not None:
            stack.enter_context(cupy.cuda.ExternalStream(handle, ordinal))
    return stack


def _order_after(waiter, signaller, ordinal):
    """Makes CUDA stream `waiter` wait for the work queued so far in `signaller` (raw handles, 0: the
    legacy default stream), with torch's or CuPy's events, whichever is loaded."""
    if waiter == signaller:
        return
    torch = sys.modules.get('torch')
    if torch is not None:
        def stream(h):
            return torch.cuda.default_stream(ordinal) if h == 0 else torch.cuda.ExternalStream(h, device=ordinal)
        stream(waiter).wait_stream(stream(signaller))
        return
    cupy = sys.modules.get('cupy')
    if cupy is not None:
        def stream(h):
            return cupy.cuda.Stream.null if h == 0 else cupy.cuda.ExternalStream(h, ordinal)
        with cupy.cuda.Device(ordinal):
            event = cupy.cuda.Event(disable_timing=True)
            event.record(stream(signaller))
            stream(waiter).wait_event(event)
        return
    raise BufferError(f'the frame is ordered in CUDA stream {signaller:#x}, its consumer asks for {waiter:#x}: use '
                      f'the frame in its own stream (or load torch or CuPy, which gpuipc uses to order one after '
                      f'the other)')


# ---- making and joining rings (Client.ring / Client.join_ring) ----

def _layout(name, slots, slot_size, shape, dtype, mode, kind, device, max_members, lease_ms):
    """(kind, slot size, the metadata layout map) for a new ring, after checking the arguments."""
    if mode not in MODES:
        raise errors.InvalidArgument(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    kind = kind or ('cuda-vmm' if mode == 'stream' else 'memfd')
    if kind not in ('memfd', 'cuda-vmm'):
        raise errors.InvalidArgument(f"a ring's slots are 'memfd' or 'cuda-vmm', not {kind!r}")
    if mode == 'stream' and kind != 'cuda-vmm':
        raise errors.InvalidArgument("mode='stream' hands frames over in CUDA streams: its slots are 'cuda-vmm'")
    layout = {}
    if shape is not None:
        shape = shape_arg(shape)
        dtype = dtypes.name(dtype if dtype is not None else 'float32')
        nbytes = arrays.numel(shape) * dtypes.itemsize(dtype)
        if slot_size is None:
            slot_size = max(nbytes, 1)
        elif int(slot_size) < nbytes:
            raise errors.InvalidArgument(f'slot_size {slot_size} is smaller than a {dtype}{list(shape)} frame ({nbytes} bytes)')
        layout['shape'] = list(shape)
    elif slot_size is None:
        raise errors.InvalidArgument('a ring needs slot_size (bytes), or shape and dtype')
    layout['dtype'] = dtypes.name(dtype) if dtype is not None else 'uint8'
    slot_size = size_arg(slot_size, f'slot_size {slot_size!r}')
    for what, value in (('slots', slots), ('max_members', max_members), ('lease_ms', lease_ms)):
        if int(value) <= 0:
            raise errors.InvalidArgument(f'{what} must be positive, not {value}')
    layout['ring'] = {'mode': mode, 'slots': int(slots), 'slot_size': slot_size, 'kind': kind,
                      'max_members': int(max_members), 'lease_ms': int(lease_ms), 'device': int(device)}
    return kind, slot_size, layout


def create(client, name, slots, slot_size, shape, dtype, mode, kind, device, max_members, lease_ms, meta):
    """Client.ring(): publishes NAME@meta, then creates the ring (undoing the first if that fails)."""
    target = text_bytes(name, 'ring name')
    kind, slot_size, layout = _layout(name, slots, slot_size, shape, dtype, mode, kind, device, max_members,
                                      lease_ms)
    if mode == 'stream' and not _lib.has('gpuipc_ring_stream_acquire'):
        raise errors.KindError(f"mode='stream' needs stream-ordered rings (gpuipc_ring_stream_*), which this "
                               f'libgpuipc ({_lib.version()}) does not have yet')
    raw = _meta.pack(meta, layout)
    meta_buffer = client.alloc(1, 'memfd')
    try:
        client._publish_raw(meta_buffer, target + META_SUFFIX.encode(), raw)
        opts = _lib.RingOptions(ctypes.sizeof(_lib.RingOptions), KINDS[kind], slot_size, int(slots),
                                int(max_members), int(device), MODES[mode], int(lease_ms))
        h = ctypes.c_void_p()
        with client._locked():
            client._check(_lib.load().gpuipc_ring_create(client._c, target, ctypes.byref(opts), ctypes.byref(h)),
                          f"create ring '{name}'")
            ring = Ring(client, h.value, name, True, layout, int(device), meta_buffer)
            client._ring_opened(ring)
        return ring
    except BaseException:
        client.free(meta_buffer)
        raise


def join(client, name, timeout_ms, device):
    """Client.join_ring(): joins (waiting up to timeout_ms for the ring), then reads NAME@meta."""
    target = text_bytes(name, 'ring name')
    deadline = Deadline(timeout_ms)
    h = ctypes.c_void_p()
    lib = _lib.load()
    while True:
        ms, last = deadline.next_slice()
        with client._locked():
            client._set_device(device)
            r = lib.gpuipc_ring_join(client._c, target, ms, ctypes.byref(h))
            if r == errors.E_NOT_FOUND and not last:
                continue
            if r == errors.E_NOT_FOUND and timeout_ms != 0:
                # The broker's last word says whether the ring is missing or only not ready (being
                # set up, or no seat with its new pages yet: its producer makes no ring calls); it
                # is passed on as it is, never parsed.
                said = (lib.gpuipc_errmsg(client._c) or b'').decode(errors='replace')
                why = said or 'no ring of that name appeared'
                raise errors.from_code(errors.E_TIMEOUT, f"join ring '{name}'", f'{why} within {timeout_ms} ms',
                                       'check that the producer runs and uses the same ring name and socket',
                                       'timeout')
            client._check(r, f"join ring '{name}'")
            break
    try:
        layout = _read_layout(client, name)
    except BaseException:
        with client._locked():
            lib.gpuipc_ring_close(h.value)
        raise
    ring = Ring(client, h.value, name, False, layout, int(device))
    client._ring_opened(ring)
    return ring


def _read_layout(client, name):
    """The metadata map of NAME@meta when its producer is the ring's, {} when there is none."""
    try:
        attached = client.attach(name + META_SUFFIX, 0)
    except errors.NotFound:
        return {}
    with attached:
        layout, meta_id = attached.meta, attached.id
    parts = client.buffers(name + '@')  # NAME@meta and the ring's parts (NAME@ctl, NAME@slot.K, ...)
    owners = {b.id: b.owner for b in parts if b.name == name + META_SUFFIX}
    ring_owners = {b.owner for b in parts if b.name == name + '@ctl' and b.state == 'live'}
    if meta_id not in owners or owners[meta_id] not in ring_owners:
        raise errors.MetadataError(f"ring '{name}': the buffer {name}{META_SUFFIX} is not its producer's (or the "
                                   f"ring's control page is not listed to this peer): its dtype and shape cannot "
                                   f'be trusted')
    if not isinstance(layout.get('ring'), dict) or layout['ring'].get('mode') not in MODES:
        raise errors.MetadataError(f"ring '{name}': {name}{META_SUFFIX} does not describe a ring: {layout!r}")
    try:  # checked as every view's layout is; the frames' fit in a slot is checked at the first one
        dtype, shape, _, _ = _meta.layout({'dtype': 'uint8', **layout})
        layout['dtype'] = dtype
        if shape is not None:
            layout['shape'] = list(arrays.check_layout(dtype, shape, None, 0, 1 << 62)[0])
    except errors.MetadataError as e:
        raise errors.MetadataError(f"ring '{name}': unusable dtype or shape in {name}{META_SUFFIX}: {e}") from None
    return layout
