"""Pools: memory born shareable (`Client.pool()`, `gpuipc.torch.MemPool`).

A pool hands out memory from a few large segments (cuda-vmm on one GPU, or memfd), each exported
once when it is made (libgpuipc's gpuipc_pool_*). Any array that lies in a pool is published as a
*view* of its segment: no copy, no export, and a consumer that mapped the segment once attaches every
later array of it without an import.

Arrays get into a pool three ways: PyTorch's allocator routed into it (``with pool:``, through
torch.cuda.MemPool and a CUDAPluggableAllocator of libgpuipc's gpuipc_torch_alloc/free), CuPy's
(``cupy.cuda.set_allocator(pool.cupy_malloc)``), or ``pool.empty()``.

Lifetime: a published array is kept alive (its tensor referenced) until its publication drained, so
neither the framework nor the pool hands its memory out again while a consumer may read it; the view
itself stays, idle, to be published again without a round trip more when the same range is published
again. ``pool.empty_cache()`` frees idle views, empties torch's cache and gives empty segments back.
"""
import bisect
import collections
import ctypes
import errno
import sys
import threading
from typing import Any, NamedTuple, Optional, Sequence, Union

from . import _lib, arrays, dlpack, dtypes, errors, meta as _meta
from ._args import shape_arg, size_arg
from ._core import Deadline
from .buffer import KINDS, Buffer, View

_IDLE_VIEWS_MAX = 256


class PoolStats(NamedTuple):
    """What a pool holds (gpuipc_pool_stats): segments and their bytes, bytes handed out, bytes freed
    while a view still covered them, views not freed, and exports made since it was created (one per
    segment it ever made)."""
    segments: int
    reserved: int
    allocated: int
    deferred: int
    views: int
    exports: int


class _Block:
    """An allocation made through Python (empty(), share()'s copies, CuPy's): back to the pool when
    this object goes, which the arrays made of it delay (their DLPack capsules hold it)."""

    __slots__ = ('pool', 'ptr', 'nbytes')

    def __init__(self, pool, ptr, nbytes):
        self.pool, self.ptr, self.nbytes = pool, ptr, nbytes

    def __del__(self):
        self.pool._free_block(self.ptr)


class _PoolMemory:
    """The memory of one _Block as gpuipc's View expects it."""

    # The package's internal interface to it: what other modules use, and why (tests/python/layers.py).
    _INTERNAL = {
        '_handle': "None: no buffer of a client (the client looks up every View's memory by it)",
        '_usable_ptr': "a View's pointer, checked usable (buffer.View, as of every memory)",
        '_copy': "a View's read and write of host bytes (buffer.View, as of every memory)",
    }

    def __init__(self, block):
        self.block = block
        self.ptr, self.size = block.ptr, block.nbytes
        self.kind = block.pool.kind
        self.device_ordinal = block.pool.device if self.kind != 'memfd' else -1
        self.readonly = False
        self.id = 0
        self._client = self._handle = None  # no buffer of a client: a View of it is found by its pointer

    def _usable_ptr(self):
        if self.block.pool.closed:
            raise errors.PoolClosed('the pool was closed: its memory may not be used any more')
        return self.ptr

    def __dlpack_device__(self):
        return (dlpack.KDL_CPU, 0) if self.kind == 'memfd' else (dlpack.KDL_CUDA, self.device_ordinal)

    def _copy(self, offset, host, length, to_host):
        if self.kind != 'memfd':
            raise TypeError('copy GPU pool memory with your framework')
        src, dst = (self.ptr + offset, host) if to_host else (host, self.ptr + offset)
        ctypes.memmove(dst, src, length)


class _Publication:
    __slots__ = ('view', 'keep', 'key', 'free_when_drained')

    def __init__(self, view, keep, key):
        self.view, self.keep, self.key, self.free_when_drained = view, keep, key, False


_torch_allocator = None


def _torch_pluggable():
    """One CUDAPluggableAllocator over libgpuipc's hooks for the whole process."""
    global _torch_allocator
    if _torch_allocator is None:
        import torch
        _torch_allocator = torch.cuda.memory.CUDAPluggableAllocator(_lib.path(), 'gpuipc_torch_alloc',
                                                                   'gpuipc_torch_free')
    return _torch_allocator


