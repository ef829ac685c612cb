"""gpuipc for Python: share torch tensors, CuPy arrays and host buffers between processes through a
gpuipc-broker, zero-copy. A thin ctypes layer over libgpuipc; no third-party dependency (torch and
CuPy are used only when you pass or ask for their objects).

    # producer                                      # consumer (another process or container)
    import gpuipc, torch                            import gpuipc
    c = gpuipc.Client()                             c = gpuipc.Client()
    t = c.empty((1080, 1920, 3), 'uint8',           a = c.attach('frames/cam0', timeout_ms=5000)
                kind='cuda-vmm', device=0)          t = a.torch()   # a view, no copy
    t.copy_(frame)                                  ... use t ...
    c.publish(t, 'frames/cam0')                     a.release()
    c.retire(t); c.wait_drained(t)

`empty()` returns a tensor (or CuPy array, with framework='cupy'; a memoryview for memfd) whose
memory is a gpuipc buffer, so writing it needs no extra copy. `share(tensor, name)` publishes an
existing tensor by copying it into such a buffer (or, with kind='cuda-legacy', by exporting the
tensor's own allocation: zero-copy, but producer and consumer must share a PID namespace).
The buffer's dtype and shape travel in its metadata. The library is found through
$GPUIPC_LIBRARY, then the system's libgpuipc.so.0.
"""
import ctypes
import ctypes.util
import os
import struct

__all__ = ['Client', 'Attached', 'Error', 'KINDS']

KINDS = {'memfd': 1, 'cuda-vmm': 2, 'cuda-legacy': 3}
_KIND_NAMES = {v: k for k, v in KINDS.items()}

# dtype name -> (array-interface typestr, item size)
_DTYPES = {
    'bool': ('|b1', 1), 'uint8': ('|u1', 1), 'int8': ('|i1', 1),
    'int16': ('<i2', 2), 'uint16': ('<u2', 2), 'float16': ('<f2', 2), 'bfloat16': ('<V2', 2),
    'int32': ('<i4', 4), 'uint32': ('<u4', 4), 'float32': ('<f4', 4),
    'int64': ('<i8', 8), 'uint64': ('<u8', 8), 'float64': ('<f8', 8),
}


class Error(Exception):
    """A libgpuipc error: .code is the negative error code, the message says cause and fix."""

    def __init__(self, code, what, detail):
        self.code = code
        super().__init__(f'{what}: {detail}')


