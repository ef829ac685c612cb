"""Array objects of every framework, seen the same way: where their elements are (pointer, device),
their dtype, shape and strides; and copying one into gpuipc memory with the framework it came from.

torch tensors, NumPy and CuPy arrays are read through their own attributes (cheap); anything else
that implements ``__dlpack__`` (JAX arrays, gpuipc views, ...) through its DLPack capsule.
"""
import operator

from . import dlpack, dtypes
from .errors import InvalidArgument, MetadataError

MAX_NDIM = 32  # NumPy 1.x's limit (2.x takes 64): more dimensions are a layout no consumer can view
_INT64 = 1 << 63


def framework_of(obj):
    """'torch', 'numpy', 'cupy', 'jax', 'gpuipc' or None, from the object's type."""
    module = type(obj).__module__ or ''
    for name in ('torch', 'numpy', 'cupy', 'gpuipc'):
        if module == name or module.startswith(name + '.'):
            return name
    if module.startswith(('jax', 'jaxlib')):
        return 'jax'
    return None


def describe(obj):
    """A dlpack.Info for obj: pointer of the first element, (DLPack device type, ordinal), canonical
    dtype, shape, strides in elements (None when C-contiguous)."""
    fw = framework_of(obj)
    if fw == 'torch':
        # The cheapest accessors: a state dict's 200 tensors are described at every publish.
        if obj.is_cuda:
            device = (dlpack.KDL_CUDA, obj.get_device())
        elif obj.device.type == 'cpu':
            device = (dlpack.KDL_CPU, 0)
        else:
            raise TypeError(f'a torch tensor on {obj.device} cannot be shared; move it to the CPU or a CUDA device')
        strides = None if obj.is_contiguous() else tuple(obj.stride())
        return dlpack.Info(obj.data_ptr(), device, _torch_dtype_name(obj.dtype), tuple(obj.shape), strides, False)
    if fw == 'numpy' and hasattr(obj, '__array_interface__'):
        ai = obj.__array_interface__
        return dlpack.Info(ai['data'][0], (dlpack.KDL_CPU, 0), _numpy_dtype_name(obj.dtype), tuple(obj.shape),
                           _element_strides(obj), bool(ai['data'][1]))
    if fw == 'cupy' and hasattr(obj, 'data') and hasattr(obj.data, 'ptr'):
        return dlpack.Info(obj.data.ptr, (dlpack.KDL_CUDA, obj.device.id), _numpy_dtype_name(obj.dtype),
                           tuple(obj.shape), _element_strides(obj), False)
    if hasattr(obj, '_gpuipc_info'):
        return obj._gpuipc_info()
    if isinstance(obj, memoryview):
        return _describe_memoryview(obj)
    if hasattr(obj, '__dlpack__'):
        return dlpack.describe(obj)
    raise TypeError(f'{type(obj).__name__} is not an array gpuipc can share (torch, NumPy, CuPy, JAX, or any '
                    f'object with __dlpack__)')


# dtype object -> canonical name: dtypes.name() goes through str(), and NumPy's dtype.name is slow
_torch_dtypes = {}
_numpy_dtypes = {}


def _torch_dtype_name(dtype):
    name = _torch_dtypes.get(dtype)
    if name is None:
        name = _torch_dtypes[dtype] = dtypes.name(dtype)
    return name


def _numpy_dtype_name(dtype):
    name = _numpy_dtypes.get(dtype)
    if name is None:
        name = _numpy_dtypes[dtype] = dtypes.name(dtype)
    return name


def _describe_memoryview(mv):
    """A contiguous memoryview (host memory) as an array of its item type; bytes for 'B'/'b'/'c'."""
    import ctypes
    if not mv.c_contiguous:
        raise InvalidArgument('only contiguous memoryviews can be shared')
    codes = {'B': 'uint8', 'b': 'int8', 'c': 'uint8', '?': 'bool', 'H': 'uint16', 'h': 'int16', 'I': 'uint32',
             'i': 'int32', 'Q': 'uint64', 'q': 'int64', 'L': 'uint64', 'l': 'int64', 'f': 'float32', 'd': 'float64',
             'e': 'float16'}
    dtype = codes.get(mv.format.lstrip('@=<'))
    if dtype is None or dtypes.itemsize(dtype) != mv.itemsize:
        raise TypeError(f'memoryview format {mv.format!r} has no gpuipc dtype')
    if mv.nbytes == 0:
        raise InvalidArgument('an empty memoryview has no address')
    raw = mv.cast('B')
    if raw.readonly:
        import numpy
        ptr = numpy.frombuffer(raw, numpy.uint8).__array_interface__['data'][0]
    else:
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(raw))
    return dlpack.Info(ptr, (dlpack.KDL_CPU, 0), dtype, tuple(mv.shape), None, raw.readonly)