class Pool:
    """Memory born shareable, from `Client.pool()`: arrays allocated in it are published without a
    copy and without an export (see the module's docstring).

    ``with pool:`` routes PyTorch's allocations of this thread into the pool (the pool outlives the
    block: close() it, or the Client, when nothing uses its memory any more). empty() allocates an
    array directly; cupy_malloc is CuPy's allocator hook.
    """

    # The package's internal interface to it: what other modules use, and why (tests/python/layers.py).
    _INTERNAL = {
        '_handle': 'the client forgets it when it closes or loses the connection (libgpuipc frees the pool)',
        '_forget': 'the client closes: libgpuipc frees (or forgets) the pool',
        '_mempool': "torch's MemPool, if made: the client keeps CUDA's caching allocator at close while one is",
        '_alloc': "a block for a state dict's slot (state_dict)",
        '_segment': "the segment an array lies in: the client finds a pooled array's pool by it",
        '_range': "the segment and offset of an array, checked: a live state dict's parts",
        '_publish': 'publishes an array that lies in the pool (Client.publish, live state dicts)',
        '_reap': 'frees views whose arrays are gone, before the client counts or frees',
        '_retire': 'retires a pooled publication (Client.retire)',
        '_drained': 'whether a pooled publication is drained (Client.drained)',
        '_wait_drained': 'waits for a pooled publication to drain (Client.wait_drained)',
        '_free': 'frees a pooled publication (Client.free, live state dicts)',
    }

    def __init__(self, client, kind='cuda-vmm', device=0, segment_size=0, max_segment_size=0, reserve=0,
                 writable=False, broker_held=False):
        if kind not in ('cuda-vmm', 'memfd'):
            raise errors.InvalidArgument(f"a pool is of 'cuda-vmm' or 'memfd' memory, not {kind!r}")
        self._client, self._lib = client, _lib.load()
        self.kind, self.device = kind, int(device) if kind != 'memfd' else -1
        self._lock = threading.Lock()  # the handle against frees from other threads (finalizers)
        self._live = collections.defaultdict(list)  # (base, size) -> [_Publication], published, not drained
        self._idle = collections.OrderedDict()      # (base, size) -> view Buffer, drained, reusable
        self._mempool, self._entered = None, []
        self._segs = []  # sorted (base, size) of segments looked up: they stay until trim or close
        opts = _lib.PoolOptions(KINDS[kind], max(self.device, 0), size_arg(segment_size, 'segment_size', 0),
                                size_arg(max_segment_size, 'max_segment_size', 0), size_arg(reserve, 'reserve', 0),
                                int(bool(writable)), int(bool(broker_held)))
        h = ctypes.c_void_p()
        with client._locked():
            r = self._lib.gpuipc_pool_new(client._c, ctypes.byref(opts), ctypes.byref(h))
            if r == errors.E_KIND:
                detail = (self._lib.gpuipc_errmsg(client._c) or b'').decode(errors='replace')
                raise errors.from_code(r, f'make a {kind} pool on device {self.device}', detail, client._strerror(r),
                                       cls=errors.NoVmm)
            client._check(r, f'make a {kind} pool on device {self.device}')
            self._handle = h.value
            client._pool_opened(self)

    def __repr__(self):
        state = 'closed' if self.closed else f'{self.stats().reserved} bytes'
        return f'<gpuipc.Pool {self.kind} device {self.device}, {state}>'

    # ---- lifetime ----

    @property
    def closed(self) -> bool:
        """True after close() (or the client's)."""
        return not self._handle or not self._client._c

    def _check_open(self, what='use the pool'):
        if self.closed:
            raise errors.PoolClosed(f'{what}: the pool was closed (or its client): its memory is gone')

    def close(self, force: bool = False) -> None:
        """Frees the pool's views (live ones are retired: consumers keep valid memory until they
        release it) and its memory. Refused (Busy) while arrays still use its memory, after emptying
        torch's cache: delete them first, or pass force=True if nothing will touch them again."""
        if self.closed:
            return
        self._reap()
        self._free_views(retire=True)
        self._empty_torch_cache()
        st = self.stats()
        if st.allocated and not force:
            raise errors.Busy(f'close the pool: {st.allocated} bytes of it are still allocated (tensors or arrays '
                              f'that use it): delete them first, or close(force=True)')
        with self._client._locked(), self._lock:
            self._client._pool_closed(self, self._all_segments())
            handle, self._handle = self._handle, None
            self._segs.clear()
            self._client._check(self._lib.gpuipc_pool_close(handle), 'close the pool')

    def _all_segments(self):
        n = self._lib.gpuipc_pool_segments(self._handle, None, None, 0)
        bases, sizes = (ctypes.c_void_p * max(n, 1))(), (ctypes.c_size_t * max(n, 1))()
        n = min(n, self._lib.gpuipc_pool_segments(self._handle, bases, sizes, n))
        return [(bases[i] or 0, sizes[i]) for i in range(max(n, 0))]

    def _forget(self):
        """The client closed (gpuipc_close freed the pool)."""
        with self._lock:
            self._handle = None
        self._live.clear()
        self._idle.clear()

    # ---- allocation ----

    def _alloc(self, nbytes):
        self._check_open('allocate in the pool')
        p = ctypes.c_void_p()
        r = self._lib.gpuipc_pool_alloc(self._handle, size_arg(max(nbytes, 1), f'allocate {nbytes} bytes in the pool'),
                                        ctypes.byref(p))
        if r < 0:
            # The pool's allocations have no gpuipc_errmsg (any thread may make them): what a
            # refusal of a new segment most likely means is said here.
            detail = '' if r != -errno.ENOMEM or self.kind != 'memfd' else (
                f'a segment of {nbytes} bytes is more than the memory available (memfd pools are held to '
                f'the limit of every memfd buffer: MemAvailable, or what memory.max leaves)')
            raise errors.from_code(r, f'allocate {nbytes} bytes in the pool', detail, self._client._strerror(r))
        return _Block(self, p.value, int(nbytes))

    def _free_block(self, ptr):
        with self._lock:
            if self._handle:
                self._lib.gpuipc_pool_free(self._handle, ptr)

    def _array(self, block, dtype, shape, framework):
        return arrays.convert(View(_PoolMemory(block), 0, dtype, shape), framework)

    def empty(self, shape: Union[int, Sequence[int]], dtype: Any = 'float32', framework: Optional[str] = 'torch') -> Any:
        """A new array in the pool, uninitialized: a torch tensor (framework='torch'), CuPy array
        ('cupy'), JAX array ('jax'), NumPy array ('numpy', memfd) or gpuipc View (None). Its memory
        goes back to the pool once the array (and every array made from it) is gone."""
        shape = shape_arg(shape)
        name = _dtype_name(dtype)
        return self._array(self._alloc(arrays.numel(shape) * dtypes.itemsize(name)), name, shape, framework)

    def cupy_malloc(self, size: int) -> Any:
        """CuPy's allocator hook: ``cupy.cuda.set_allocator(pool.cupy_malloc)`` puts CuPy's arrays
        into the pool (cuda-vmm pools; use it on the pool's device)."""
        import cupy
        block = self._alloc(size)
        mem = cupy.cuda.UnownedMemory(block.ptr, max(int(size), 1), block, self.device)
        return cupy.cuda.MemoryPointer(mem, 0)

    # ---- PyTorch ----

    @property
    def torch_pool(self) -> Any:
        """The torch.cuda.MemPool whose allocations come from this pool (cuda-vmm), e.g. for
        torch.cuda.graph(g, pool=pool.torch_pool.id)."""
        self._check_open()
        if self.kind != 'cuda-vmm':
            raise errors.KindError('only a cuda-vmm pool serves PyTorch')
        if self._mempool is None:
            import torch
            self._mempool = torch.cuda.MemPool(_torch_pluggable().allocator())
        return self._mempool

    def __enter__(self):
        """Routes this thread's PyTorch allocations (on the pool's device) into the pool."""
        self._check_open()
        import torch
        prev = self._lib.gpuipc_pool_use(self._handle)
        ctx = torch.cuda.use_mem_pool(self.torch_pool, device=self.device)
        ctx.__enter__()
        self._entered.append((prev, ctx))
        return self

    def __exit__(self, *exc):
        prev, ctx = self._entered.pop()
        try:
            ctx.__exit__(*exc)
        finally:
            self._lib.gpuipc_pool_use(prev)

    def _empty_torch_cache(self):
        torch = sys.modules.get('torch')
        if torch is not None and self.kind == 'cuda-vmm' and self._mempool is not None:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()

    def empty_cache(self) -> None:
        """Frees idle views, lets torch give back the blocks it caches, and frees the segments that
        hold nothing (consumers keep what they still map)."""
        self._reap()  # publications that drained let go of their arrays first
        self._free_views(retire=False)
        self._empty_torch_cache()
        self.trim()

    def trim(self) -> None:
        """Frees the segments that hold nothing (gpuipc_pool_trim)."""
        self._check_open()
        self._segs.clear()
        with self._client._locked():
            self._client._check(self._lib.gpuipc_pool_trim(self._handle), 'trim the pool')

    def stats(self) -> PoolStats:
        """What the pool holds now."""
        self._check_open()
        st = _lib.PoolStats()
        self._lib.gpuipc_pool_stats(self._handle, ctypes.byref(st))
        return PoolStats(st.segments, st.reserved, st.allocated, st.deferred, st.views, st.exports)

    # ---- publishing (Client.publish/retire/wait_drained/free call these) ----

    def _segment(self, ptr):
        """(base, size) of the segment holding ptr, or None (segments seen are remembered: a state
        dict's 200 arrays are looked up at every publish)."""
        i = bisect.bisect_right(self._segs, (ptr, float('inf'))) - 1
        if i >= 0 and ptr < self._segs[i][0] + self._segs[i][1]:
            return self._segs[i]
        base, size = ctypes.c_void_p(), ctypes.c_size_t()
        if self.closed or self._lib.gpuipc_pool_segment(self._handle, ptr, ctypes.byref(base), ctypes.byref(size)) < 0:
            return None
        seg = (base.value, size.value)
        bisect.insort(self._segs, seg)
        return seg

    def holds(self, obj: Any) -> bool:
        """True if the array lies (at least its first byte) in this pool's memory."""
        if self.closed:
            return False
        info = arrays.describe(obj)
        return self._segment(info.ptr + arrays.extent(info)[0]) is not None

    def _range(self, info, what):
        """(base, size, (segment base, segment size)): the bytes [base, base + size) an array
        described by info occupies, checked to lie in one segment of this pool."""
        lo, hi = arrays.extent(info)
        if hi <= lo:
            raise errors.InvalidArgument(f'{what}: an empty array has no memory to share')
        base, size = info.ptr + lo, hi - lo
        first = self._segment(base)
        if first is None:
            raise errors.InvalidArgument(f'{what}: the array does not lie in this pool')
        if base + size > first[0] + first[1]:  # its last byte lies in another segment, or in none
            raise errors.SpansSegments(f'{what}: the array ({size} bytes at {base:#x}) spans two segments of the '
                                       f'pool; a publication lies in one (allocate it in one piece, or share it with a '
                                       f'copy)')
        return base, size, first

    def _view_of(self, base, size):
        """A view Buffer for [base, base + size): an idle one of the same range, or a new one. With
        the client's lock held."""
        view = self._idle.pop((base, size), None)
        if view is not None:
            return view
        h = ctypes.c_void_p()
        self._client._check(self._lib.gpuipc_pool_view(self._handle, base, size, ctypes.byref(h)),
                            'make a view of pool memory')
        return Buffer(self._client, h.value)

    def _publish(self, obj, info, name_bytes, meta, extra, writable=False, broker_held=False, retire_after=0,
                 no_sync=False):
        """Publishes obj's memory as a view (no copy, no export), with its layout and `extra` (a
        fence) in the metadata beside the caller's `meta`; obj is kept until it drained. Returns the
        view's buffer id."""
        what = f"publish '{name_bytes.decode()}'"
        self._check_open(what)
        self._reap()
        base, size, _ = self._range(info, what)
        layout = {'dtype': info.dtype, 'shape': list(info.shape)}
        if info.strides is not None:
            layout['strides'] = list(info.strides)
        if info.ptr != base:
            layout['offset'] = info.ptr - base
        layout.update(extra or {})
        raw = _meta.pack(meta, layout)
        with self._client._locked():
            view = self._view_of(base, size)
            try:
                self._client._publish_locked(view, name_bytes, raw, writable, broker_held, retire_after, no_sync)
            except errors.InvalidArgument:
                # an idle view whose range was freed and handed out since: a new view of the same bytes
                self._drop_view(view)
                view = self._view_of(base, size)
                try:
                    self._client._publish_locked(view, name_bytes, raw, writable, broker_held, retire_after, no_sync)
                except BaseException:
                    self._drop_view(view)
                    raise
            except BaseException:
                self._drop_view(view)
                raise
            self._live[(base, size)].append(_Publication(view, obj, (base, size)))
            return self._lib.gpuipc_buffer_id(view._handle)

    def _drop_view(self, view):
        """Frees a view handle (with the client's lock held)."""
        if view._handle:
            self._lib.gpuipc_buffer_free(self._client._c, view._handle)
            view._handle = None

    def _pubs_of(self, info):
        lo, hi = arrays.extent(info)
        return self._live.get((info.ptr + lo, hi - lo), [])

    def _state(self, view):
        """0 drained (or never published), or the code gpuipc_wait_drained(view, 0) gives."""
        return self._lib.gpuipc_wait_drained(self._client._c, view._handle, 0)

    def _reap(self):
        """Publications that drained let go of their arrays; their views go idle (or are freed)."""
        if not self._live:
            return
        with self._client._locked():
            self._lib.gpuipc_process(self._client._c)
            for key in list(self._live):
                pubs = self._live[key]
                for pub in list(pubs):
                    if self._state(pub.view) != 0:
                        continue
                    pubs.remove(pub)
                    pub.keep = None
                    old = self._idle.pop(key, None)
                    if old is not None:
                        self._drop_view(old)
                    if pub.free_when_drained or len(self._idle) >= _IDLE_VIEWS_MAX:
                        self._drop_view(pub.view)
                    else:
                        self._idle[key] = pub.view
                if not pubs:
                    del self._live[key]

    def _free_views(self, retire):
        """Frees idle views, and with retire the live ones too (retired first: the broker forgets
        each once drained)."""
        if self.closed:
            return
        with self._client._locked():
            for view in self._idle.values():
                self._drop_view(view)
            self._idle.clear()
            if retire:
                for pubs in self._live.values():
                    for pub in pubs:
                        self._lib.gpuipc_retire(self._client._c, pub.view._handle)
                        self._drop_view(pub.view)
                self._live.clear()

    def _retire(self, info):
        with self._client._locked():
            for pub in self._pubs_of(info):
                self._client._check(self._lib.gpuipc_retire(self._client._c, pub.view._handle), 'retire')

    def _drained(self, info):
        self._reap()
        return not self._pubs_of(info)

    def _wait_drained(self, info, timeout_ms):
        deadline = Deadline(timeout_ms)
        for pub in list(self._pubs_of(info)):
            while True:
                ms, last = deadline.next_slice()
                with self._client._locked():
                    r = self._lib.gpuipc_wait_drained(self._client._c, pub.view._handle, ms)
                    if r == errors.E_TIMEOUT and not last:
                        continue
                    self._client._check(r, 'wait for a pooled array to drain')
                    break
        self._reap()

    def _free(self, info):
        """Unpublishes: retires every publication of the array's range; each lets go of the array
        once drained."""
        self._retire(info)
        for pub in self._pubs_of(info):
            pub.free_when_drained = True
        self._reap()


def _dtype_name(dtype):
    try:
        return dtypes.name(dtype)
    except ValueError as e:
        raise errors.UnsupportedDtype(str(e)) from None
