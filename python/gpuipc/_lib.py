"""Finds and loads libgpuipc and declares the C functions' signatures (client/gpuipc.h) for ctypes.

The library is looked up in this order:

1. ``$GPUIPC_LIBRARY``, when set: exactly that file (development trees and tests use it);
2. ``libgpuipc.so`` inside this package, where the wheel puts it;
3. the system's ``libgpuipc.so.0`` (a ``meson install`` of the C library).

A library of another release than this package is refused at load (``gpuipc_version()``): the
structures below mirror gpuipc.h of this release, and a skew would misread them silently.
"""
import ctypes
import os
import threading

from ._version import __version__

_HERE = os.path.dirname(os.path.abspath(__file__))

_p, _i, _u, _u64, _sz, _s = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_size_t,
                             ctypes.c_char_p)
_pp = ctypes.POINTER(ctypes.c_void_p)


class _Sized(ctypes.Structure):
    """An options struct whose first field, struct_size, tells the C side how much of it this release
    knows; it is filled in here, and the other fields are given as before (by position or name)."""

    def __init__(self, *args, **kwargs):
        super().__init__(ctypes.sizeof(self), *args, **kwargs)


class Options(_Sized):
    """gpuipc_options_t."""
    _fields_ = [('struct_size', ctypes.c_size_t), ('socket_path', ctypes.c_char_p), ('label', ctypes.c_char_p),
                ('connect_timeout_ms', ctypes.c_int), ('no_reconnect', ctypes.c_int), ('no_gpus', ctypes.c_int)]


class PublishOptions(_Sized):
    """gpuipc_publish_options_t."""
    _fields_ = [('struct_size', ctypes.c_size_t), ('writable', ctypes.c_int), ('broker_held', ctypes.c_int),
                ('retire_after', ctypes.c_uint), ('meta', ctypes.c_void_p), ('meta_len', ctypes.c_size_t),
                ('no_sync', ctypes.c_int)]


class Event(ctypes.Structure):
    """gpuipc_event_t."""
    _fields_ = [('type', ctypes.c_int), ('subscription', ctypes.c_uint64), ('buffer', ctypes.c_uint64),
                ('generation', ctypes.c_uint64), ('kind', ctypes.c_int), ('name', ctypes.c_char * 256),
                ('reason', ctypes.c_char * 256)]


_MAX_NAME, _MAX_LABEL, _MAX_UUID, _MAX_GPUS = 255, 64, 64, 64
MAX_PAGE = 1024  # GPUIPC_MAX_PAGE: records the broker sends at most in one page
MAX_BUFFER_SIZE = 1 << 62  # GPUIPC_MAX_BUFFER_SIZE: the most bytes any buffer may have
SIZE_MAX = 2 ** (8 * ctypes.sizeof(ctypes.c_size_t)) - 1  # what a size_t argument holds (more would wrap)


class RingOptions(ctypes.Structure):
    """gpuipc_ring_options_t (struct_size first: the C side reads only what this release knows)."""
    _fields_ = [('struct_size', ctypes.c_size_t), ('kind', ctypes.c_int), ('slot_size', ctypes.c_size_t),
                ('slots', ctypes.c_uint), ('max_members', ctypes.c_uint), ('device', ctypes.c_int),
                ('mode', ctypes.c_int), ('lease_ms', ctypes.c_uint)]


class BufferInfo(ctypes.Structure):
    """gpuipc_buffer_info_t."""
    _fields_ = [('buffer', _u64), ('generation', _u64), ('name', ctypes.c_char * (_MAX_NAME + 1)),
                ('kind', ctypes.c_int), ('state', ctypes.c_int), ('size', _u64), ('refs', _u64), ('holders', _u64),
                ('owner', _u64), ('uid', _u64), ('pid', _u64), ('device', ctypes.c_char * (_MAX_UUID + 1)),
                ('writable', ctypes.c_int), ('broker_held', ctypes.c_int), ('self_pid', _u64)]


class HolderInfo(ctypes.Structure):
    """gpuipc_holder_info_t."""
    _fields_ = [('peer', _u64), ('pid', _u64), ('uid', _u64), ('refs', _u64)]


