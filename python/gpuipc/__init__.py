"""gpuipc for Python: share GPU and host memory zero-copy between processes and containers through a
gpuipc-broker, with PyTorch, JAX, CuPy and NumPy.

    # producer                                      # consumer (another process or container)
    import gpuipc                                   import gpuipc
    c = gpuipc.Client()                             c = gpuipc.Client()
    t = c.empty((1080, 1920, 3), 'uint8',           a = c.attach('frames/cam0', timeout_ms=5000)
                kind='cuda-vmm', device=0)          t = torch.from_dlpack(a)   # or a.torch(): no copy
    t.copy_(frame)                                  ... use t ...
    c.publish(t, 'frames/cam0')                     a.release()
    c.retire(t); c.wait_drained(t)

Frames through a ring, without a broker round trip per frame:

    with c.ring('cam0', shape=(480, 640, 3), dtype='uint8') as ring:      # producer
        ring.put(image)                                                   # or: with ring.acquire() as f: ...
    with c.join_ring('cam0') as ring:                                     # member
        for frame in ring:                                                # released when the next comes
            x = torch.from_dlpack(frame)

Tensors born shareable: allocate in a pool, publish without a copy:

    with c.pool(device=0) as pool:                  # torch's allocations go to gpuipc memory
        model = build()
    c.publish(model.lm_head.weight, 'head')         # a view: no copy, no export

Weights between a trainer and an inference engine:

    v = c.publish_state_dict(model.state_dict(), 'policy')          # trainer, every update
    sd = c.attach_state_dict('policy'); model.load_state_dict(sd, assign=True)   # inference

A thin ctypes layer over libgpuipc (bundled in the wheel); metadata through msgpack. See
docs/python.md for the whole API.
"""
from . import _lib
from ._version import __version__
from .buffer import KINDS, Attached, Buffer, View
from .client import Client
from .errors import (Busy, CudaError, Denied, Device, Disconnected, Error, GroupMismatch, InvalidArgument, KindError,
                     MetadataError, NameTaken, NoBroker, NoCuda, NotContiguous, NotFound, NoVmm, Overwritten,
                     PidNamespace, PoolClosed, ProtocolError, Quota, Revoked, RingClosed, SamePid, Shm, SpansSegments,
                     StateError, SystemCallError, Timeout, UnsupportedDtype)
from .events import Event, Subscription
from .fence import Fence
from .inspection import BufferInfo, ConnectionInfo, HolderInfo, PeerInfo, Stat
from .pool import Pool, PoolStats
from .ring import Frame, Ring
from .state_dict import StateDict, StateDictVersion


def library_path():
    """The libgpuipc file this process loaded (it is loaded by the first Client)."""
    _lib.load()
    return _lib.path()


def library_version():
    """The loaded libgpuipc's release ("MAJOR.MINOR.PATCH", gpuipc_version); the package refuses a
    library of another MAJOR.MINOR at load."""
    return _lib.version()


__all__ = [
    '__version__', 'Client', 'Buffer', 'Attached', 'View', 'StateDict', 'StateDictVersion', 'Event', 'Subscription',
    'Fence', 'Ring', 'Frame', 'BufferInfo', 'HolderInfo', 'PeerInfo', 'Stat', 'ConnectionInfo', 'KINDS',
    'library_path', 'library_version',
    'Error', 'NotFound', 'Timeout', 'Denied', 'Revoked', 'RingClosed', 'Overwritten', 'SamePid', 'Shm', 'PidNamespace',
    'Device',
    'NoBroker', 'NoCuda',
    'Disconnected', 'CudaError', 'NameTaken', 'Quota', 'Busy', 'InvalidArgument', 'StateError', 'KindError',
    'GroupMismatch', 'ProtocolError', 'MetadataError', 'SystemCallError',
    'Pool', 'PoolStats', 'PoolClosed', 'SpansSegments', 'NotContiguous', 'UnsupportedDtype', 'NoVmm',
]
