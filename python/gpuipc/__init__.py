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

Weights between a trainer and an inference engine:

    v = c.publish_state_dict(model.state_dict(), 'policy')          # trainer, every update
    sd = c.attach_state_dict('policy'); model.load_state_dict(sd, assign=True)   # inference

A thin ctypes layer over libgpuipc (bundled in the wheel); metadata through msgpack. See
docs/python.md for the whole API.
"""
from ._version import __version__
from .buffer import KINDS, Attached, Buffer, View
from .client import Client
from .errors import (Busy, CudaError, Denied, Device, Disconnected, Error, GroupMismatch, InvalidArgument, KindError,
                     MetadataError, NameTaken, NoBroker, NoCuda, NotFound, PidNamespace, ProtocolError, Quota, Revoked,
                     StateError, SystemCallError, Timeout)
from .events import Event, Subscription
from .fence import Fence
from .state_dict import StateDict, StateDictVersion


def library_path():
    """The libgpuipc file this process loaded (it is loaded by the first Client)."""
    from . import _lib
    _lib.load()
    return _lib.path()


__all__ = [
    '__version__', 'Client', 'Buffer', 'Attached', 'View', 'StateDict', 'StateDictVersion', 'Event', 'Subscription',
    'Fence', 'KINDS', 'library_path',
    'Error', 'NotFound', 'Timeout', 'Denied', 'Revoked', 'PidNamespace', 'Device', 'NoBroker', 'NoCuda',
    'Disconnected', 'CudaError', 'NameTaken', 'Quota', 'Busy', 'InvalidArgument', 'StateError', 'KindError',
    'GroupMismatch', 'ProtocolError', 'MetadataError', 'SystemCallError',
]