class PeerInfo(ctypes.Structure):
    """gpuipc_peer_info_t."""
    _fields_ = [('peer', _u64), ('pid', _u64), ('uid', _u64), ('gid', _u64), ('pidns', _u64),
                ('pidns_declared', ctypes.c_int), ('label', ctypes.c_char * (_MAX_LABEL + 1)), ('buffers', _u64),
                ('refs', _u64), ('subs', _u64), ('waits', _u64), ('started_ms', _u64), ('n_gpus', ctypes.c_uint),
                ('gpus', (ctypes.c_char * (_MAX_UUID + 1)) * _MAX_GPUS), ('self_pid', _u64), ('shm_dev', _u64),
                ('shm_ino', _u64)]


class Stat(ctypes.Structure):
    """gpuipc_stat_t."""
    _fields_ = [('name', ctypes.c_char * (_MAX_NAME + 1)), ('status', ctypes.c_char * 32), ('le_us', _u64),
                ('value', _u64)]


class ConnectionInfo(ctypes.Structure):
    """gpuipc_connection_info_t."""
    _fields_ = [('peer', _u64), ('epoch', _u64), ('pidns', _u64), ('pidns_same', ctypes.c_int),
                ('connected', ctypes.c_int), ('socket_path', ctypes.c_char * 108), ('n_gpus', ctypes.c_uint),
                ('gpus', (ctypes.c_char * (_MAX_UUID + 1)) * _MAX_GPUS), ('self_pid', _u64), ('shm_dev', _u64),
                ('shm_ino', _u64)]


class PoolOptions(_Sized):
    """gpuipc_pool_options_t."""
    _fields_ = [('struct_size', ctypes.c_size_t), ('kind', ctypes.c_int), ('device', ctypes.c_int),
                ('segment_size', ctypes.c_size_t), ('max_segment_size', ctypes.c_size_t), ('reserve', ctypes.c_size_t),
                ('writable', ctypes.c_int), ('broker_held', ctypes.c_int)]


class PoolStats(ctypes.Structure):
    """gpuipc_pool_stats_t."""
    _fields_ = [('segments', _sz), ('reserved', _sz), ('allocated', _sz), ('deferred', _sz), ('views', _sz),
                ('exports', _sz)]


class Copy(ctypes.Structure):
    """gpuipc_copy_t."""
    _fields_ = [('src', _u64), ('offset', _sz), ('len', _sz)]


_pu64 = ctypes.POINTER(_u64)

