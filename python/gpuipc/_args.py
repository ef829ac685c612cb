"""Arguments checked in Python before they reach ctypes, which would pass them on changed: a str with
a NUL cut short by C, an int too large for a size_t wrapped (1 << 64 becomes 0), a negative
dimension turned into NumPy's ValueError. Each is refused here as gpuipc.InvalidArgument."""
import operator

from . import _lib, errors


def text_bytes(text, what, empty_ok=False):
    """text as the C string libgpuipc gets: UTF-8, refused (InvalidArgument) where C would see another
    string: a NUL inside it would end the name there (publishing 'x' for 'x\\0y'), and a lone
    surrogate has no UTF-8 at all."""
    if not isinstance(text, str) or not (text or empty_ok):
        raise errors.InvalidArgument(f"the {what} must be a {'' if empty_ok else 'non-empty '}string, not {text!r}")
    if '\0' in text:
        raise errors.InvalidArgument(f'the {what} {text!r} contains a NUL character, which would end it there')
    try:
        return text.encode()
    except UnicodeEncodeError as e:
        raise errors.InvalidArgument(f'the {what} {text!r} is not valid UTF-8: {e.reason}') from None


def shape_arg(shape):
    """shape as a tuple of ints, each 0 or more (InvalidArgument, not NumPy's ValueError or a
    TypeError, for anything else)."""
    try:
        dims = (operator.index(shape),)
    except TypeError:
        try:
            dims = tuple(operator.index(x) for x in shape)
        except TypeError:
            raise errors.InvalidArgument(f'a shape is an int or a sequence of ints, not {shape!r}') from None
    if any(d < 0 for d in dims):
        raise errors.InvalidArgument(f'a shape has no negative sizes: {shape!r}')
    return dims


def size_arg(n, what, minimum=1):
    """n as a size_t argument: an int from minimum (1: a buffer's size; 0: an option whose 0 means the
    default) to SIZE_MAX, checked here because ctypes would wrap a larger one silently (1 << 64
    becomes 0). The library holds a buffer's size to its own limit after that."""
    try:
        n = operator.index(n)
    except TypeError:
        raise errors.InvalidArgument(f'{what} must be an integer, not {n!r}') from None
    if n < minimum:
        raise errors.InvalidArgument(f'{what}: a buffer needs at least one byte' if minimum else
                                     f'{what} must not be negative, not {n}')
    if n > _lib.SIZE_MAX:
        raise errors.InvalidArgument(f'{what}: more than any buffer may hold (at most {_lib.MAX_BUFFER_SIZE} '
                                     f'bytes, GPUIPC_MAX_BUFFER_SIZE)')
    return n
