"""gpuipc's exceptions: one class per cause, each keeping what the broker said.

Every libgpuipc failure becomes an instance of a subclass of `Error` chosen by the error's stable
name (``gpuipc_err_name()``: the broker's status names such as ``not-found``, the library's own
such as ``no-broker``, or the errno name such as ``EINVAL``). Where a built-in exception means the
same thing, the class derives from it too, so ``except TimeoutError`` or ``except PermissionError``
also work.
"""
import os

from . import _lib

__all__ = [
    'Error', 'NotFound', 'Timeout', 'Denied', 'Revoked', 'RingClosed', 'Overwritten', 'PidNamespace', 'Device',
    'NoBroker', 'NoCuda', 'Disconnected', 'CudaError', 'NameTaken', 'Quota', 'Busy', 'InvalidArgument',
    'StateError', 'KindError', 'GroupMismatch', 'ProtocolError', 'MetadataError', 'SystemCallError',
    'PoolClosed', 'SpansSegments', 'NotContiguous', 'UnsupportedDtype', 'NoVmm',
]


class Error(Exception):
    """A gpuipc failure.

    Attributes:
        code: the negative libgpuipc code (``GPUIPC_E_*`` or ``-errno``). A failure found in Python
            carries the library's code of the same meaning (InvalidArgument: ``E_INVALID``,
            StateError: ``E_STATE``, ...), or 0 where its class has none (``Error``, ``SystemCallError``).
        name: the code's stable short name (``gpuipc_err_name``: ``"not-found"``, ``"no-broker"``,
            ``"ENOENT"``, ``"invalid"``, ...; ``""`` with code 0).
        operation: what was being done, e.g. ``"attach 'weights/policy'"``.
        detail: what the broker (or libgpuipc) said about this failure (``gpuipc_errmsg``), may be empty.
        hint: libgpuipc's sentence naming the cause and the usual fix (``gpuipc_strerror``).
    """

    # The code a failure found in Python carries (set below, per class, once the codes are defined).
    _python_code = 0

    def __init__(self, message, code=0, operation='', detail='', hint='', name=''):
        super().__init__(message)
        if not code and not name:
            code = type(self)._python_code
            name = _CODE_NAMES.get(code, '')
        self.code, self.operation, self.detail, self.hint, self.name = code, operation, detail, hint, name


class NotFound(Error, LookupError):
    """Nothing is published under the name (or the buffer id is unknown)."""


class Timeout(Error, TimeoutError):
    """The wait ended before the buffer appeared, drained, or the group filled."""


class Denied(Error, PermissionError):
    """The broker's policy does not allow this uid/gid to do this with the name, or this peer is not the owner."""


class Revoked(Error):
    """The memory is gone: the buffer's (or ring's) producer died and it was not broker-held, or this
    ring member was evicted."""


class RingClosed(Revoked):
    """The ring's producer closed it: no frame will come any more (iterating a ring just stops)."""


class Overwritten(Revoked):
    """A ring frame changed while this member held it: the producer evicted the member, which held a
    backpressure ring up for longer than its lease. Whatever was read from the frame is suspect."""


class PidNamespace(Error):
    """The status brokers sent before same-pid ("pidns", no longer sent); kept so that code which
    catches it also catches SamePid."""


class SamePid(PidNamespace):
    """A cuda-legacy buffer between two processes with the same PID, each in its own PID namespace
    (both PID 1 of their containers, say): start one at another PID (gpuipcctl run -- CMD) or publish
    it as cuda-vmm."""


class Shm(Error):
    """A CUDA IPC-event fence between processes that see different /dev/shm: mount one emptyDir
    (medium: Memory) at /dev/shm in both, or use a counter fence."""


class Device(Error):
    """The buffer lives on a GPU this process cannot see (give both containers the same GPU)."""


class NoBroker(Error, ConnectionError):
    """Nothing listens on the socket: the broker is not running or the path is wrong."""


class Disconnected(Error, ConnectionError):
    """The broker went away (or is shutting down) during the call."""


class NoCuda(Error):
    """A CUDA kind was asked for, but libcuda.so.1 or a GPU is not usable in this process."""


class CudaError(Error):
    """A CUDA driver call failed; the message names it."""