def _load():
    path = os.environ.get('GPUIPC_LIBRARY') or ctypes.util.find_library('gpuipc') or 'libgpuipc.so.0'
    lib = ctypes.CDLL(path)
    p, i, u64, sz, s = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_char_p
    sigs = {
        'gpuipc_connect': (i, [ctypes.POINTER(p), p]),
        'gpuipc_close': (None, [p]),
        'gpuipc_strerror': (s, [i]),
        'gpuipc_errmsg': (s, [p]),
        'gpuipc_buffer_alloc': (i, [p, i, sz, i, ctypes.POINTER(p)]),
        'gpuipc_buffer_wrap_cuda': (i, [p, u64, sz, ctypes.POINTER(p)]),
        'gpuipc_publish': (i, [p, p, s, p]),
        'gpuipc_retire': (i, [p, p]),
        'gpuipc_wait_drained': (i, [p, p, i]),
        'gpuipc_attach': (i, [p, s, i, ctypes.POINTER(p)]),
        'gpuipc_release': (i, [p, p]),
        'gpuipc_buffer_free': (i, [p, p]),
        'gpuipc_buffer_ptr': (p, [p]),
        'gpuipc_buffer_size': (sz, [p]),
        'gpuipc_buffer_kind': (i, [p]),
        'gpuipc_buffer_id': (u64, [p]),
        'gpuipc_buffer_generation': (u64, [p]),
        'gpuipc_buffer_device_ordinal': (i, [p]),
        'gpuipc_buffer_writable': (i, [p]),
        'gpuipc_buffer_meta': (p, [p, ctypes.POINTER(sz)]),
        'gpuipc_set_device': (i, [p, i]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


class _Options(ctypes.Structure):
    _fields_ = [('socket_path', ctypes.c_char_p), ('label', ctypes.c_char_p), ('connect_timeout_ms', ctypes.c_int),
                ('reconnect', ctypes.c_int), ('no_gpus', ctypes.c_int)]


class _PublishOptions(ctypes.Structure):
    _fields_ = [('writable', ctypes.c_int), ('broker_held', ctypes.c_int), ('retire_after', ctypes.c_uint),
                ('meta', ctypes.c_void_p), ('meta_len', ctypes.c_size_t), ('no_sync', ctypes.c_int)]


# ---- a minimal msgpack subset for the metadata map: str keys, str/int/list values ----

def _pack(v):
    if isinstance(v, str):
        b = v.encode()
        return (bytes([0xa0 | len(b)]) if len(b) < 32 else b'\xd9' + bytes([len(b)])) + b
    if isinstance(v, bool):
        return b'\xc3' if v else b'\xc2'
    if isinstance(v, int):
        return bytes([v]) if 0 <= v < 128 else b'\xcf' + struct.pack('>Q', v)
    if isinstance(v, (list, tuple)):
        return bytes([0x90 | len(v)]) + b''.join(_pack(x) for x in v)
    if isinstance(v, dict):
        return bytes([0x80 | len(v)]) + b''.join(_pack(k) + _pack(x) for k, x in v.items())
    raise TypeError(f'cannot encode {type(v).__name__} in metadata')


def _unpack(b, i=0):
    t = b[i]
    if t < 0x80:
        return t, i + 1
    if 0x80 <= t <= 0x8f or 0x90 <= t <= 0x9f:
        n, i = t & 0x0f, i + 1
        if t < 0x90:
            d = {}
            for _ in range(n):
                k, i = _unpack(b, i)
                d[k], i = _unpack(b, i)
            return d, i
        out = []
        for _ in range(n):
            x, i = _unpack(b, i)
            out.append(x)
        return out, i
    if 0xa0 <= t <= 0xbf:
        n = t & 0x1f
        return b[i + 1:i + 1 + n].decode(), i + 1 + n
    if t == 0xd9:
        n = b[i + 1]
        return b[i + 2:i + 2 + n].decode(), i + 2 + n
    if t in (0xc2, 0xc3):
        return t == 0xc3, i + 1
    widths = {0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8}
    if t in widths:
        w = widths[t]
        return int.from_bytes(b[i + 1:i + 1 + w], 'big'), i + 1 + w
    raise ValueError(f'unsupported msgpack byte 0x{t:02x} in metadata')


def _dtype_name(dtype):
    """'float32' from a torch dtype, a numpy/CuPy dtype or a string."""
    name = str(dtype).replace('torch.', '')
    if name not in _DTYPES:
        raise ValueError(f'unsupported dtype {dtype}; one of {", ".join(_DTYPES)}')
    return name


def _torch_dtype(name):
    import torch
    return getattr(torch, name)


class _CudaArray:
    """Exposes a device buffer through __cuda_array_interface__ (v3) for torch.as_tensor / cupy.asarray."""

    def __init__(self, ptr, shape, dtype, readonly, owner):
        self._owner = owner  # keeps the buffer alive as long as views exist
        self.__cuda_array_interface__ = {
            'version': 3, 'shape': tuple(shape), 'typestr': _DTYPES[dtype][0], 'data': (ptr, readonly),
            'strides': None, 'stream': None,
        }


class _Buffer:
    """A libgpuipc buffer with its dtype and shape."""

    def __init__(self, client, handle, dtype, shape):
        self.client, self.handle, self.dtype, self.shape = client, handle, dtype, tuple(shape)

    @property
    def lib(self):
        return self.client._lib

    @property
    def ptr(self):
        return self.lib.gpuipc_buffer_ptr(self.handle) or 0

    @property
    def size(self):
        return self.lib.gpuipc_buffer_size(self.handle)

    @property
    def kind(self):
        return _KIND_NAMES.get(self.lib.gpuipc_buffer_kind(self.handle), '?')

    @property
    def id(self):
        return self.lib.gpuipc_buffer_id(self.handle)

    @property
    def generation(self):
        return self.lib.gpuipc_buffer_generation(self.handle)

    def memoryview(self):
        """The bytes of a memfd buffer (host memory), without a copy."""
        if self.kind != 'memfd':
            raise TypeError('only memfd buffers live in host memory; use torch() or cupy()')
        arr = (ctypes.c_ubyte * self.size).from_address(self.ptr)
        mv = memoryview(arr).cast('B')
        return mv if self.lib.gpuipc_buffer_writable(self.handle) or getattr(self, '_own', False) else mv.toreadonly()

    def torch(self):
        """A torch tensor over the buffer (no copy): on its GPU for CUDA kinds, on the CPU for memfd."""
        import torch
        dt = _torch_dtype(self.dtype)
        if self.kind == 'memfd':
            return torch.frombuffer(self.memoryview(), dtype=dt).view(self.shape) if self.size else torch.empty(0, dtype=dt)
        arr = _CudaArray(self.ptr, self.shape, self.dtype, False, self)
        dev = self.lib.gpuipc_buffer_device_ordinal(self.handle)
        return torch.as_tensor(arr, device=f'cuda:{dev}')

    def cupy(self):
        """A CuPy array over the buffer (no copy)."""
        import cupy
        dev = self.lib.gpuipc_buffer_device_ordinal(self.handle)
        with cupy.cuda.Device(dev):
            return cupy.asarray(_CudaArray(self.ptr, self.shape, self.dtype, False, self))


class Attached(_Buffer):
    """A buffer attached by name; release() (or leaving a `with` block) gives the reference back."""

    def release(self):
        if self.handle:
            self.client._check(self.lib.gpuipc_release(self.client._c, self.handle), 'release')
            self.handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class Client:
    """A connection to the broker. Not thread-safe: use one per thread."""

    def __init__(self, socket=None, label=None, connect_timeout_ms=5000, reconnect=False):
        self._lib = _load()
        self._c = ctypes.c_void_p()
        opts = _Options(socket.encode() if socket else None, (label or 'python').encode(), connect_timeout_ms,
                        int(reconnect), 0)
        r = self._lib.gpuipc_connect(ctypes.byref(self._c), ctypes.byref(opts))
        if r < 0:
            raise Error(r, 'connect', (self._lib.gpuipc_errmsg(None) or b'').decode() or self._strerror(r))
        self._own = {}  # id(obj) -> _Buffer, for objects made by empty()/share()

    def _strerror(self, r):
        return self._lib.gpuipc_strerror(r).decode()

    def _check(self, r, what):
        if r < 0:
            detail = (self._lib.gpuipc_errmsg(self._c) or b'').decode()
            raise Error(r, what, f'{detail} ({self._strerror(r)})' if detail else self._strerror(r))
        return r

    def close(self):
        if self._c:
            self._lib.gpuipc_close(self._c)
            self._c = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- producer ----

    def _alloc(self, nbytes, kind, device):
        h = ctypes.c_void_p()
        self._check(self._lib.gpuipc_buffer_alloc(self._c, KINDS[kind], max(nbytes, 1), device, ctypes.byref(h)),
                    f'allocate {nbytes} bytes of {kind}')
        return h

    def empty(self, shape, dtype='float32', kind='cuda-vmm', device=0, framework='torch'):
        """A new array in shared memory: a torch tensor (framework='torch'), a CuPy array ('cupy'),
        or a writable memoryview ('memoryview', memfd only)."""
        shape = tuple(int(x) for x in shape)
        name = _dtype_name(dtype)
        nbytes = _DTYPES[name][1]
        for x in shape:
            nbytes *= x
        buf = _Buffer(self, self._alloc(nbytes, kind, device), name, shape)
        buf._own = True
        obj = buf.memoryview() if framework == 'memoryview' else buf.torch() if framework == 'torch' else buf.cupy()
        self._own[id(obj)] = (buf, obj)
        return obj

    def share(self, tensor, name, kind='cuda-vmm', **publish_options):
        """Publishes an existing torch tensor or CuPy array. cuda-legacy exports the tensor's own
        memory (zero-copy; it must stay alive until drained); other kinds copy it into a new buffer.
        Returns the object to retire / wait_drained on."""
        if kind == 'cuda-legacy':
            ptr, nbytes, dtype, shape = _device_view(tensor)
            h = ctypes.c_void_p()
            self._check(self._lib.gpuipc_buffer_wrap_cuda(self._c, ptr, nbytes, ctypes.byref(h)), 'wrap the tensor')
            buf = _Buffer(self, h, dtype, shape)
            buf._own = True
            self._own[id(tensor)] = (buf, tensor)
            self.publish(tensor, name, **publish_options)
            return tensor
        _, _, dtype, shape = _device_view(tensor)
        dev = tensor.device.index if hasattr(tensor, 'device') and hasattr(tensor.device, 'index') else 0
        framework = 'torch' if type(tensor).__module__.startswith('torch') else 'cupy'
        copy = self.empty(shape, dtype, kind=kind, device=dev or 0, framework=framework)
        copy[...] = tensor
        self.publish(copy, name, **publish_options)
        return copy

    def _buffer_of(self, obj):
        entry = self._own.get(id(obj))
        if not entry:
            raise ValueError('not an object made by this client (use empty() or share())')
        return entry[0]

    def publish(self, obj, name, writable=False, broker_held=False, retire_after=0, meta=None):
        """Publishes an object made by empty() (or share()). dtype and shape travel in the metadata;
        `meta` adds your own keys (strings, ints, lists). CUDA kinds synchronize the device first."""
        buf = self._buffer_of(obj)
        m = {'dtype': buf.dtype, 'shape': list(buf.shape), **(meta or {})}
        packed = _pack(m)
        raw = ctypes.create_string_buffer(packed, len(packed))
        opts = _PublishOptions(int(writable), int(broker_held), retire_after, ctypes.cast(raw, ctypes.c_void_p),
                               len(packed), 0)
        self._check(self._lib.gpuipc_publish(self._c, buf.handle, name.encode(), ctypes.byref(opts)), f'publish {name}')
        return buf.id

    def retire(self, obj):
        self._check(self._lib.gpuipc_retire(self._c, self._buffer_of(obj).handle), 'retire')

    def wait_drained(self, obj, timeout_ms=-1):
        """Blocks until every consumer released obj's buffer; then it may be written again."""
        self._check(self._lib.gpuipc_wait_drained(self._c, self._buffer_of(obj).handle, timeout_ms), 'wait_drained')

    def free(self, obj):
        buf, _ = self._own.pop(id(obj))
        self._check(self._lib.gpuipc_buffer_free(self._c, buf.handle), 'free')

    # ---- consumer ----

    def attach(self, name, timeout_ms=5000, device=-1):
        """Attaches the buffer published under name (waiting up to timeout_ms). Returns an Attached:
        .torch(), .cupy() or .memoryview() give zero-copy views; .release() gives it back."""
        self._check(self._lib.gpuipc_set_device(self._c, device), 'set_device')
        h = ctypes.c_void_p()
        self._check(self._lib.gpuipc_attach(self._c, name.encode(), timeout_ms, ctypes.byref(h)), f'attach {name}')
        n = ctypes.c_size_t()
        p = self._lib.gpuipc_buffer_meta(h, ctypes.byref(n))
        meta = _unpack(ctypes.string_at(p, n.value))[0] if p else {}
        dtype = meta.get('dtype', 'uint8')
        shape = meta.get('shape') or [self._lib.gpuipc_buffer_size(h) // _DTYPES[dtype][1]]
        a = Attached(self, h, dtype, shape)
        a.meta = meta
        return a


def _device_view(t):
    """(device pointer, nbytes, dtype name, shape) of a contiguous torch tensor or CuPy array."""
    if hasattr(t, 'data_ptr'):
        if not t.is_contiguous():
            raise ValueError('the tensor must be contiguous')
        return t.data_ptr(), t.numel() * t.element_size(), _dtype_name(t.dtype), tuple(t.shape)
    cai = t.__cuda_array_interface__
    if cai.get('strides') is not None:
        raise ValueError('the array must be C-contiguous')
    return cai['data'][0], t.nbytes, _dtype_name(t.dtype), tuple(cai['shape'])
