"""The connection to a gpuipc-broker: producing (alloc/empty, share, publish, retire, drained,
free), consuming (attach), rings, events, fences, rendezvous groups, state dicts, and what the broker
says about itself (buffers, peers, stats).

A Client serializes its calls with a lock, so threads may share one (each call waits for the one
in progress; open one Client per thread for calls that block concurrently). A ring's frame calls
take the ring's own lock instead (they never wait for the connection). Buffers dropped
without release() by the garbage collector are released at once when the connection is idle, or
right after the call in progress otherwise.

Exit: a Client still open when the interpreter exits, or dropped without close() at exit, is
abandoned (libgpuipc's gpuipc_abandon), never closed: its connection and threads end, but no memory
is unmapped or freed and no CUDA call is made, since arrays may still view the memory and the CUDA
context may be gone by then; the process's exit releases the memory (docs/python.md, "Exit").
"""
import asyncio
import atexit
import bisect
import collections
import ctypes
import os
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Iterator, List, Mapping, Optional, Sequence, Union

from . import _lib, arrays, buffer as buffer_mod, dtypes, errors, meta as _meta, ring as _ring, state_dict as _sd
from ._args import shape_arg as _shape_arg, size_arg as _size_arg, text_bytes as _text_bytes
from ._core import Deadline, exiting
from .buffer import KINDS, Attached, Buffer, View
from .events import Event, Subscription
from .fence import Fence, torch_current_stream
from .inspection import BufferInfo, ConnectionInfo, HolderInfo, PeerInfo, Stat
from .pool import Pool
from .ring import Ring
from .state_dict import StateDict, StateDictVersion

# Every Client connected and not closed yet, abandoned at exit (_abandon_open_clients).
_open_clients = weakref.WeakSet()


def _abandon_open_clients():
    """At exit: every Client still open is abandoned while the interpreter is whole, so that no
    thread of libgpuipc runs on into the process's teardown and nothing is unmapped under arrays that
    still view it. Registered when the package is imported: exit handlers registered later (a
    script's own, which may still use or close a client) run before it."""
    for c in list(_open_clients):
        c._end(release=False, lock_timeout=2.0)


atexit.register(_abandon_open_clients)


class _Locked:
    """Client._locked()'s context manager: a class, not a generator (it runs around every call)."""

    __slots__ = ('client',)

    def __init__(self, client):
        self.client = client

    def __enter__(self):
        c = self.client
        c._lock.acquire()
        if not c._c:
            c._lock.release()
            raise errors.StateError('the client is closed')

    def __exit__(self, *exc):
        c = self.client
        try:
            c._drain_pending()
        finally:
            c._lock.release()


def _kind_code(kind):
    try:
        return KINDS[kind]
    except KeyError:
        raise errors.InvalidArgument(f"kind must be one of {', '.join(KINDS)}, not {kind!r}") from None