class NameTaken(Error):
    """Another producer has a live buffer (or ring) under this name, or a buffer id is registered already."""


class Quota(Error):
    """A broker limit (buffers, fds, references, waits, subscriptions per uid or peer) was reached."""


class Busy(Error):
    """The buffer is still in use (attached or published)."""


class InvalidArgument(Error, ValueError):
    """A value the library or the broker does not accept (a bad name, size or option)."""


class StateError(Error):
    """The buffer is not in a state that allows this (e.g. published again before it drained)."""


class KindError(Error):
    """The buffer kind cannot do this (e.g. broker-held cuda-legacy, or a device without stream memory operations)."""


class GroupMismatch(Error):
    """The rendezvous group exists with another member count."""


class ProtocolError(Error):
    """Client and broker do not understand each other (a version skew or a broken connection)."""


class MetadataError(Error, ValueError):
    """A buffer's metadata is not what gpuipc expects (not msgpack, too large, or an inconsistent layout)."""


class PoolClosed(StateError):
    """The pool was closed (or its client): its memory may not be published or allocated any more."""


class SpansSegments(InvalidArgument):
    """The array lies across two segments of a pool: a view (one publication) lies in one segment.
    Allocate it in one piece (a pool's allocations never cross a segment), or publish it with a copy."""


class NotContiguous(InvalidArgument):
    """The array is a non-contiguous view, and what it is published as needs contiguous elements (a
    live state dict's entries): publish .contiguous(), or the state dict with copy=True."""


class UnsupportedDtype(InvalidArgument, TypeError):
    """The array's element type has no DLPack code gpuipc can carry (e.g. torch.complex32, a quantized
    type): consumers could not take it. Publish it converted, or its bytes as uint8."""


class NoVmm(KindError):
    """The device cannot make cuda-vmm memory or export it as a file descriptor, which a pool needs."""


class SystemCallError(Error, OSError):
    """A system call failed; ``errno`` holds its error number."""

    def __init__(self, message, code=0, operation='', detail='', hint='', name=''):
        super().__init__(message, code, operation, detail, hint, name)
        self.errno = -code if code < 0 else None


# libgpuipc's error codes, GPUIPC_E_* of client/gpuipc.h (its GPUIPC_ERRNO_MAP table), under the same
# names: the package's one copy of them. Every other module compares with these, never with a
# number; tests/python/abi.py checks them against the header, both ways.
E_BAD_REQUEST = -1001  # bad-request
E_PROTOCOL = -1002  # protocol
E_VERSION = -1003  # version
E_UNKNOWN_OP = -1004  # unknown-op
E_NOT_FOUND = -1005  # not-found
E_TIMEOUT = -1006  # timeout
E_NAME_TAKEN = -1007  # name-taken
E_QUOTA = -1008  # quota
E_DENIED = -1009  # denied
E_NOT_OWNER = -1010  # not-owner
E_NOT_ATTACHED = -1011  # not-attached
E_STATE = -1012  # state
E_BAD_FD = -1013  # bad-fd
E_PIDNS = -1014  # pidns
E_DEVICE = -1015  # device
E_GROUP_MISMATCH = -1016  # group-mismatch
E_REVOKED = -1017  # revoked
E_HELLO_FIRST = -1018  # hello-first
E_SHUTDOWN = -1019  # shutdown
E_KIND = -1020  # kind
E_INVALID = -1021  # invalid
E_KEY_TAKEN = -1022  # key-taken
E_SAME_PID = -1023  # same-pid
E_SHM = -1024  # shm
E_NO_BROKER = -1100  # no-broker
E_DISCONNECTED = -1101  # disconnected
E_NO_CUDA = -1102  # no-cuda
E_CUDA = -1103  # cuda
E_BUSY = -1104  # busy
E_BAD_REPLY = -1105  # bad-reply

