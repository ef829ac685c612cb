"""gpuipc's exceptions: one class per cause, each keeping what the broker said.

Every libgpuipc failure becomes an instance of a subclass of `Error` chosen by its code
(`GPUIPC_E_*` in client/gpuipc.h, or a negative errno). Where a built-in exception means the same
thing, the class derives from it too, so ``except TimeoutError`` or ``except PermissionError`` also
work.
"""
import errno as _errno
import os

__all__ = [
    'Error', 'NotFound', 'Timeout', 'Denied', 'Revoked', 'PidNamespace', 'Device', 'NoBroker', 'NoCuda',
    'Disconnected', 'CudaError', 'NameTaken', 'Quota', 'Busy', 'InvalidArgument', 'StateError', 'KindError',
    'GroupMismatch', 'ProtocolError', 'MetadataError', 'SystemCallError',
]


class Error(Exception):
    """A gpuipc failure.

    Attributes:
        code: the negative libgpuipc code (``GPUIPC_E_*`` or ``-errno``; 0 for failures found in Python).
        operation: what was being done, e.g. ``"attach 'weights/policy'"``.
        detail: what the broker (or libgpuipc) said about this failure (``gpuipc_errmsg``), may be empty.
        hint: libgpuipc's sentence naming the cause and the usual fix (``gpuipc_strerror``).
    """

    def __init__(self, message, code=0, operation='', detail='', hint=''):
        super().__init__(message)
        self.code, self.operation, self.detail, self.hint = code, operation, detail, hint


class NotFound(Error, LookupError):
    """Nothing is published under the name (or the buffer id is unknown)."""


class Timeout(Error, TimeoutError):
    """The wait ended before the buffer appeared, drained, or the group filled."""


class Denied(Error, PermissionError):
    """The broker's policy does not allow this uid/gid to do this with the name, or this peer is not the owner."""


class Revoked(Error):
    """The buffer's memory is gone: its producer died and it was not published broker-held."""


class PidNamespace(Error):
    """A cuda-legacy buffer between processes in different PID namespaces (publish it as cuda-vmm)."""


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
    """Another producer has a live buffer under this name."""


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


class SystemCallError(Error, OSError):
    """A system call failed; ``errno`` holds its error number."""

    def __init__(self, message, code=0, operation='', detail='', hint=''):
        super().__init__(message, code, operation, detail, hint)
        self.errno = -code if code < 0 else None


# GPUIPC_E_* codes (client/gpuipc.h) -> class
_BY_CODE = {
    -1001: InvalidArgument,  # BAD_REQUEST
    -1002: ProtocolError,    # PROTOCOL
    -1003: ProtocolError,    # VERSION
    -1004: ProtocolError,    # UNKNOWN_OP
    -1005: NotFound,
    -1006: Timeout,
    -1007: NameTaken,
    -1008: Quota,
    -1009: Denied,
    -1010: Denied,           # NOT_OWNER
    -1011: StateError,       # NOT_ATTACHED
    -1012: StateError,
    -1013: ProtocolError,    # BAD_FD
    -1014: PidNamespace,
    -1015: Device,
    -1016: GroupMismatch,
    -1017: Revoked,
    -1018: ProtocolError,    # HELLO_FIRST
    -1019: Disconnected,     # SHUTDOWN
    -1020: KindError,
    -1021: InvalidArgument,  # INVALID
    -1100: NoBroker,
    -1101: Disconnected,
    -1102: NoCuda,
    -1103: CudaError,
    -1104: Busy,
    -1105: ProtocolError,    # BAD_REPLY
}


def class_for(code):
    """The exception class for a negative libgpuipc code."""
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls
    if code == -_errno.EINVAL:
        return InvalidArgument
    if code in (-_errno.EACCES, -_errno.EPERM):
        return Denied
    if code == -_errno.ETIMEDOUT:
        return Timeout
    return SystemCallError if -4096 < code < 0 else Error


def from_code(code, operation, detail, hint):
    """The exception to raise for a failed call: 'operation: detail (hint)'."""
    if not hint and -4096 < code < 0:
        hint = os.strerror(-code)
    text = f'{detail} ({hint})' if detail and hint and detail != hint else (detail or hint or f'error {code}')
    return class_for(code)(f'{operation}: {text}' if operation else text, code, operation, detail, hint)