class Client:
    """A connection to the broker.

    socket: the broker's socket path (default: $GPUIPC_SOCKET, else /run/gpuipc/gpuipc.sock).
    label: shown by `gpuipcctl peers` (default: the program's name).
    connect_timeout_ms: keep trying this long while the socket is missing or refuses.
    reconnect: survive a broker restart (the default): after losing the broker, the next call
    reconnects, publishes this client's buffers again and reclaims what it holds (a 'reconnected'
    event), and waits go on through the outage. False: every call after the loss raises
    DisconnectedError (connect again to go on).
    probe_gpus: declare this process's visible GPUs at connect (needed to attach CUDA buffers;
    False skips initializing CUDA in a process that only uses memfd).

    Use it as a context manager, or call close(): that closes its rings and fences, releases every
    attachment and frees every buffer this client allocated.
    """

    # The package's internal interface to a client: the members that its other modules (buffers,
    # fences, pools, rings, state dicts) may use besides the public ones, each with why. Every other
    # private member is the client's own; tests/python/layers.py reads this dict.
    _INTERNAL = {
        '_c': "the connection's handle (None once closed), for libgpuipc's calls",
        '_locked': 'its lock: `with c._locked():` around every call that uses the handle',
        '_check': "turns a failed call's code into its exception",
        '_strerror': "a code's text, for an exception raised before _check",
        '_set_device': 'the device preference, told to libgpuipc before a device call',
        '_call_later': 'runs a call from a finalizer that found the lock taken',
        '_release': 'gives an attachment back',
        '_release_later': "gives an attachment back from a finalizer",
        '_publish_raw': 'publishes a buffer with metadata already packed: ring metadata, state-dict versions',
        '_publish_locked': '_publish_raw with the lock held: a pool publishes its views under it',
        '_free_held': "frees a buffer with the lock held: a ring's metadata buffer, as close() does",
        '_subscribe': 'a subscription, internal (its events never reach next_event) or not',
        '_unsubscribe': "ends a subscription (a Subscription's close, an internal wait's end)",
        '_wait_for': "waits for a matching event, keeping the others for next_event",
        '_fence_for': "the fence a publication names, opened once: wait_ready of buffers and state dicts",
        '_fence_closed': 'a fence closed itself: the client forgets it and closes its handle',
        '_pool_opened': 'a new pool: where the client finds pooled arrays, and closes at close()',
        '_pool_closed': 'a pool closed itself: forgotten, its segments kept to name PoolClosed',
        '_pool_of': 'the open pool an array lies in: a live state dict publishes its parts from it',
        '_ring_opened': 'a new ring: closed (or forgotten) with the client',
        '_ring_closed': 'a ring closes itself: forgotten, its handle closed with the lock held',
        '_sd_caches': "the state dicts' caches (state_dict.Caches): kept per connection, read by state_dict",
    }

    def __init__(self, socket: Optional[str] = None, label: Optional[str] = None, connect_timeout_ms: int = 5000,
                 reconnect: bool = True, probe_gpus: bool = True) -> None:
        self._c = None
        self._lib = _lib.load()
        self._lock = threading.Lock()
        self._pending = collections.deque()  # calls of finalizers that found the lock taken (_call_later)
        self._own = {}                       # handle -> Buffer
        self._own_ptrs = []                  # sorted (ptr, handle) of own buffers, to find an array's buffer
        self._attached = weakref.WeakSet()
        self._rings = weakref.WeakSet()
        self._fences = {}                    # handle -> Fence
        self._waited_fences = {}             # name -> Fence opened for Attached.wait_ready
        self._stash = collections.deque()    # events an internal wait took that belong to the caller
        self._internal_subs = set()          # subscriptions of internal waits (_subscribe(internal=True))
        self._publishers = {}                # state dict name -> state_dict.Publisher (or LivePublisher)
        self._sd_caches = _sd.Caches()       # parsed manifests and torch views of attached state dicts
        self._pools = []                     # Pool: where pooled arrays are found
        self._staging = {}                   # (kind, device) -> Pool for share()'s copies
        self._closed_ranges = []             # (base, size) of closed pools' segments: what PoolClosed names
        self._device_pref = -1               # what gpuipc_set_device was told last (-1: its default)
        self._pid = os.getpid()              # a child forked with this Client must not end it (_disown)
        self._lock_cm = _Locked(self)
        opts = _lib.Options(_text_bytes(socket, 'socket path') if socket else None,
                            _text_bytes(label, 'label') if label else None,
                            int(connect_timeout_ms), 0 if reconnect else 1, 0 if probe_gpus else 1)
        c = ctypes.c_void_p()
        r = self._lib.gpuipc_connect(ctypes.byref(c), ctypes.byref(opts))
        if r < 0:
            detail = (self._lib.gpuipc_errmsg(None) or b'').decode(errors='replace')
            raise errors.from_code(r, 'connect', detail, self._strerror(r), self._err_name(r))
        self._c = c.value
        _open_clients.add(self)

    def __repr__(self):
        return f'<gpuipc.Client {"open" if self._c else "closed"}>'

    def __reduce__(self):
        raise TypeError('a gpuipc.Client is a connection of this process and cannot be pickled: open a Client in '
                        'the other process (pickled Attached buffers do that for you)')

    # ---- plumbing ----

    def _strerror(self, r):
        return (self._lib.gpuipc_strerror(r) or b'').decode(errors='replace')

    def _err_name(self, r):
        return (self._lib.gpuipc_err_name(r) or b'').decode(errors='replace')

    def _check(self, r, what):
        """Raises the exception for a negative r (call with the lock held, right after the call)."""
        if r < 0:
            detail = (self._lib.gpuipc_errmsg(self._c) or b'').decode(errors='replace') if self._c else ''
            raise errors.from_code(r, what, detail, self._strerror(r), self._err_name(r))
        return r

    def _locked(self):
        """`with self._locked():` holds the connection's lock (StateError once closed) and, on the way
        out, runs the calls deferred while it was held (_call_later)."""
        return self._lock_cm

    def _set_device(self, device):
        """gpuipc_set_device, with the lock held; skipped when the preference is already that."""
        device = int(device)
        if device != self._device_pref:
            self._check(self._lib.gpuipc_set_device(self._c, device), 'set the device')
            self._device_pref = device

    def _drain_pending(self):
        while self._pending and self._c:
            self._pending.popleft()()

    def _release(self, attached, handle):
        with self._lock:
            self._attached.discard(attached)
            if not self._c:
                return  # close() released it already
            try:
                self._check(self._lib.gpuipc_release(self._c, handle), f"release '{attached.name}'")
            finally:
                self._drain_pending()

    def _release_later(self, handle):
        """From a finalizer: releases an attachment's handle (see _call_later)."""
        self._call_later(lambda: self._lib.gpuipc_release(self._c, handle))

    def _call_later(self, call):
        """From a finalizer, in any thread: runs call() with the connection now if it is free, else
        right after the call in progress (never blocks, never interleaves with a call); not at all
        once the client is closed (close() let go of everything), nor once the process is exiting
        (the connection's end lets go of it then, touching no memory), nor in a forked child."""
        if not self._c or exiting() or os.getpid() != self._pid:
            return
        if self._lock.acquire(blocking=False):
            try:
                if self._c:
                    call()
                    self._drain_pending()
            finally:
                self._lock.release()
        else:
            self._pending.append(call)

    @property
    def closed(self) -> bool:
        """True after close()."""
        return not self._c

    def close(self) -> None:
        """Closes rings and fences, releases attachments, frees this client's buffers (unmapping
        them), closes the connection. Idempotent. Views of any of them must not be used afterwards.
        While the interpreter is torn down (sys.is_finalizing()) the client is abandoned instead: see
        docs/python.md, "Exit"."""
        self._end(release=not sys.is_finalizing())

    def _end(self, release, lock_timeout=-1):
        """close() (release: libgpuipc unmaps and frees everything) or abandon (gpuipc_abandon: the
        connection and threads end, the memory stays mapped until the process exits, no CUDA call).
        Python's objects forget their handles either way. lock_timeout: give up (leaving the client
        open) when a call of another thread holds the connection longer than that."""
        if os.getpid() != self._pid:
            self._disown()
            return
        if not self._lock.acquire(timeout=lock_timeout):
            return
        try:
            if not self._c:
                return
            for ring in list(self._rings):
                ring._forget()  # libgpuipc closes (or forgets) the rings themselves
            self._rings.clear()
            for handle, fence in list(self._fences.items()):
                fence._handle = None
                if release:
                    self._lib.gpuipc_fence_close(handle)  # CUDA calls: never at exit
            self._fences.clear()
            self._waited_fences.clear()
            for a in list(self._attached):
                a._handle = None
            for b in self._own.values():
                b._handle = None
            self._own.clear()
            for pool in self._pools:
                pool._forget()  # libgpuipc frees (or forgets) the pools
            self._pools.clear()
            self._staging.clear()
            self._sd_caches.forget_views()
            self._own_ptrs.clear()
            self._pending.clear()
            self._publishers.clear()
            c, self._c = self._c, None
            _open_clients.discard(self)
            (self._lib.gpuipc_close if release else self._lib.gpuipc_abandon)(c)
        finally:
            self._lock.release()

    def _disown(self):
        """In a child forked with this client: the connection, its threads and its memory are the
        parent's, so nothing of them is called or released here (the child's exit lets go of its
        copies); the objects only forget their handles. No lock is taken: a thread of the parent may
        have held one at the fork."""
        self._c = None
        _open_clients.discard(self)
        for ring in list(self._rings):
            ring._handle = None
        for pool in self._pools:
            pool._handle = None
        for fence in self._fences.values():
            fence._handle = None
        for a in list(self._attached):
            a._handle = None
        for b in self._own.values():
            b._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if not getattr(self, '_c', None):
            return
        try:
            if os.getpid() != self._pid:
                self._disown()
                return
            # Nothing that still views the memory can reference an unreachable client, except tensors
            # that torch's allocator put in a pool of it; at exit anything may view it, and CUDA may
            # be gone.
            release = not exiting() and not any(p._mempool is not None for p in self._pools)
            if not sys.is_finalizing():
                warnings.warn('gpuipc: a Client was not closed; ' +
                              ('closing it now' if release else 'closing its connection now (its memory stays '
                               'mapped until the process exits)'), ResourceWarning, stacklevel=2)
            self._end(release)
        except Exception:
            # This module's globals are gone already: the interpreter is being torn down.
            c, self._c = self._c, None
            if c:
                self._lib.gpuipc_abandon(c)

    def ping(self, timeout_ms: int = 5000) -> float:
        """One round trip to the broker; returns how long it took, in seconds."""
        t0 = time.monotonic()
        with self._locked():
            self._check(self._lib.gpuipc_ping(self._c, int(timeout_ms)), 'ping')
        return time.monotonic() - t0

    def fileno(self) -> int:
        """The connection's socket, for an event loop: when it is readable, call process()."""
        with self._locked():
            return self._lib.gpuipc_fd(self._c)

    def process(self) -> int:
        """Reads whatever the broker sent, without waiting; returns how many events are queued."""
        with self._locked():
            return self._check(self._lib.gpuipc_process(self._c), 'process') + len(self._stash)

    # ---- producer ----

    def _register(self, handle, dtype='uint8', shape=None):
        try:
            buf = Buffer(self, handle, dtype, shape)
        except BaseException:
            self._lib.gpuipc_buffer_free(self._c, handle)
            raise
        self._own[handle] = buf
        bisect.insort(self._own_ptrs, (buf.ptr, handle))
        return buf

    def _forget(self, buf):
        self._own.pop(buf._handle, None)
        try:
            self._own_ptrs.remove((buf.ptr, buf._handle))
        except ValueError:
            pass
        buf._handle = None

    def alloc(self, nbytes: int, kind: str = 'memfd', device: int = 0) -> Buffer:
        """A new Buffer of `nbytes` bytes (a uint8 array): memfd (host memory), cuda-vmm or
        cuda-legacy on CUDA device `device`."""
        nbytes = _size_arg(nbytes, f'allocate {nbytes!r} bytes of {kind}')
        code = _kind_code(kind)
        h = ctypes.c_void_p()
        with self._locked():
            self._check(self._lib.gpuipc_buffer_alloc(self._c, code, nbytes, int(device), ctypes.byref(h)),
                        f'allocate {nbytes} bytes of {kind}')
            return self._register(h.value)

    def empty(self, shape: Union[int, Sequence[int]], dtype: Any = 'float32', kind: Optional[str] = None,
              device: int = 0, framework: Optional[str] = 'torch') -> Any:
        """A new array in shared memory, uninitialized, of `shape` and `dtype` (a name, or a torch,
        NumPy, CuPy or JAX dtype): a torch tensor (framework='torch'), a NumPy array ('numpy',
        memfd), a CuPy array ('cupy'), a JAX array ('jax'), a memoryview ('memoryview', memfd) or
        the gpuipc Buffer itself (None). `kind` by default follows the framework: memfd for 'numpy'
        and 'memoryview' (host memory is all they hold), cuda-vmm for the others. Write into it,
        then publish() it: no copy is made. Slices of it can be published too (their offset and
        strides travel in the metadata)."""
        shape = _shape_arg(shape)
        name = dtypes.name(dtype)
        if kind is None:
            kind = 'memfd' if framework in ('numpy', 'memoryview') else 'cuda-vmm'
        nbytes = arrays.numel(shape) * dtypes.itemsize(name)
        code = _kind_code(kind)
        size = _size_arg(max(nbytes, 1), f'allocate {nbytes} bytes of {kind}')
        h = ctypes.c_void_p()
        with self._locked():
            self._check(self._lib.gpuipc_buffer_alloc(self._c, code, size, int(device), ctypes.byref(h)),
                        f'allocate {nbytes} bytes of {kind}')
            buf = self._register(h.value, name, shape)
        try:
            return arrays.convert(buf, framework)
        except BaseException:
            self.free(buf)
            raise

    def wrap_cuda(self, obj: Any) -> Buffer:
        """Shares an existing CUDA array's own allocation (torch tensor, CuPy array) as cuda-legacy,
        zero-copy: a consumer's PID must differ from the producer's (each as seen in its own PID
        namespace: gpuipcctl run -- CMD sees to it), and obj must stay alive and
        unchanged until the buffer drained. Returns the Buffer (publish it, or pass obj to publish)."""
        info = arrays.describe(obj)
        if info.device[0] != 2:
            raise errors.InvalidArgument('wrap_cuda() needs CUDA memory (a torch CUDA tensor or a CuPy array)')
        lo, hi = arrays.extent(info)
        h = ctypes.c_void_p()
        with self._locked():
            self._check(self._lib.gpuipc_buffer_wrap_cuda(self._c, info.ptr + lo, max(hi - lo, 1), ctypes.byref(h)),
                        'wrap the CUDA array')
            buf = self._register(h.value)
        buf._keepalive = obj
        return buf

    def _owner(self, obj):
        """(own Buffer, dlpack.Info) of an array that lies in this client's gpuipc memory, or (None, info)."""
        if isinstance(obj, View) and self._own.get(obj.memory._handle) is obj.memory:
            return obj.memory, obj._gpuipc_info()
        info = arrays.describe(obj)
        lo, hi = arrays.extent(info)
        i = bisect.bisect_right(self._own_ptrs, (info.ptr + lo, float('inf'))) - 1
        if i >= 0:
            buf = self._own[self._own_ptrs[i][1]]
            if info.ptr + max(hi, lo + 1) <= buf.ptr + max(buf.size, 1) and info.device == buf.__dlpack_device__():
                if isinstance(obj, memoryview) and info.ptr == buf.ptr and obj.nbytes == buf.nbytes:
                    info = buf._gpuipc_info()  # the bytes of an empty() result: its dtype and shape
                return buf, info
        return None, info

    def _buffer_of(self, obj, what):
        buf, info = self._owner(obj)
        if buf is None:
            raise errors.InvalidArgument(f'{what}: the array does not lie in gpuipc memory of this client; allocate it with '
                                         f'empty() (or alloc(), or in a pool()), or let share() copy it into a buffer')
        return buf, info

    def _pool_opened(self, pool):
        """With the lock held, as a pool is made."""
        self._pools.append(pool)

    def _pool_closed(self, pool, segments):
        """With the lock held, as a pool closes: its segments' (base, size) name PoolClosed later."""
        self._closed_ranges.extend(segments)
        del self._closed_ranges[:-256]
        self._pools.remove(pool)

    def _pool_of(self, info):
        """The open pool of this client whose memory holds the array described by info, or None."""
        if not self._pools:
            return None
        ptr = info.ptr + arrays.extent(info)[0]
        last = self._pools[-1]  # the one that answered last: a state dict's arrays lie in one pool
        for pool in (last, *self._pools):
            if not pool.closed and pool._segment(ptr) is not None:
                if pool is not last:
                    self._pools.remove(pool)
                    self._pools.append(pool)
                return pool
        return None

    def _check_closed_pool(self, info, what):
        """Raises PoolClosed if the array lies in the memory of a pool this client closed."""
        ptr = info.ptr + arrays.extent(info)[0]
        if any(base <= ptr < base + size for base, size in self._closed_ranges):
            raise errors.PoolClosed(f'{what}: the array lies in a pool that was closed: its memory is gone')

    def _pooled(self, obj):
        """(pool, info) when obj is no own buffer's but lies in a pool of this client, else (None, info)."""
        buf, info = self._owner(obj)
        return (None, info) if buf is not None else (self._pool_of(info), info)

    def pool(self, device: int = 0, kind: str = 'cuda-vmm', segment_size: int = 0, max_segment_size: int = 0,
             reserve: int = 0, writable: bool = False, broker_held: bool = False) -> 'Pool':
        """A Pool: memory born shareable. Arrays allocated in it are published without a copy and
        without an export (a view of a segment exported once), and a consumer that mapped a segment
        attaches every later array of it without an import.

        ``with pool:`` routes this thread's PyTorch allocations into it (the pool stays after the
        block); pool.empty() allocates an array; cupy.cuda.set_allocator(pool.cupy_malloc) routes
        CuPy's. kind: 'cuda-vmm' (on `device`) or 'memfd'. segment_size: the first segment's bytes
        (default 64 MiB; each later one as large as the pool so far, up to max_segment_size, default
        1 GiB); reserve: bytes to make and export at once, in one segment (e.g. a model's size).
        writable, broker_held: as for publish(), for every array of the pool. A device without CUDA
        virtual memory management or fd export raises NoVmm."""
        return Pool(self, kind, device, segment_size, max_segment_size, reserve, writable, broker_held)

    def _staging_pool(self, kind, device):
        pool = self._staging.get((kind, device))
        if pool is None or pool.closed:
            pool = self._staging[(kind, device)] = self.pool(device=device, kind=kind)
        return pool

    def publish(self, obj: Any, name: str, writable: bool = False, broker_held: bool = False, retire_after: int = 0,
                meta: Optional[Mapping[str, Any]] = None, sync: bool = True, fence: Optional[Fence] = None,
                stream: Any = None) -> int:
        """Publishes the memory of `obj` (a Buffer, an empty() result, or a slice or view of one)
        under `name`, zero-copy. Its dtype, shape, strides and offset travel in the metadata with your
        own `meta` map (msgpack: any mix of ints, floats, None, bools, str, bytes, lists, maps; at most
        4096 bytes encoded).

        writable: consumers may write (fixed at the first publish). broker_held (memfd, cuda-vmm): the
        memory outlives this process until retired and drained. retire_after: retire automatically
        after that many attaches. CUDA kinds: the device is synchronized first so prior writes are
        visible (sync=False skips that); with `fence` (a Fence this client created) the fence is
        signalled in `stream` (default: torch's current stream if torch is loaded, else the default
        stream) instead, and consumers wait for it with Attached.wait_ready().

        A buffer can be published again (under any name) once it drained. Returns the buffer id.
        """
        target = _text_bytes(name, 'name')
        buf, info = self._owner(obj)
        pool = self._pool_of(info) if buf is None else None
        if buf is None and pool is None:
            self._check_closed_pool(info, f"publish '{name}'")
            self._buffer_of(obj, f"publish '{name}'")  # raises, saying where the array must lie
        kind = buf.kind if buf is not None else pool.kind
        ordinal = buf.device_ordinal if buf is not None else pool.device
        extra, no_sync = {}, not sync
        if fence is not None:
            if stream is None and kind != 'memfd':
                stream = torch_current_stream(ordinal)
            extra['fence'] = fence.name
            extra['fence_value'] = fence.signal(stream=stream)
            no_sync = True
        if pool is not None:
            return pool._publish(obj, info, target, meta, extra, writable, broker_held, retire_after, no_sync)
        layout = {'dtype': info.dtype, 'shape': list(info.shape)}
        if info.strides is not None:
            layout['strides'] = list(info.strides)
        if info.ptr != buf.ptr:
            layout['offset'] = info.ptr - buf.ptr
        layout.update(extra)
        raw = _meta.pack(meta, layout)
        return self._publish_raw(buf, target, raw, writable, broker_held, retire_after, no_sync)

    def _publish_raw(self, buf, name_bytes, raw, writable=False, broker_held=False, retire_after=0, no_sync=False):
        with self._locked():
            return self._publish_locked(buf, name_bytes, raw, writable, broker_held, retire_after, no_sync)

    def _publish_locked(self, buf, name_bytes, raw, writable=False, broker_held=False, retire_after=0, no_sync=False):
        """gpuipc_publish with the lock held; the buffer id."""
        holder = ctypes.create_string_buffer(raw, len(raw)) if raw else None
        opts = _lib.PublishOptions(int(bool(writable)), int(bool(broker_held)), int(retire_after),
                                   ctypes.cast(holder, ctypes.c_void_p) if holder else None, len(raw),
                                   int(bool(no_sync)))
        self._check(self._lib.gpuipc_publish(self._c, buf._handle, name_bytes, ctypes.byref(opts)),
                    f"publish '{name_bytes.decode()}'")
        return self._lib.gpuipc_buffer_id(buf._handle)

    def share(self, obj: Any, name: str, kind: Optional[str] = None, device: Optional[int] = None,
              **publish_options: Any) -> Any:
        """Publishes an array under `name` and returns the object to retire / wait_drained / free.

        If obj already lies in this client's gpuipc memory (an empty() result or a slice of one) it is
        published as it is: zero-copy, and obj is returned. Otherwise share() COPIES it into a new
        buffer (memfd for host arrays, cuda-vmm on obj's GPU for device arrays, or the `kind` and
        `device` given) and returns the copy, in obj's framework. kind='cuda-legacy' instead exports
        obj's own CUDA allocation (zero-copy; a consumer's PID must differ from this process's, each as
        seen in its own PID namespace; keep obj alive until drained).
        publish_options: as for publish().
        """
        buf, info = self._owner(obj)
        if buf is not None or (kind is None and self._pool_of(info) is not None):
            self.publish(obj, name, **publish_options)
            return obj
        if kind == 'cuda-legacy':
            buf = self.wrap_cuda(obj)
            self.publish(obj, name, **publish_options)
            return obj
        on_gpu = info.device[0] == 2
        kind = kind or ('cuda-vmm' if on_gpu else 'memfd')
        device = info.device[1] if device is None and on_gpu else (device or 0)
        fw = arrays.framework_of(obj)
        if kind == 'cuda-vmm' and fw in ('torch', 'cupy'):
            # Into memory allocated and exported ahead: a drained copy's range (and its view) serves the next.
            pool = self._staging_pool('cuda-vmm', device)
            pool._reap()
            copy = pool.empty(info.shape, info.dtype, framework=fw)
            if fw == 'cupy':
                copy[...] = obj
            else:
                copy.copy_(obj)
            self.publish(copy, name, **publish_options)
            return copy
        copy = self.empty(info.shape, info.dtype, kind=kind, device=device, framework=None)
        try:
            arrays.copy_into(copy, obj)
            self.publish(copy, name, **publish_options)
        except BaseException:
            self.free(copy)
            raise
        if fw in ('torch', 'cupy') or (fw == 'numpy' and kind == 'memfd'):
            return arrays.convert(copy, fw)
        return copy

    def retire(self, obj: Any) -> None:
        """Stops new attaches of obj's buffer; existing ones stay valid. Drained follows the last release."""
        pool, info = self._pooled(obj)
        if pool is not None:
            pool._retire(info)
            return
        buf, _ = self._buffer_of(obj, 'retire')
        with self._locked():
            self._check(self._lib.gpuipc_retire(self._c, buf._handle), f"retire '{buf.name}'")

    def wait_drained(self, obj: Any, timeout_ms: int = -1) -> None:
        """Waits until obj's buffer (retired, or published with retire_after) has no references left:
        then it may be written and published again, or freed. Raises Timeout."""
        pool, info = self._pooled(obj)
        if pool is not None:
            pool._wait_drained(info, timeout_ms)
            return
        buf, _ = self._buffer_of(obj, 'wait_drained')
        deadline = Deadline(timeout_ms)
        while True:
            ms, last = deadline.next_slice()
            with self._locked():
                r = self._lib.gpuipc_wait_drained(self._c, buf._handle, ms)
                if r == errors.E_TIMEOUT and not last:
                    continue
                self._check(r, f"wait for '{buf.name}' to drain")
                return

    def drained(self, obj: Any) -> bool:
        """True if obj's buffer is drained (or was never published); never waits."""
        pool, info = self._pooled(obj)
        if pool is not None:
            return pool._drained(info)
        buf, _ = self._buffer_of(obj, 'drained')
        with self._locked():
            self._check(self._lib.gpuipc_process(self._c), 'process')
            r = self._lib.gpuipc_wait_drained(self._c, buf._handle, 0)
            if r in (errors.E_TIMEOUT, errors.E_STATE):
                return False
            self._check(r, f"check whether '{buf.name}' drained")
            return True

    def free(self, obj: Any) -> None:
        """Unpublishes obj's buffer (retiring it if needed) and frees the memory once no consumer can
        use it. Views of it must not be used afterwards."""
        pool, info = self._pooled(obj)
        if pool is not None:
            pool._free(info)  # the memory is the array's own: it only stops being published
            return
        buf, _ = self._buffer_of(obj, 'free')
        with self._locked():
            name = buf.name  # before libgpuipc forgets it
            self._check(self._free_held(buf), f"free '{name}'")

    def _free_held(self, buf):
        """gpuipc_buffer_free, with the lock held; the code it returned."""
        r = self._lib.gpuipc_buffer_free(self._c, buf._handle)
        if r not in (errors.E_BUSY, errors.E_INVALID):
            self._forget(buf)  # libgpuipc freed it, whatever the broker answered
        return r

    # ---- consumer ----

    def attach(self, name: str, timeout_ms: int = 5000, device: int = -1) -> Attached:
        """Attaches the buffer published under `name`, waiting up to timeout_ms (negative: forever;
        0: NotFound at once if absent). CUDA kinds map onto `device` (-1: the buffer's own GPU).
        Returns an Attached: a zero-copy array (DLPack, .torch(), .numpy(), ...) with .meta; release
        it when done. Raises NotFound, Timeout, Denied, SamePid, Device, NoCuda, ..."""
        target = _text_bytes(name, 'name')
        deadline = Deadline(timeout_ms)
        h = ctypes.c_void_p()
        while True:
            ms, last = deadline.next_slice()
            with self._locked():
                self._set_device(device)
                r = self._lib.gpuipc_attach(self._c, target, ms, ctypes.byref(h))
                if r == errors.E_TIMEOUT and not last:
                    continue
                self._check(r, f"attach '{name}'")
                return self._adopt(h.value)

    def attach_id(self, buffer_id: int, device: int = -1) -> Attached:
        """Attaches a live buffer by its broker id (as passed along a pipeline)."""
        h = ctypes.c_void_p()
        with self._locked():
            self._set_device(device)
            self._check(self._lib.gpuipc_attach_id(self._c, int(buffer_id), ctypes.byref(h)),
                        f'attach buffer {buffer_id}')
            return self._adopt(h.value)

    def _adopt(self, handle):
        try:
            a = Attached(self, handle)
        except BaseException:
            self._lib.gpuipc_release(self._c, handle)
            raise
        self._attached.add(a)
        return a

    def cache_trim(self) -> None:
        """Unmaps cached mappings nobody uses (the next attach of them imports again)."""
        with self._locked():
            self._lib.gpuipc_cache_trim(self._c)

    # ---- events ----

    def subscribe(self, prefix: str = '') -> Subscription:
        """Events ('published', 'retired', 'revoked', 'drained') about names starting with prefix."""
        sub = self._subscribe(prefix)
        return Subscription(self, sub, prefix)

    def _subscribe(self, prefix, internal=False):
        """A subscription's id; an internal one's events are taken by _wait_for, never by next_event."""
        if not isinstance(prefix, str):
            raise TypeError('the prefix must be a string')
        v = ctypes.c_uint64()
        with self._locked():
            self._check(self._lib.gpuipc_subscribe(self._c, _text_bytes(prefix, 'prefix', True), ctypes.byref(v)),
                        f"subscribe to '{prefix}'")
        if internal:
            self._internal_subs.add(v.value)
        return v.value

    def _unsubscribe(self, sub):
        if not self._c:
            return
        with self._locked():
            self._check(self._lib.gpuipc_unsubscribe(self._c, sub), 'unsubscribe')
        if sub in self._internal_subs:
            # Events the broker sent before the unsubscribe are queued by now (later ones libgpuipc
            # drops): take them all, keep the caller's, so nothing of this one reaches next_event.
            while True:
                ev = self._take_event(0)
                if ev is None:
                    break
                if not self._internal(ev):
                    self._stash.append(ev)
            self._internal_subs.discard(sub)

    def _take_event(self, timeout_ms):
        """The next event from libgpuipc (internal ones included), or None after timeout_ms."""
        ev = _lib.Event()
        with self._locked():
            r = self._lib.gpuipc_next_event(self._c, timeout_ms, ctypes.byref(ev))
            if r == errors.E_TIMEOUT:
                return None
            self._check(r, 'wait for an event')
        return Event._from_c(ev)

    def _internal(self, ev):
        if ev.subscription:
            return ev.subscription in self._internal_subs
        return any(p.owns_buffer(ev.buffer) for p in self._publishers.values())

    def next_event(self, timeout_ms: int = -1) -> Optional[Event]:
        """The next Event, waiting up to timeout_ms (negative: forever); None when none came."""
        if self._stash:
            return self._stash.popleft()
        deadline = Deadline(timeout_ms)
        while True:
            ms, last = deadline.next_slice()
            ev = self._take_event(ms)
            if ev is not None and not self._internal(ev):
                return ev
            if ev is None and last:
                return None

    def events(self, timeout_ms: int = -1) -> Iterator[Event]:
        """Iterates over events as they come; stops once none came for timeout_ms (negative: never)."""
        while True:
            ev = self.next_event(timeout_ms)
            if ev is None:
                return
            yield ev

    async def next_event_async(self) -> Event:
        """The next Event, for asyncio: waits for the socket with the running loop, never blocks it."""
        loop = asyncio.get_running_loop()
        while True:
            ev = self.next_event(0)
            if ev is not None:
                return ev
            ready = loop.create_future()
            fd = self.fileno()
            loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
            try:
                await ready
            finally:
                loop.remove_reader(fd)

    def _wait_for(self, match, timeout_ms):
        """Takes events until match(event); others are kept for next_event. Returns the event or None."""
        deadline = Deadline(timeout_ms)
        while True:
            ms, last = deadline.next_slice()
            ev = self._take_event(ms)
            if ev is not None:
                if match(ev):
                    return ev
                if not self._internal(ev):
                    self._stash.append(ev)
            elif last:
                return None

    # ---- rings ----

    def ring(self, name: str, *, slots: int = 4, slot_size: Optional[int] = None,
             shape: Union[int, Sequence[int], None] = None, dtype: Any = None, mode: str = 'backpressure',
             kind: Optional[str] = None, device: int = 0, max_members: int = 4, lease_ms: int = 2000,
             meta: Optional[Mapping[str, Any]] = None) -> 'Ring':
        """Creates a ring of `slots` frames under `name`, as its producer (gpuipc_ring_create): frames
        of `shape` and `dtype` (a name or any framework's dtype; default float32), or of `slot_size`
        bytes (uint8, unless dtype is given). Members join it with join_ring() and take frames without
        a broker round trip per frame.

        mode: 'backpressure' (every member gets every frame; a slot is reused once every member
        released it; a member holding the producer up for longer than lease_ms is evicted), 'latest'
        (the producer never waits; members take the newest frame; needs slots >= max_members + 2) or
        'stream' (cuda-vmm slots handed over in CUDA stream order; the host never waits for a frame).
        kind: 'memfd' (host memory, the default) or 'cuda-vmm' (on CUDA device `device`; the default
        of 'stream'). meta: your own metadata for members (Ring.meta), at most 4 KiB with gpuipc's.
        The ring's dtype and shape reach members through a small buffer `name`@meta (docs/python.md).
        Returns a Ring (a context manager: leaving it closes the ring).
        """
        return _ring.create(self, name, slots, slot_size, shape, dtype, mode, kind, device, max_members, lease_ms,
                            meta)

    def join_ring(self, name: str, timeout_ms: int = 5000, device: int = -1) -> 'Ring':
        """Joins the ring published under `name` as a member (gpuipc_ring_join), waiting up to
        timeout_ms for it to exist (Timeout; 0: NotFound at once). Its slots are mapped once (CUDA
        kinds onto `device`; -1: the ring's own GPU). The producer seats the member at its next ring
        call; frames from then on are the member's. Returns a Ring: take() frames, iterate over it, or
        await take_async(). Raises Quota when every seat is taken."""
        return _ring.join(self, name, timeout_ms, device)

    def _ring_opened(self, ring):
        """A ring made or joined: closed (or forgotten) with the client."""
        self._rings.add(ring)

    def _ring_closed(self, ring):
        with self._lock, ring._lock:  # the ring's: after its per-frame call in flight
            self._rings.discard(ring)
            handle, ring._handle = ring._handle, None
            if handle and self._c:
                self._lib.gpuipc_ring_close(handle)

    # ---- what the broker says (gpuipcctl ls, stat, peers, stats) ----

    def buffers(self, prefix: str = '') -> List[BufferInfo]:
        """Every buffer whose name starts with prefix that the broker shows this peer (its policy
        decides), in every state, in the order they were registered (gpuipc_list_buffers). Ring parts appear as
        NAME@ctl, NAME@slot.K and NAME@member.I. Not a snapshot: buffers added or removed meanwhile
        may be missed or not."""
        prefix_b = _text_bytes(prefix, 'prefix', True)
        page = (_lib.BufferInfo * 256)()
        return [BufferInfo._from_c(self._lib, b) for b in self._paged(
            'list buffers', lambda cur: self._lib.gpuipc_list_buffers(self._c, prefix_b, cur, page, 256), page)]

    def peers(self) -> List[PeerInfo]:
        """Every connection to the broker that it shows this peer (its own uid's, or all to a policy
        administrator), this one included (gpuipc_list_peers)."""
        page = (_lib.PeerInfo * 64)()
        return [PeerInfo._from_c(p) for p in self._paged(
            'list peers', lambda cur: self._lib.gpuipc_list_peers(self._c, cur, page, 64), page)]

    def _paged(self, what, call, page):
        """Runs call(cursor) until the cursor comes back 0; the records of every page."""
        cursor, out = ctypes.c_uint64(0), []
        while True:
            with self._locked():
                n = self._check(call(ctypes.byref(cursor)), what)
            out += [type(page[i]).from_buffer_copy(page[i]) for i in range(n)]
            if not cursor.value:
                return out

    def stat(self, name: Optional[str] = None, buffer_id: Optional[int] = None) -> BufferInfo:
        """One buffer: the live buffer published under `name`, or the buffer with `buffer_id` (in any
        state), with the peers holding it in `held_by` (gpuipc_stat_buffer). Raises NotFound."""
        if (name is None) == (buffer_id is None):
            raise errors.InvalidArgument('stat() takes a name or a buffer_id')
        target = _text_bytes(name, 'name') if name is not None else None
        info = _lib.BufferInfo()
        cap = 64
        while True:
            holders = (_lib.HolderInfo * cap)()
            with self._locked():
                n = self._check(self._lib.gpuipc_stat_buffer(self._c, target, int(buffer_id or 0), holders, cap,
                                                             ctypes.byref(info)),
                                f"stat '{name}'" if name is not None else f'stat buffer {buffer_id}')
            if n >= min(info.holders, _lib.MAX_PAGE) or cap >= _lib.MAX_PAGE:
                return BufferInfo._from_c(self._lib, info, [HolderInfo._from_c(holders[i]) for i in range(n)])
            cap = _lib.MAX_PAGE

    def stats(self) -> List[Stat]:
        """The broker's counters, gauges and histogram series (gpuipc_stats; docs/protocol.md, `stats`)."""
        cap = 256
        while True:
            items = (_lib.Stat * cap)()
            with self._locked():
                n = self._check(self._lib.gpuipc_stats(self._c, items, cap), 'stats')
            if n <= cap:
                return [Stat._from_c(items[i]) for i in range(n)]
            cap = n

    def retire_id(self, buffer_id: int) -> None:
        """Retires a buffer by its broker id, whoever published it: allowed to its producer, to peers of
        the producer's uid once it is gone, and to a policy administrator (gpuipc_retire_id). For a
        buffer of this client's own, retire() also keeps the Buffer's state."""
        with self._locked():
            self._check(self._lib.gpuipc_retire_id(self._c, int(buffer_id)), f'retire buffer {buffer_id}')

    def connection_info(self) -> ConnectionInfo:
        """This connection's peer id, the broker's epoch, PID namespaces, socket and declared GPUs
        (gpuipc_connection_info)."""
        info = _lib.ConnectionInfo()
        with self._locked():
            self._check(self._lib.gpuipc_connection_info(self._c, ctypes.byref(info)), 'connection info')
        return ConnectionInfo._from_c(info)

    # ---- fences ----

    def create_fence(self, name: str, device: int = 0, ipc_event: bool = False) -> Fence:
        """Creates and publishes a Fence on CUDA device `device`. ipc_event=True makes it of a CUDA IPC
        event (cheaper to wait on, only the creator signals; openers need another PID than the creator's
        and the same /dev/shm)."""
        fn = self._lib.gpuipc_fence_create_ipc_event if ipc_event else self._lib.gpuipc_fence_create
        h = ctypes.c_void_p()
        with self._locked():
            self._check(fn(self._c, _text_bytes(name, 'name'), int(device), ctypes.byref(h)), f"create fence '{name}'")
            fence = self._fences[h.value] = Fence(self, h.value, name, True)
        return fence

    def open_fence(self, name: str, timeout_ms: int = 5000, device: int = -1) -> Fence:
        """Opens the Fence published under `name`, waiting up to timeout_ms."""
        h = ctypes.c_void_p()
        with self._locked():
            self._set_device(device)
            target = _text_bytes(name, 'name')
            self._check(self._lib.gpuipc_fence_open(self._c, target, int(timeout_ms), ctypes.byref(h)),
                        f"open fence '{name}'")
            fence = self._fences[h.value] = Fence(self, h.value, name, False)
        return fence

    def _fence_for(self, name):
        fence = self._waited_fences.get(name)
        if fence is None or not fence._handle:
            fence = self._waited_fences[name] = self.open_fence(name)
        return fence

    def _fence_closed(self, fence, handle):
        with self._lock:
            if self._fences.pop(handle, None) is not None and self._c:
                self._lib.gpuipc_fence_close(handle)

    # ---- rendezvous groups ----

    def group_join(self, group: str, members: int, timeout_ms: int = -1) -> None:
        """Waits until `members` connections joined `group` (all return together) or the earliest
        member's deadline passes (all raise Timeout)."""
        with self._locked():
            self._check(self._lib.gpuipc_group_join(self._c, _text_bytes(group, 'group'), int(members),
                                                    int(timeout_ms)), f"join group '{group}'")

    # ---- state dicts ----

    def publish_state_dict(self, state_dict: Mapping[str, Any], name: str, kind: Optional[str] = None,
                           device: Optional[int] = None,
                           meta: Optional[Mapping[str, Any]] = None, buffers: int = 2, timeout_ms: int = 60000,
                           broker_held: bool = False, copy: bool = True, fence: Optional[Fence] = None,
                           stream: Any = None) -> 'StateDictVersion':
        """Publishes a whole dict of arrays (torch, NumPy, CuPy, JAX; any dtypes, host or GPU) under
        `name`, with a manifest (names, dtypes, shapes, offsets).

        kind: as share() chooses, by default: 'cuda-vmm' on the arrays' GPU when any array is on a
        GPU, else 'memfd' (host arrays: NumPy, CPU tensors). device: the CUDA device for cuda kinds.

        copy=True (a snapshot): the arrays are copied into ONE buffer (`kind` on `device`), which
        holds the manifest too. Calling it again under the same name publishes a new version:
        consumers holding the old one are not disturbed, new attaches get the new one. At most
        `buffers` buffers are used per name (double buffering with 2): a version's buffer is written
        again once every consumer released it, waiting up to timeout_ms for that (Timeout otherwise).
        The buffers are made (and exported) when first needed, or ahead by reserve_state_dict().

        copy=False (live): the arrays must lie in pools of this client (allocate the model in
        ``with c.pool(): ...``); nothing is copied, each pool segment they use is published as one
        view, and consumers see the producer's writes as they happen. Publishing again is a new
        version of the manifest. Raises NotContiguous, SpansSegments, UnsupportedDtype, or
        InvalidArgument for an array outside the pools. Returns a StateDictVersion.

        fence (a snapshot on a GPU: a Fence this client created): stream-ordered instead of
        host-synchronized, as torch's own CUDA IPC is. The copies are queued in `stream` (default:
        torch's current stream), the fence is signalled after them there, and the version goes out
        at once, without waiting for the GPU; attach_state_dict() makes its consumer's stream wait
        for the fence, so the arrays are complete for any work queued after it. Without a fence the
        device is synchronized before the version goes out.
        """
        pub = self._publisher(name, live=not copy)
        if not copy:
            if fence is not None:
                raise errors.InvalidArgument(f"publish state dict '{name}': a live state dict copies nothing, so there "
                                             f'is nothing for a fence to order (its consumers see your writes as they '
                                             f'happen); fence= is for snapshots')
            return pub.publish(state_dict, meta=meta, broker_held=broker_held, timeout_ms=timeout_ms)
        if kind is None:
            kind, device = _state_dict_kind(state_dict, device)
        device = 0 if device is None else device
        if fence is not None and kind == 'memfd':
            raise errors.InvalidArgument(f"publish state dict '{name}': a memfd state dict is copied by the host and "
                                         f'complete when the call returns; fence= is for GPU kinds')
        return pub.publish(state_dict, kind=kind, device=device, meta=meta, buffers=buffers, timeout_ms=timeout_ms,
                           broker_held=broker_held, fence=fence, stream=stream)

    def _publisher(self, name, live):
        """The publisher of name's versions in that mode (one of the other mode is closed first)."""
        _text_bytes(name, 'state dict name')
        pub = self._publishers.get(name)
        if pub is not None and pub.live_mode != live:
            self._publishers.pop(name).close()
            pub = None
        if pub is None:
            pub = self._publishers[name] = (_sd.LivePublisher if live else _sd.Publisher)(self, name)
        return pub

    def reserve_state_dict(self, name: str, state_dict: Mapping[str, Any], kind: str = 'cuda-vmm', device: int = 0,
                           buffers: int = 2) -> None:
        """Makes the buffers of `name`'s snapshot versions now, for a state dict of this layout
        (allocated and exported: the first publish_state_dict then costs a device copy and a round
        trip, not an allocation and an export). Buffers that are too small are made again later."""
        pub = self._publisher(name, live=False)
        _, manifest, manifest_offset = pub._plan(state_dict)  # kept: a first version of these tensors reuses it
        pub.reserve(manifest_offset + len(manifest), kind, device, buffers, manifest, manifest_offset)

    def unpublish_state_dict(self, name: str) -> None:
        """Retires every version published under `name` and frees their buffers (memory held by
        consumers stays valid for them until they release it)."""
        pub = self._publishers.pop(name, None)
        if pub is not None:
            pub.close()

    def attach_state_dict(self, name: str, framework: Optional[str] = 'torch', timeout_ms: int = 5000, device: int = -1,
                          after: Optional['StateDict'] = None, stream: Any = None) -> 'StateDict':
        """Attaches the state dict published under `name` and returns it as a StateDict (a dict) of
        zero-copy arrays of `framework` ('torch', 'numpy', 'cupy', 'jax', or None for gpuipc views):
        ``model.load_state_dict(sd, assign=True)`` then uses the shared memory directly.

        after: a StateDict you hold: wait (up to timeout_ms) for a newer publication than that one.
        A version published with a fence is complete in `stream` (default: torch's current stream;
        the wait is queued there, the host does not wait): queue the work that reads it there, or
        call sd.wait_ready(other_stream). Release the StateDict (sd.release(), or a ``with`` block)
        once nothing uses it any more, and only after the GPU work that reads it finished.
        """
        return _sd.attach(self, name, framework, timeout_ms, device, after, stream)