# gpuipc_err_name() -> class: the broker's statuses (docs/protocol.md section 8), the library's own
# codes, and the errno names that have a class of their own (other errnos: SystemCallError).
_BY_NAME = {
    'bad-request': InvalidArgument, 'protocol': ProtocolError, 'version': ProtocolError,
    'unknown-op': ProtocolError, 'not-found': NotFound, 'timeout': Timeout, 'name-taken': NameTaken,
    'quota': Quota, 'denied': Denied, 'not-owner': Denied, 'not-attached': StateError, 'state': StateError,
    'bad-fd': ProtocolError, 'pidns': PidNamespace, 'device': Device, 'group-mismatch': GroupMismatch,
    'revoked': Revoked, 'hello-first': ProtocolError, 'shutdown': Disconnected, 'kind': KindError,
    'invalid': InvalidArgument, 'key-taken': NameTaken, 'same-pid': SamePid, 'shm': Shm,
    'no-broker': NoBroker, 'disconnected': Disconnected, 'no-cuda': NoCuda, 'cuda': CudaError, 'busy': Busy,
    'bad-reply': ProtocolError,
    'EINVAL': InvalidArgument, 'EACCES': Denied, 'EPERM': Denied, 'ETIMEDOUT': Timeout,
}


# The codes' names (gpuipc_err_name), for failures found in Python, which have no library to ask.
_CODE_NAMES = {
    E_BAD_REQUEST: 'bad-request', E_PROTOCOL: 'protocol', E_NOT_FOUND: 'not-found', E_TIMEOUT: 'timeout',
    E_NAME_TAKEN: 'name-taken', E_QUOTA: 'quota', E_DENIED: 'denied', E_STATE: 'state', E_DEVICE: 'device',
    E_GROUP_MISMATCH: 'group-mismatch', E_REVOKED: 'revoked', E_KIND: 'kind', E_INVALID: 'invalid',
    E_SAME_PID: 'same-pid', E_SHM: 'shm', E_NO_BROKER: 'no-broker', E_DISCONNECTED: 'disconnected',
    E_NO_CUDA: 'no-cuda', E_CUDA: 'cuda', E_BUSY: 'busy',
}
# Each class's code when Python raises it: the code of the same meaning that the library would have
# returned, so that code dispatching on .name or .code sees one vocabulary whoever found the failure.
# Subclasses inherit it (RingClosed is 'revoked', PoolClosed 'state', SpansSegments 'invalid').
for _cls, _code in ((InvalidArgument, E_INVALID), (MetadataError, E_INVALID), (NotFound, E_NOT_FOUND),
                    (Timeout, E_TIMEOUT), (Denied, E_DENIED), (Revoked, E_REVOKED), (SamePid, E_SAME_PID),
                    (Shm, E_SHM), (Device, E_DEVICE), (NoBroker, E_NO_BROKER), (Disconnected, E_DISCONNECTED),
                    (NoCuda, E_NO_CUDA), (CudaError, E_CUDA), (NameTaken, E_NAME_TAKEN), (Quota, E_QUOTA),
                    (Busy, E_BUSY), (StateError, E_STATE), (KindError, E_KIND), (GroupMismatch, E_GROUP_MISMATCH),
                    (ProtocolError, E_PROTOCOL)):
    _cls._python_code = _code
del _cls, _code


def err_name(code):
    """libgpuipc's stable name of a code (gpuipc_err_name)."""
    return (_lib.load().gpuipc_err_name(code) or b'').decode(errors='replace')


def class_for(code, name=None):
    """The exception class for a negative libgpuipc code (name: its gpuipc_err_name, looked up if None)."""
    cls = _BY_NAME.get(err_name(code) if name is None else name)
    if cls is not None:
        return cls
    return SystemCallError if -4096 < code < 0 else Error


def from_code(code, operation, detail, hint, name=None, cls=None):
    """The exception to raise for a failed call: 'operation: detail' (what happened, as the broker or
    libgpuipc said it), or 'operation: hint' when there is no detail. The hint, the cause in general
    and its fix, is not repeated in the message: it is `.hint`, and a note under the traceback
    (Python 3.11 and later show notes). cls: a subclass of the code's class that the caller knows
    fits better (e.g. RingClosed for a 'revoked')."""
    if name is None:
        name = err_name(code)
    if not hint and -4096 < code < 0:
        hint = os.strerror(-code)
    text = detail or hint or f'error {code}'
    e = (cls or class_for(code, name))(f'{operation}: {text}' if operation else text, code, operation, detail, hint,
                                       name)
    if detail and hint and hint != detail and hasattr(e, 'add_note'):
        e.add_note(f'hint: {hint}')
    return e
