"""Buffers and typed views of them: what `Client.empty()`, `Client.alloc()` and `Client.attach()`
return. Every one implements ``__dlpack__``/``__dlpack_device__`` (kDLCPU for memfd, kDLCUDA for the
CUDA kinds), so any framework's ``from_dlpack`` takes it zero-copy, and has ``.torch()``,
``.numpy()``, ``.cupy()``, ``.jax()`` shortcuts.

The views (and every tensor made from them) keep the buffer object alive, never the memory itself:
after `Attached.release()`, `Buffer.free()` or `Client.close()` the memory may be overwritten or
unmapped, so drop the views first.
"""
import ctypes
import warnings
from typing import Any, Dict, Optional, Sequence, Tuple

from . import _lib, arrays, dlpack, dtypes, meta as _meta
from .errors import InvalidArgument, MetadataError, StateError

KINDS = {'memfd': 1, 'cuda-vmm': 2, 'cuda-legacy': 3}
KIND_NAMES = {v: k for k, v in KINDS.items()}


class View:
    """A typed window on a gpuipc buffer: `offset` bytes in, `dtype` elements of `shape` (C order, or
    `strides` in elements). Exports through DLPack like the buffer itself."""

    # The package's internal interface to it: what other modules use, and why (tests/python/layers.py).
    _INTERNAL = {
        '_gpuipc_info': "the array's dlpack.Info without a capsule: how arrays and the client see a View",
    }

    def __init__(self, memory: '_Memory', offset: int, dtype: Any, shape: Sequence[int],
                 strides: Optional[Sequence[int]] = None) -> None:
        self.memory = memory
        self.dtype = dtypes.name(dtype)
        self.shape, self.strides, self.offset = arrays.check_layout(self.dtype, shape, strides, offset, memory.size)

    def __repr__(self):
        return (f'<gpuipc.View {self.dtype}{list(self.shape)} at +{self.offset} of {self.memory.kind} buffer '
                f'{self.memory.id}>')

    # ---- layout ----

    @property
    def kind(self) -> str:
        """'memfd', 'cuda-vmm' or 'cuda-legacy'."""
        return self.memory.kind

    @property
    def device_ordinal(self) -> int:
        """The CUDA device the memory is mapped on here, -1 for memfd."""
        return self.memory.device_ordinal

    @property
    def nbytes(self) -> int:
        """Bytes of the elements (for a strided view: of as many contiguous elements)."""
        return arrays.numel(self.shape) * dtypes.itemsize(self.dtype)

    @property
    def readonly(self) -> bool:
        """True when this process may not write the memory (an attached buffer published read-only)."""
        return self.memory.readonly

    def view(self, dtype: Any = None, shape: Optional[Sequence[int]] = None, offset: int = 0,
             strides: Optional[Sequence[int]] = None) -> 'View':
        """Another View of the same buffer: `offset` bytes after this view's start, C-contiguous
        unless `strides` (in elements) is given. Defaults: this view's dtype, and as many elements
        as fit after the offset."""
        dtype = dtypes.name(dtype) if dtype is not None else self.dtype
        start = self.offset + int(offset)
        if shape is None:
            shape = ((self.memory.size - start) // dtypes.itemsize(dtype),)
        return View(self.memory, start, dtype, shape, strides)

    def _check_layout(self):
        """Raises the MetadataError that made the layout unusable (an Attached's metadata); a View's
        own layout was checked when it was made."""

    def _info_at(self, base):
        return dlpack.Info(base + self.offset, self.__dlpack_device__(), self.dtype, self.shape, self.strides,
                           self.readonly)

    def _gpuipc_info(self):
        return self._info_at(self.memory.ptr)

    # ---- DLPack ----

    def __dlpack_device__(self) -> Tuple[int, int]:
        """(kDLCPU, 0) for memfd, (kDLCUDA, ordinal) for the CUDA kinds."""
        return self.memory.__dlpack_device__()

    def __dlpack__(self, *, stream: Any = None, max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None, copy: Optional[bool] = None) -> Any:
        """A DLPack capsule of the elements, zero-copy. `stream` is accepted and ignored: published
        data is complete before the publish returns (or is ordered by a fence, see Attached.wait_ready);
        `copy=True` is refused (this is shared memory); `dl_device` must be the buffer's own."""
        self._check_layout()
        ptr = self.memory._usable_ptr()
        if copy:
            raise BufferError('gpuipc views are shared memory and are never copied; copy with your framework')
        device = self.__dlpack_device__()
        if dl_device is not None and tuple(dl_device) != device:
            raise BufferError(f'this buffer lives on DLPack device {device}, not {tuple(dl_device)}')
        return dlpack.capsule(self, ptr + self.offset, device, self.dtype, self.shape, self.strides,
                              readonly=self.readonly, max_version=max_version)

    # ---- frameworks ----

    def torch(self) -> Any:
        """A torch tensor over the elements (no copy): on the buffer's GPU, or the CPU for memfd.
        torch has no read-only tensors: do not write into a buffer attached read-only."""
        import torch
        # A legacy capsule: torch has no read-only tensors, so the read-only flag of a versioned one
        # would tell it nothing (and must not make it refuse the memory).
        return torch.from_dlpack(self.__dlpack__())

    def cupy(self) -> Any:
        """A CuPy array over the elements (no copy); CUDA kinds only."""
        import cupy
        with cupy.cuda.Device(max(self.device_ordinal, 0)):
            return cupy.from_dlpack(self)

    def jax(self) -> Any:
        """A JAX array over the elements, through DLPack (JAX may copy if it cannot use the memory
        as it is, e.g. when it is not aligned to its liking)."""
        import jax.dlpack
        try:
            return jax.dlpack.from_dlpack(self)
        except Exception:
            # JAX releases that take only capsules (or that would not take a read-only one)
            return jax.dlpack.from_dlpack(self.__dlpack__())

    def numpy(self) -> Any:
        """A NumPy array over the elements (no copy; read-only when the buffer is); memfd only.
        bfloat16 and float8 need ml_dtypes."""
        import numpy
        if self.kind != 'memfd':
            raise TypeError(f'a {self.kind} buffer is GPU memory: use .torch(), .cupy() or .jax()')
        self._check_layout()
        np_dtype = dtypes.numpy_dtype(self.dtype)
        if self.readonly:
            # Through DLPack, exported as unsigned ints of the same size and viewed as the dtype: that
            # works for every dtype (bool, complex, bfloat16) and every NumPy that has from_dlpack.
            size = dtypes.itemsize(self.dtype)
            carrier = View(self.memory, self.offset, f'uint{8 * size}', self.shape, self.strides) if size <= 8 else self
            arr = numpy.from_dlpack(carrier).view(np_dtype)
            arr.flags.writeable = False
            return arr
        # Writable: NumPy before 2.1 makes every DLPack import read-only, so go through the buffer
        # protocol over the same memory.
        lo, hi = arrays.extent(self._info_at(0))
        raw = (ctypes.c_ubyte * max(hi - lo, 1)).from_address(self.memory._usable_ptr() + self.offset + lo)
        raw._gpuipc_owner = self
        strides = None if self.strides is None else tuple(x * np_dtype.itemsize for x in self.strides)
        return numpy.ndarray(self.shape, np_dtype, buffer=raw, offset=-lo, strides=strides)

    def memoryview(self) -> memoryview:
        """The bytes of the elements as a memoryview (no copy; read-only when the buffer is); memfd only."""
        if self.kind != 'memfd':
            raise TypeError(f'a {self.kind} buffer is GPU memory; read it with .read() or a framework')
        self._check_layout()
        if self.strides is not None:
            raise InvalidArgument('memoryview() needs a contiguous view')
        raw = (ctypes.c_ubyte * self.nbytes).from_address(self.memory._usable_ptr() + self.offset)
        raw._gpuipc_owner = self  # the memoryview keeps raw alive, raw keeps the buffer object alive
        mv = memoryview(raw).cast('B')
        return mv.toreadonly() if self.readonly else mv

    # ---- copies ----

    def read(self, offset: int = 0, length: Optional[int] = None) -> bytes:
        """Copies bytes out (any kind; a CUDA copy for the CUDA kinds)."""
        length = self.nbytes - offset if length is None else length
        out = ctypes.create_string_buffer(max(length, 1))
        self.memory._copy(self.offset + offset, out, length, to_host=True)
        return out.raw[:length]

    def write(self, data: Any, offset: int = 0) -> None:
        """Copies bytes (anything with the buffer protocol) in, at `offset` bytes into the view."""
        mv = memoryview(data).cast('B')
        if offset + len(mv) > self.nbytes:
            raise InvalidArgument(f'{len(mv)} bytes at offset {offset} do not fit in the view\'s {self.nbytes}')
        src = (ctypes.c_char * len(mv)).from_buffer_copy(mv) if mv.readonly else (ctypes.c_char * len(mv)).from_buffer(mv)
        self.memory._copy(self.offset + offset, src, len(mv), to_host=False)


class _Memory(View):
    """A libgpuipc buffer handle (the memory) and the layout of the array it holds."""

    # The package's internal interface to it: what other modules use, and why (tests/python/layers.py).
    _INTERNAL = {
        '_handle': "libgpuipc's handle: the client publishes, retires and frees by it, and forgets it on close",
        '_usable_ptr': "a View's pointer, checked usable (View, as of every memory: ring frames too)",
    }

    def __init__(self, client, handle, dtype='uint8', shape=None, strides=None, offset=0):
        # The library, loaded by the client already: held here so that a buffer's calls need
        # nothing of its client's but what it offers every module.
        self._lib = lib = _lib.load()
        self._client, self._handle = client, handle
        self._ptr = lib.gpuipc_buffer_ptr(handle) or 0
        self._size = lib.gpuipc_buffer_size(handle)
        self._kind = KIND_NAMES.get(lib.gpuipc_buffer_kind(handle), '?')
        self._ordinal = lib.gpuipc_buffer_device_ordinal(handle)
        self._writable = bool(lib.gpuipc_buffer_writable(handle))
        if shape is None:  # as many elements as fit after the offset
            shape = (max(self._size - offset, 0) // dtypes.itemsize(dtypes.name(dtype)),)
        View.__init__(self, self, offset, dtype, shape, strides)

    def __repr__(self):
        state = '' if self._handle else ', closed'
        return (f'<gpuipc.{type(self).__name__} {self._kind} {self._size} bytes, {self.dtype}{list(self.shape)}, '
                f'id {self.id}{state}>')

    def _usable_ptr(self):
        if not self._handle:
            raise StateError(f'the buffer was {self._gone_word}; its memory may not be used any more')
        return self._ptr

    _gone_word = 'freed'

    def _copy(self, offset, host, length, to_host):
        self._usable_ptr()
        lib = self._lib
        fn = lib.gpuipc_buffer_read if to_host else lib.gpuipc_buffer_write
        with self._client._locked():
            self._client._check(fn(self._handle, offset, host, length), 'read' if to_host else 'write')

    # ---- what libgpuipc says about the buffer ----

    @property
    def ptr(self) -> int:
        """Host pointer (memfd) or device pointer (CUDA kinds) of the buffer's first byte."""
        return self._ptr

    @property
    def size(self) -> int:
        """The buffer's size in bytes."""
        return self._size

    @property
    def kind(self):
        """'memfd', 'cuda-vmm' or 'cuda-legacy'."""
        return self._kind

    @property
    def device_ordinal(self):
        """The CUDA device ordinal of the mapping in this process, -1 for memfd."""
        return self._ordinal

    @property
    def readonly(self) -> bool:
        """False: the producer may always write its own memory."""
        return False

    @property
    def id(self) -> int:
        """The broker's id of the buffer (0 before its first publish)."""
        return self._lib.gpuipc_buffer_id(self._handle) if self._handle else 0

    @property
    def generation(self) -> int:
        """The generation of its current (or last) publication."""
        return self._lib.gpuipc_buffer_generation(self._handle) if self._handle else 0

    @property
    def name(self) -> str:
        """The name it was published under ('' before that)."""
        return self._lib.gpuipc_buffer_name(self._handle).decode() if self._handle else ''

    @property
    def device(self) -> str:
        """The GPU's UUID ('GPU-...' or 'MIG-...') for CUDA kinds, '' for memfd."""
        return self._lib.gpuipc_buffer_device(self._handle).decode() if self._handle else ''

    @property
    def segment(self) -> int:
        """For a view (an array of a pool, a state dict's part): the id of the buffer whose memory it
        is part of, which a consumer maps once for all its views; 0 otherwise."""
        return self._lib.gpuipc_buffer_segment(self._handle) if self._handle else 0

    def __dlpack_device__(self):
        if self._kind == 'memfd':
            return (dlpack.KDL_CPU, 0)
        return (dlpack.KDL_CUDA, max(self._ordinal, 0))


class Buffer(_Memory):
    """Memory this client allocated (`Client.empty()`, `Client.alloc()`, a copy made by
    `Client.share()`). It lives until `free()` or `Client.close()`; leaving a ``with`` block frees it."""

    def publish(self, name: str, **options: Any) -> int:
        """`Client.publish(self, name, **options)`."""
        return self._client.publish(self, name, **options)

    def retire(self) -> None:
        """`Client.retire(self)`: no new attaches; the drained event follows the last release."""
        self._client.retire(self)

    def wait_drained(self, timeout_ms: int = -1) -> None:
        """`Client.wait_drained(self, timeout_ms)`."""
        self._client.wait_drained(self, timeout_ms)

    @property
    def drained(self) -> bool:
        """True once the buffer, retired, has no references left (does not wait)."""
        return self._client.drained(self)

    def free(self) -> None:
        """`Client.free(self)`."""
        self._client.free(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._handle:
            self.free()

    def __reduce__(self):
        raise TypeError('a gpuipc.Buffer is memory this process allocated and cannot be pickled: publish it and '
                        'send its name or id (Client.attach(), attach_id()), or pickle an Attached of it, which '
                        'the receiving process attaches again by id')


class Attached(_Memory):
    """A reference to a buffer another process published, and its mapping here.

    `release()` (or leaving a ``with`` block) gives the reference back; an Attached dropped without
    it is released when it is garbage-collected (with a ResourceWarning), which happens only once
    every view and tensor made from it is gone too. Metadata: `meta` (the whole map as published);
    the array layout in it (dtype, shape, strides, offset) is the default view.
    """

    _gone_word = 'released'

    def __init__(self, client, handle):
        n = ctypes.c_size_t()
        lib = _lib.load()
        p = lib.gpuipc_buffer_meta(handle, ctypes.byref(n))
        self.raw_meta = ctypes.string_at(p, n.value) if p else b''
        self._generation = lib.gpuipc_buffer_generation(handle)
        self._name = lib.gpuipc_buffer_name(handle).decode(errors='replace')
        self._meta, self._meta_error = None, None
        # The layout the metadata gives is checked as every view's is (arrays.check_layout). An
        # unusable one still attaches (the bytes, meta and view() stay usable), but every framework's
        # view of it (DLPack, numpy(), memoryview(), torch(), ...) raises the same MetadataError.
        layout = None
        try:
            self._meta = _meta.unpack(self.raw_meta)
            layout = _meta.layout(self._meta)
            if layout is not None:
                _Memory.__init__(self, client, handle, *layout)
        except MetadataError as e:
            self._meta_error = f'buffer {self._name!r}: {e}' if self._meta is None else \
                f'buffer {self._name!r}: unusable layout metadata: {e}'
            layout = None
        if layout is None:
            _Memory.__init__(self, client, handle)

    @property
    def name(self) -> str:
        """The name it was attached by (or published under, for an attach by id)."""
        return self._name

    @property
    def meta(self) -> Dict[Any, Any]:
        """The metadata map exactly as the producer published it ({} when none)."""
        if self._meta is None:
            raise MetadataError(self._meta_error)
        return self._meta

    @property
    def generation(self) -> int:
        """The generation this attach got (it identifies the publication together with `id`)."""
        return self._generation

    @property
    def readonly(self) -> bool:
        """True unless the producer published the buffer writable."""
        return not self._writable

    @property
    def revoked(self) -> bool:
        """True once the broker revoked the buffer (its producer died): stop using the memory."""
        self._client.process()
        return bool(self._handle and self._lib.gpuipc_buffer_revoked(self._handle))

    def _check_layout(self):
        if self._meta_error is not None:  # a new exception each time: a raised one keeps its traceback
            raise MetadataError(self._meta_error)

    def wait_ready(self, stream: Any = None) -> None:
        """If the producer published with a fence, enqueues in `stream` (a torch or CuPy stream, a raw
        CUstream as int, or None for the default stream) a wait until the data is written."""
        m = self.meta
        if 'fence' in m:
            self._client._fence_for(m['fence']).wait(int(m.get('fence_value', 1)), stream)

    def __reduce__(self):
        """Pickling (multiprocessing and torch.multiprocessing queues, ...) sends the buffer's id and the
        broker's socket, never the memory: the receiving process attaches the same buffer again by id,
        through a connection of its own (one per process and socket, closed at exit), and holds a
        reference of its own to release. The buffer must still be live when it is unpickled."""
        if not self._handle:
            raise TypeError(f'buffer {self._name!r} was released: pickle an Attached while it holds its reference')
        return (_unpickle, (self._client.connection_info().socket_path, self.id))

    def release(self) -> None:
        """Gives the reference back (idempotent). Views must not be used afterwards."""
        handle, self._handle = self._handle, None
        if handle:
            self._client._release(self, handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        handle = getattr(self, '_handle', None)
        if handle:
            self._handle = None
            warnings.warn(f'gpuipc: {self._kind} buffer {self._name!r} was not released; releasing it now',
                          ResourceWarning, stacklevel=2)
            self._client._release_later(handle)


# How an unpickled Attached is attached again (by id, through a connection of the receiving
# process): a Client's business, which lies above this module; the client module sets it when it
# is imported (set_reattach), as importing gpuipc does.
_reattach = None


def set_reattach(reattach):
    """Sets reattach(socket_path, buffer_id) -> Attached, what _unpickle calls."""
    global _reattach
    _reattach = reattach


def _unpickle(socket, buffer_id):
    return _reattach(socket, buffer_id)
