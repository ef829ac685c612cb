"""DLPack export with ctypes: turns (pointer, device, dtype, shape, strides) into the PyCapsule that
``torch.from_dlpack``, ``numpy.from_dlpack``, ``cupy.from_dlpack`` and ``jax.dlpack.from_dlpack``
take, zero-copy. Both capsule forms: the legacy ``DLManagedTensor`` ("dltensor") and DLPack 1.0's
``DLManagedTensorVersioned`` ("dltensor_versioned", which can say read-only), chosen by the
consumer's ``max_version``.

Lifetime: each capsule's managed tensor keeps a Python object (the owner: the gpuipc buffer) alive
until the consumer calls its deleter, or until the capsule is dropped unused. The structures live
in a module-level table keyed by their address; the deleter removes the entry.
"""
import ctypes
import threading

from . import dtypes

KDL_CPU = 1
KDL_CUDA = 2
FLAG_READ_ONLY = 1

_NAME = b'dltensor'
_NAME_VERSIONED = b'dltensor_versioned'


class _Device(ctypes.Structure):
    _fields_ = [('device_type', ctypes.c_int32), ('device_id', ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [('code', ctypes.c_uint8), ('bits', ctypes.c_uint8), ('lanes', ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [('data', ctypes.c_void_p), ('device', _Device), ('ndim', ctypes.c_int32), ('dtype', _DataType),
                ('shape', ctypes.POINTER(ctypes.c_int64)), ('strides', ctypes.POINTER(ctypes.c_int64)),
                ('byte_offset', ctypes.c_uint64)]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Managed(ctypes.Structure):
    _fields_ = [('dl_tensor', _Tensor), ('manager_ctx', ctypes.c_void_p), ('deleter', _Deleter)]


class _Version(ctypes.Structure):
    _fields_ = [('major', ctypes.c_uint32), ('minor', ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    _fields_ = [('version', _Version), ('manager_ctx', ctypes.c_void_p), ('deleter', _Deleter),
                ('flags', ctypes.c_uint64), ('dl_tensor', _Tensor)]


# address of a managed tensor -> (the structure, shape/strides arrays, owner): what must stay alive
_live = {}
_live_lock = threading.RLock()  # re-entrant: a GC run inside the locked part may drop a capsule


# Lifetime at exit: the interpreter clears modules' globals before the last objects go, and a
# framework's array that outlives this module (a torch tensor cached in a reference cycle, a NumPy
# array in another module's global) then calls its deleter. Were the table and the callbacks freed
# with the module, that call would jump into freed memory (NumPy: SIGILL, torch: SIGSEGV, measured).
# So the callbacks take what they use as default arguments, not globals, and the table and the
# callbacks are never freed (_immortal: one reference leaked on purpose, once per process).

def _forget(address, _live=_live, _live_lock=_live_lock):
    with _live_lock:
        _live.pop(address, None)


# The consumer calls it when done (from any thread: ctypes takes the GIL for the callback).
_delete = _Deleter(_forget)


_PyCapsule_Destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _PyCapsule_Destructor]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


@_PyCapsule_Destructor
def _capsule_destructor(capsule, _names=(_NAME, _NAME_VERSIONED), _api=_api, _forget=_forget):
    # The capsule is being deallocated: pass it as a plain address (a py_object argument would
    # resurrect it). A consumer renames a capsule it took ("used_dltensor"); an unused one still
    # owns its tensor and must free it here.
    for name in _names:
        if _api.PyCapsule_IsValid(capsule, name):
            _forget(_api.PyCapsule_GetPointer(capsule, name))


def _immortal(obj):
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


for _obj in (_live, _delete, _capsule_destructor):
    _immortal(_obj)
del _obj


def _int64s(values):
    return (ctypes.c_int64 * max(len(values), 1))(*values)


def capsule(owner, ptr, device, dtype, shape, strides=None, readonly=False, max_version=None):
    """A DLPack capsule over memory that `owner` keeps alive.

    device: (device type, ordinal), KDL_CPU or KDL_CUDA. dtype: a canonical dtype name. strides: in
    elements, None for C-contiguous. max_version: the consumer's ``max_version`` argument; (1, 0) or
    later gets a versioned capsule (flagged read-only when `readonly`), None or older the legacy one.
    """
    code, bits = dtypes.dlpack_code(dtype)
    shape_arr = _int64s(shape)
    strides_arr = _int64s(strides) if strides is not None else None
    tensor = _Tensor(ptr, _Device(*device), len(shape), _DataType(code, bits, 1), shape_arr, strides_arr, 0)
    versioned = max_version is not None and tuple(max_version)[0] >= 1
    if versioned:
        managed = _ManagedVersioned(_Version(1, 0), None, _delete, FLAG_READ_ONLY if readonly else 0, tensor)
    else:
        managed = _Managed(tensor, None, _delete)
    address = ctypes.addressof(managed)
    with _live_lock:
        _live[address] = (managed, shape_arr, strides_arr, owner)
    try:
        return _api.PyCapsule_New(address, _NAME_VERSIONED if versioned else _NAME, _capsule_destructor)
    except BaseException:
        _forget(address)
        raise


def live_count():
    """How many exported tensors have not been deleted yet (tests use it to see views released)."""
    with _live_lock:
        return len(_live)


class Info:
    """What a DLPack-exporting object describes: its pointer, device, dtype, shape, strides (in
    elements, None when C-contiguous) and whether the producer flagged it read-only."""

    def __init__(self, ptr, device, dtype, shape, strides, readonly):
        self.ptr, self.device, self.dtype, self.shape, self.strides, self.readonly = (ptr, device, dtype, shape,
                                                                                       strides, readonly)

    def __repr__(self):
        return (f'dlpack.Info(ptr=0x{self.ptr:x}, device={self.device}, dtype={self.dtype}, shape={self.shape}, '
                f'strides={self.strides})')


def describe(obj):
    """Reads obj.__dlpack__() without taking the data: an Info. The capsule is dropped unused, which
    hands the tensor back to its producer."""
    try:
        cap = obj.__dlpack__(max_version=(1, 0))
    except TypeError:
        cap = obj.__dlpack__()
    address = id(cap)
    if _api.PyCapsule_IsValid(address, _NAME_VERSIONED):
        m = _ManagedVersioned.from_address(_api.PyCapsule_GetPointer(address, _NAME_VERSIONED))
        t, readonly = m.dl_tensor, bool(m.flags & FLAG_READ_ONLY)
    elif _api.PyCapsule_IsValid(address, _NAME):
        t, readonly = _Managed.from_address(_api.PyCapsule_GetPointer(address, _NAME)).dl_tensor, False
    else:
        raise TypeError(f'{type(obj).__name__}.__dlpack__() did not return a DLPack capsule')
    dtype = dtypes.from_dlpack_code(t.dtype.code, t.dtype.bits)
    if dtype is None or t.dtype.lanes != 1:
        raise TypeError(f'unsupported DLPack dtype (code {t.dtype.code}, bits {t.dtype.bits}, lanes {t.dtype.lanes})')
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else None
    if strides is not None and strides == contiguous_strides(shape):
        strides = None
    info = Info((t.data or 0) + t.byte_offset, (t.device.device_type, t.device.device_id), dtype, shape, strides,
                readonly)
    del cap
    return info


def contiguous_strides(shape):
    """C-order strides, in elements, of shape."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))
