"""Element types: one canonical name per dtype ('float32', 'bfloat16', ...), its size, its DLPack
code, and the matching torch/NumPy dtype. Names are what travel in metadata, so producers and
consumers in different frameworks agree."""

from .errors import InvalidArgument, UnsupportedDtype

# name -> (item size in bytes, DLPack type code, DLPack bits)
_TABLE = {
    'bool': (1, 6, 8),
    'uint8': (1, 1, 8), 'int8': (1, 0, 8),
    'uint16': (2, 1, 16), 'int16': (2, 0, 16), 'float16': (2, 2, 16), 'bfloat16': (2, 4, 16),
    'uint32': (4, 1, 32), 'int32': (4, 0, 32), 'float32': (4, 2, 32),
    'uint64': (8, 1, 64), 'int64': (8, 0, 64), 'float64': (8, 2, 64),
    'complex64': (8, 5, 64), 'complex128': (16, 5, 128),
    # DLPack 1.1 codes; consumers that predate them refuse these, torch views in state dicts do not
    'float8_e4m3fn': (1, 10, 8), 'float8_e4m3fnuz': (1, 11, 8), 'float8_e5m2': (1, 12, 8),
    'float8_e5m2fnuz': (1, 13, 8), 'float8_e8m0fnu': (1, 14, 8),
    # two 4-bit floats a byte (torch's float4_e2m1fn_x2, safetensors' F4): no DLPack code of its own, so
    # only torch views of a state dict (and raw bytes) carry it
    'float4_e2m1fn_x2': (1, None, 8),
}
_BY_DLPACK = {(code, bits): name for name, (_, code, bits) in _TABLE.items() if code is not None}
ITEMSIZES = {name: size for name, (size, _, _) in _TABLE.items()}  # canonical name -> bytes per element

NAMES = tuple(_TABLE)


def name(dtype):
    """The canonical name of a dtype given as a string, a torch dtype, or anything numpy.dtype() takes
    (NumPy, CuPy and JAX dtypes, scalar types, 'f4', ml_dtypes.bfloat16, ...)."""
    if isinstance(dtype, str) and dtype in _TABLE:
        return dtype
    text = str(dtype)
    if text.startswith('torch.'):
        n = text[len('torch.'):]
    else:
        try:
            import numpy
            n = numpy.dtype(dtype).name
        except (ImportError, TypeError):
            n = text
    if n not in _TABLE:
        raise UnsupportedDtype(f'unsupported dtype {dtype!r}: DLPack as gpuipc carries it knows '
                               f'{", ".join(_TABLE)} (publish it converted, or its bytes as uint8)')
    return n


def itemsize(n):
    """Bytes per element of the canonical dtype name n."""
    return _TABLE[n][0]


def dlpack_code(n):
    """(DLPack type code, bits) of the canonical dtype name n; UnsupportedDtype for one DLPack cannot carry."""
    code, bits = _TABLE[n][1:]
    if code is None:
        raise UnsupportedDtype(f'{n} has no DLPack code: view it with torch, or read its bytes')
    return code, bits


def from_dlpack_code(code, bits):
    """The canonical name for a DLPack (code, bits) pair, or None."""
    return _BY_DLPACK.get((code, bits))


def torch_dtype(n):
    """The torch dtype for a canonical name."""
    import torch
    return getattr(torch, n)


def numpy_dtype(n):
    """The NumPy dtype for a canonical name; bfloat16 and float8 need ml_dtypes (shipped with JAX)."""
    import numpy
    try:
        return numpy.dtype(n)
    except TypeError:
        pass
    try:
        import ml_dtypes
        return numpy.dtype(getattr(ml_dtypes, n))
    except (ImportError, AttributeError):
        raise TypeError(f'NumPy has no {n} dtype; install ml_dtypes (it comes with JAX) or use torch') from None