# name: (result type, argument types)
_SIGNATURES = {
    'gpuipc_version': (_s, []),
    'gpuipc_err_name': (_s, [_i]),
    'gpuipc_strerror': (_s, [_i]),
    'gpuipc_connect': (_i, [_pp, ctypes.POINTER(Options)]),
    'gpuipc_close': (None, [_p]),
    'gpuipc_abandon': (None, [_p]),
    'gpuipc_ping': (_i, [_p, _i]),
    'gpuipc_errmsg': (_s, [_p]),
    'gpuipc_buffer_alloc': (_i, [_p, _i, _sz, _i, _pp]),
    'gpuipc_buffer_wrap_cuda': (_i, [_p, _u64, _sz, _pp]),
    'gpuipc_publish': (_i, [_p, _p, _s, ctypes.POINTER(PublishOptions)]),
    'gpuipc_retire': (_i, [_p, _p]),
    'gpuipc_wait_drained': (_i, [_p, _p, _i]),
    'gpuipc_attach': (_i, [_p, _s, _i, _pp]),
    'gpuipc_attach_id': (_i, [_p, _u64, _pp]),
    'gpuipc_release': (_i, [_p, _p]),
    'gpuipc_cache_trim': (None, [_p]),
    'gpuipc_set_device': (_i, [_p, _i]),
    'gpuipc_buffer_read': (_i, [_p, _sz, _p, _sz]),
    'gpuipc_buffer_write': (_i, [_p, _sz, _p, _sz]),
    'gpuipc_buffer_free': (_i, [_p, _p]),
    'gpuipc_buffer_ptr': (_p, [_p]),
    'gpuipc_buffer_size': (_sz, [_p]),
    'gpuipc_buffer_kind': (_i, [_p]),
    'gpuipc_buffer_id': (_u64, [_p]),
    'gpuipc_buffer_generation': (_u64, [_p]),
    'gpuipc_buffer_name': (_s, [_p]),
    'gpuipc_buffer_device': (_s, [_p]),
    'gpuipc_buffer_device_ordinal': (_i, [_p]),
    'gpuipc_buffer_writable': (_i, [_p]),
    'gpuipc_buffer_meta': (_p, [_p, ctypes.POINTER(_sz)]),
    'gpuipc_buffer_revoked': (_i, [_p]),
    'gpuipc_subscribe': (_i, [_p, _s, ctypes.POINTER(_u64)]),
    'gpuipc_unsubscribe': (_i, [_p, _u64]),
    'gpuipc_next_event': (_i, [_p, _i, ctypes.POINTER(Event)]),
    'gpuipc_fd': (_i, [_p]),
    'gpuipc_process': (_i, [_p]),
    'gpuipc_fence_create': (_i, [_p, _s, _i, _pp]),
    'gpuipc_fence_create_ipc_event': (_i, [_p, _s, _i, _pp]),
    'gpuipc_fence_open': (_i, [_p, _s, _i, _pp]),
    'gpuipc_fence_signal': (_i, [_p, _p, _u64]),
    'gpuipc_fence_wait': (_i, [_p, _p, _u64]),
    'gpuipc_fence_value': (_i, [_p, ctypes.POINTER(_u64)]),
    'gpuipc_fence_close': (None, [_p]),
    'gpuipc_group_join': (_i, [_p, _s, _u, _i]),
    'gpuipc_list_buffers': (_i, [_p, _s, _pu64, ctypes.POINTER(BufferInfo), _sz]),
    'gpuipc_list_peers': (_i, [_p, _pu64, ctypes.POINTER(PeerInfo), _sz]),
    'gpuipc_stat_buffer': (_i, [_p, _s, _u64, ctypes.POINTER(HolderInfo), _sz, ctypes.POINTER(BufferInfo)]),
    'gpuipc_retire_id': (_i, [_p, _u64]),
    'gpuipc_stats': (_i, [_p, ctypes.POINTER(Stat), _sz]),
    'gpuipc_connection_info': (_i, [_p, ctypes.POINTER(ConnectionInfo)]),
    'gpuipc_kind_name': (_s, [_i]),
    'gpuipc_state_name': (_s, [_i]),
    'gpuipc_ring_create': (_i, [_p, _s, ctypes.POINTER(RingOptions), _pp]),
    'gpuipc_ring_join': (_i, [_p, _s, _i, _pp]),
    'gpuipc_ring_acquire': (_i, [_p, _i, _pp]),
    'gpuipc_ring_publish': (_i, [_p, _pu64]),
    'gpuipc_ring_take': (_i, [_p, _i, _pp, _pu64]),
    'gpuipc_ring_release': (_i, [_p]),
    'gpuipc_ring_fd': (_i, [_p]),
    'gpuipc_ring_closed': (_i, [_p]),
    'gpuipc_ring_set_spin': (None, [_p, _u]),
    'gpuipc_ring_close': (None, [_p]),
    'gpuipc_buffer_view': (_i, [_p, _p, _sz, _sz, _pp]),
    'gpuipc_buffer_segment': (_u64, [_p]),
    'gpuipc_buffer_copy_in': (_i, [_p, ctypes.POINTER(Copy), _sz, _p]),
    'gpuipc_pool_new': (_i, [_p, ctypes.POINTER(PoolOptions), _pp]),
    'gpuipc_pool_alloc': (_i, [_p, _sz, _pp]),
    'gpuipc_pool_free': (_i, [_p, _p]),
    'gpuipc_pool_view': (_i, [_p, _p, _sz, _pp]),
    'gpuipc_pool_segment': (_i, [_p, _p, _pp, ctypes.POINTER(_sz)]),
    'gpuipc_pool_segments': (_i, [_p, _pp, ctypes.POINTER(_sz), _sz]),
    'gpuipc_pool_trim': (_i, [_p]),
    'gpuipc_pool_stats': (_i, [_p, ctypes.POINTER(PoolStats)]),
    'gpuipc_pool_close': (_i, [_p]),
    'gpuipc_pool_use': (_p, [_p]),
}