def _element_strides(arr):
    """Strides of a NumPy/CuPy array in elements, None when C-contiguous."""
    if arr.flags.c_contiguous:
        return None
    size = arr.itemsize
    if any(s % size for s in arr.strides):
        raise InvalidArgument('the array has strides that are not a multiple of its item size')
    return tuple(s // size for s in arr.strides)


def extent(info):
    """(lowest, highest + 1) byte offset from info.ptr that the elements touch; (0, 0) when empty."""
    return _extent(info.dtype, info.shape, info.strides)


def _extent(dtype, shape, strides):
    size = dtypes.itemsize(dtype)
    if strides is None:  # C-contiguous, the common case: a state dict's arrays are located every publish
        n = numel(shape)
        return (0, n * size) if n else (0, 0)
    if any(n == 0 for n in shape):
        return 0, 0
    lo = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    hi = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0)
    return lo * size, (hi + 1) * size


def _ints(values, what, low):
    """values (a list or tuple) as a tuple of ints in [low, 2^63), else MetadataError. bools and
    floats are no sizes, though int() would take them."""
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, '__iter__'):
        raise MetadataError(f'the {what} {values!r:.80} is not a list of ints')
    out = []
    for x in values:
        try:
            if type(x) is bool:
                raise TypeError
            x = operator.index(x)
        except TypeError:
            raise MetadataError(f'the {what} {values!r:.80} is not a list of ints') from None
        if not low <= x < _INT64:
            raise MetadataError(f'the {what} {values!r:.80} has {x}, outside [{low}, 2^63)')
        out.append(x)
    if len(out) > MAX_NDIM:
        raise MetadataError(f'the {what} has {len(out)} dimensions; views take at most {MAX_NDIM}')
    return tuple(out)


def check_layout(dtype, shape, strides, offset, size):
    """(shape, strides or None, offset) of a layout of `dtype` elements (a canonical name) in a
    size-byte buffer, checked: dimensions non-negative ints, strides (in elements) ints, one per
    dimension, offset a non-negative int, and every element inside the buffer; MetadataError says
    what is wrong. Every View is made through it (an attached buffer's metadata, a state dict's or
    a ring's arrays, view()), so NumPy, DLPack, torch and the others are handed only layouts they
    can take, and refuse the same ones with the same error."""
    shape = _ints(shape, 'shape', 0)
    if strides is not None:
        strides = _ints(strides, 'strides', -_INT64 + 1)
        if len(strides) != len(shape):
            raise MetadataError(f'{len(strides)} strides for the {len(shape)} dimensions of shape {list(shape)}')
    try:
        if type(offset) is bool:
            raise TypeError
        offset = operator.index(offset)
    except TypeError:
        raise MetadataError(f'the offset {offset!r:.40} is not an int') from None
    itemsize = dtypes.itemsize(dtype)
    # what NumPy computes before it looks at zeros: its byte size must fit an int64
    span = itemsize
    for n in shape:
        span *= max(n, 1)
    lo, hi = _extent(dtype, shape, strides)
    if offset < 0 or offset + lo < 0 or offset + hi > size or span >= _INT64:
        raise MetadataError(f'a {dtype} view of shape {list(shape)} at offset {offset} does not fit in the '
                            f'{size}-byte buffer')
    return shape, strides, offset


def numel(shape):
    """Number of elements of shape."""
    n = 1
    for x in shape:
        n *= x
    return n


def convert(exportable, framework):
    """exportable (a gpuipc buffer or view) as a framework object, zero-copy: 'torch', 'numpy',
    'cupy', 'jax', 'memoryview' (host memory only), or None for exportable itself."""
    if framework is None or framework == 'gpuipc':
        return exportable
    method = {'torch': 'torch', 'numpy': 'numpy', 'cupy': 'cupy', 'jax': 'jax', 'memoryview': 'memoryview'}.get(
        framework)
    if method is None:
        raise InvalidArgument(f"framework must be 'torch', 'numpy', 'cupy', 'jax', 'memoryview' or None, not "
                         f'{framework!r}')
    return getattr(exportable, method)()


def copy_into(dst, src):
    """Copies the array src into dst (a gpuipc view of the same shape), with src's own framework
    (so device copies stay on the device); NumPy and other host arrays into CUDA memory go through
    libgpuipc's copy."""
    fw = framework_of(src)
    if fw == 'torch':
        dst.torch().copy_(src)
        return
    if fw == 'cupy':
        import cupy
        with cupy.cuda.Device(dst.device_ordinal if dst.device_ordinal >= 0 else src.device.id):
            out = dst.cupy()
            out[...] = src
        return
    if fw != 'numpy':
        src = _as_host_or_torch(src)
        if framework_of(src) == 'torch':
            dst.torch().copy_(src)
            return
    import numpy
    if dst.kind == 'memfd':
        out = dst.numpy()
        out[...] = src
        return
    host = numpy.ascontiguousarray(src)
    if host.shape != tuple(dst.shape):
        host = numpy.broadcast_to(host, dst.shape).copy()
    dst.write(host.view(numpy.uint8).reshape(-1), 0)


def _as_host_or_torch(src):
    """A JAX (or other DLPack) array as a torch tensor when torch is there (zero-copy, stays on its
    device), else as a NumPy array."""
    try:
        import torch
        return torch.from_dlpack(src)
    except Exception:
        import numpy
        return numpy.asarray(src)