def _state_dict_kind(state_dict, device):
    """share()'s choice for a whole state dict: (kind, device) of cuda-vmm on the GPU of the first
    array on a GPU, else memfd."""
    for value in state_dict.values():
        try:
            info = arrays.describe(value)
        except TypeError:
            continue  # plan() names the entry that is no array
        if info.device[0] == 2:
            return 'cuda-vmm', info.device[1] if device is None else device
    return 'memfd', 0 if device is None else device


# One connection per process and socket for what pickling brings in (Attached.__reduce__), made
# at the first unpickled buffer and abandoned at exit as every open Client is. Keyed by the process
# too: a child forked with the parent's entry must not share its socket.
_reattach_clients = {}
_reattach_lock = threading.Lock()


def _reattach_client(socket):
    key = (os.getpid(), socket)
    with _reattach_lock:
        c = _reattach_clients.get(key)
        if c is None or c.closed:
            c = _reattach_clients[key] = Client(socket, label='gpuipc-unpickled')
    return c


def _reattach(socket, buffer_id, device=-1):
    """Unpickles an Attached: attaches the same buffer by id, through this process's connection to
    the broker at `socket`. The buffer must still be live (NotFound or StateError otherwise)."""
    return _reattach_client(socket).attach_id(buffer_id, device)


buffer_mod.set_reattach(_reattach)