# Declared in gpuipc.h but possibly not in every library of this release yet: bound when present
# (has() says so), and the calls that need them say what is missing.
_OPTIONAL = {
    'gpuipc_ring_stream_acquire': (_i, [_p, _p, _i, _pp]),
    'gpuipc_ring_stream_publish': (_i, [_p, _p, _pu64]),
    'gpuipc_ring_stream_take': (_i, [_p, _p, _i, _pp, _pu64]),
    'gpuipc_ring_stream_release': (_i, [_p, _p]),
}

_lib = None
_lib_path = None
_load_lock = threading.Lock()


def candidates():
    """The paths tried, in order (see the module's docstring)."""
    env = os.environ.get('GPUIPC_LIBRARY')
    if env:
        return [env]
    return [os.path.join(_HERE, 'libgpuipc.so'), 'libgpuipc.so.0']


def load():
    """The loaded libgpuipc (loaded once per process). Raises OSError naming every place tried."""
    global _lib, _lib_path
    with _load_lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in candidates():
            if os.sep in path and not os.path.exists(path):
                tried.append(f'{path} (absent)')
                continue
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                tried.append(f'{path} ({e})')
                continue
            _check_release(lib, path)
            for name, (res, args) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = res, args
            for name, (res, args) in _OPTIONAL.items():
                fn = getattr(lib, name, None)
                if fn is not None:
                    fn.restype, fn.argtypes = res, args
            _lib, _lib_path = lib, path
            return lib
        raise OSError('gpuipc: cannot load libgpuipc; tried ' + '; '.join(tried) +
                      '. Install the gpuipc wheel (pip install gpuipc), or set GPUIPC_LIBRARY to a libgpuipc.so')


def compatible(library_version, package_version=__version__):
    """True when a libgpuipc of `library_version` ("MAJOR.MINOR.PATCH") fits this package: the same
    MAJOR.MINOR (the patch level may differ: it changes no structure or signature)."""
    return library_version.split('.')[:2] == package_version.split('.')[:2]


def _check_release(lib, path):
    """Refuses a library of another release (OSError naming both versions and the fix)."""
    fn = getattr(lib, 'gpuipc_version', None)
    if fn is None:
        raise OSError(f'gpuipc: {path} predates gpuipc_version() (this package is {__version__}); install '
                      f'libgpuipc {__version__}, or unset GPUIPC_LIBRARY to use the one in the package')
    fn.restype, fn.argtypes = _s, []
    version = (fn() or b'').decode(errors='replace')
    if not compatible(version):
        raise OSError(f'gpuipc: {path} is libgpuipc {version}, but this package is {__version__}: their '
                      f'structures may differ; install libgpuipc {__version__}, or unset GPUIPC_LIBRARY to use '
                      f'the one in the package')
    missing = [name for name in _SIGNATURES if not hasattr(lib, name)]
    if missing:
        raise OSError(f'gpuipc: {path} (libgpuipc {version}) lacks {", ".join(missing)}; rebuild it from the '
                      f'same source as this package')


def has(name):
    """True if the loaded library has the optional function `name` (see _OPTIONAL)."""
    return name in _OPTIONAL and hasattr(load(), name)


def version():
    """The loaded libgpuipc's version string."""
    return load().gpuipc_version().decode()


def path():
    """The file libgpuipc was loaded from (None before the first load). For the system's soname
    this is what the dynamic linker found, read from /proc/self/maps."""
    if _lib_path is None or os.sep in _lib_path:
        return _lib_path
    try:
        with open('/proc/self/maps') as f:
            for line in f:
                fields = line.split(None, 5)
                if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith('libgpuipc.so'):
                    return fields[5].strip()
    except OSError:
        pass
    return _lib_path
