"""Buffer metadata: the small msgpack map that travels with every publish (at most 4096 bytes).

gpuipc itself writes a few keys, which C producers and consumers may use as well:

    dtype        canonical dtype name ('float32', 'bfloat16', ...)
    shape        list of ints
    strides      list of ints, in elements; absent when C-contiguous
    offset       byte offset of the first element in the buffer; absent when 0
    fence        name of a fence to wait on before reading (publish(..., fence=...))
    fence_value  the value that fence reaches once the data is written
    state_dict   {'version', 'manifest': [offset, length], 'digest'}: a state dict (state_dict.py)
    ring         {'mode', 'slots', 'slot_size', 'kind', 'max_members', 'lease_ms', 'device'}: a ring's
                 geometry, in its NAME@meta buffer (ring.py), whose dtype and shape are its frames'

Everything else is the producer's own, round-tripped exactly by the msgpack package: ints of any
sign up to 64 bits, floats, None, bools, str, bytes, lists and nested maps (tuples arrive as lists).
"""
try:
    import msgpack
except ImportError as e:  # a --no-deps install, or a venv that does not see the distribution's
    raise ImportError('gpuipc needs the msgpack package: pip install msgpack, or on Debian and Ubuntu '
                      'apt install python3-msgpack and make the venv with --system-site-packages') from e

from . import dtypes
from .errors import MetadataError

MAX_BYTES = 4096
RESERVED = ('dtype', 'shape', 'strides', 'offset', 'fence', 'fence_value', 'state_dict', 'ring')


def pack(user, layout=None):
    """Encodes the user's map merged with gpuipc's layout keys; MetadataError if it is too large or a
    user key collides with a layout key that is set."""
    m = {}
    if user:
        if not isinstance(user, dict):
            raise TypeError(f'meta must be a dict, not {type(user).__name__}')
        m.update(user)
    for key, value in (layout or {}).items():
        if key in m:
            raise MetadataError(f"metadata key {key!r} is set by gpuipc for this buffer; choose another name")
        m[key] = value
    try:
        raw = msgpack.packb(m, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise MetadataError(f'cannot encode the metadata as msgpack: {e}') from None
    if len(raw) > MAX_BYTES:
        raise MetadataError(f'the metadata is {len(raw)} bytes encoded; the broker takes at most {MAX_BYTES} '
                            f'(large tables, such as a state dict manifest, belong in the buffer itself)')
    return raw


def unpack(raw):
    """Decodes a metadata map (any valid msgpack map, including a C producer's)."""
    if not raw:
        return {}
    try:
        m = msgpack.unpackb(raw, raw=False, strict_map_key=False, use_list=True)
    except Exception as e:  # msgpack raises several types for malformed input
        raise MetadataError(f'the buffer metadata is not valid msgpack: {e}') from None
    if not isinstance(m, dict):
        raise MetadataError(f'the buffer metadata is a msgpack {type(m).__name__}, not a map')
    return m


def layout(m):
    """(dtype, shape, strides, offset) that the layout keys of a metadata map give, None when it has
    none (no 'dtype'); MetadataError when a key is not of its type or the dtype is unknown. The
    values themselves (dimensions, extents) are checked where every view's are: arrays.check_layout."""
    if 'dtype' not in m:
        return None
    dtype = m['dtype']
    if type(dtype) is not str or dtype not in dtypes.ITEMSIZES:
        raise MetadataError(f'dtype {dtype!r:.40} is none of gpuipc\'s dtype names')
    shape, strides, offset = m.get('shape'), m.get('strides'), m.get('offset', 0)
    if shape is not None and type(shape) is not list:
        raise MetadataError(f'shape {shape!r:.80} is not a list')
    if strides is not None and type(strides) is not list:
        raise MetadataError(f'strides {strides!r:.80} is not a list')
    return dtype, shape, strides, offset
