"""What the broker says about itself, as gpuipcctl shows it: buffers, the peers holding them,
connected peers, the broker's statistics and this connection's own facts. Plain frozen dataclasses
made from libgpuipc's inspection structs (gpuipc_list_buffers, gpuipc_stat_buffer,
gpuipc_list_peers, gpuipc_stats, gpuipc_connection_info); `Client.buffers()`, `Client.stat()`,
`Client.peers()`, `Client.stats()` and `Client.connection_info()` return them.
"""
import dataclasses
from typing import Optional, Tuple


def _text(raw):
    return raw.decode(errors='replace')


def _gpus(n, table):
    return tuple(_text(table[i].value) for i in range(min(n, len(table))))


@dataclasses.dataclass(frozen=True)
class HolderInfo:
    """A peer holding references to a buffer: its broker id, pid (0: outside the broker's PID
    namespace), uid and how many references it holds."""

    # The package's internal interface to it: what other modules use, and why (tests/python/layers.py).
    _INTERNAL = {
        '_from_c': "made by the client from libgpuipc's struct",
    }

    peer: int
    pid: int
    uid: int
    refs: int

    @classmethod
    def _from_c(cls, h):
        return cls(h.peer, h.pid, h.uid, h.refs)


@dataclasses.dataclass(frozen=True)
class BufferInfo:
    """One registered buffer, as the broker describes it.

    id, generation, name: the buffer and its latest publication. kind: 'memfd', 'cuda-vmm',
    'cuda-legacy'. state: 'live' (attachable), 'retired' (waiting for the last release) or 'idle'
    (drained). refs, holders: references held and by how many peers. owner: the producer's peer id
    (0: it is gone; the buffer is broker-held). uid, pid: the producer's, from the kernel. device:
    the GPU's UUID (None for memfd, as gpuipcctl --json says null). held_by: the holders themselves
    (`Client.stat()` only; empty in listings). self_pid: for cuda-legacy, the producer's PID in its own PID namespace, which a
    consumer's must differ from (0: unknown or another kind).
    """

    # The package's internal interface to it: what other modules use, and why (tests/python/layers.py).
    _INTERNAL = {
        '_from_c': "made by the client from libgpuipc's struct",
    }

    id: int
    generation: int
    name: str
    kind: str
    state: str
    size: int
    refs: int
    holders: int
    owner: int
    uid: int
    pid: int
    device: Optional[str]
    writable: bool
    broker_held: bool
    held_by: Tuple[HolderInfo, ...] = ()
    self_pid: int = 0

    @classmethod
    def _from_c(cls, lib, b, held_by=()):
        return cls(b.buffer, b.generation, _text(b.name), _text(lib.gpuipc_kind_name(b.kind)),
                   _text(lib.gpuipc_state_name(b.state)), b.size, b.refs, b.holders, b.owner, b.uid, b.pid,
                   _text(b.device) or None, bool(b.writable), bool(b.broker_held), tuple(held_by), b.self_pid)


@dataclasses.dataclass(frozen=True)
class PeerInfo:
    """One connection to the broker: its id, pid/uid/gid from the kernel (pid 0: outside the broker's
    PID namespace), PID namespace (pidns_declared: only what the peer said), label, how many buffers
    it owns, references, subscriptions and waiting requests it has, when it connected (the broker's
    monotonic clock, ms), the GPU UUIDs it declared, its PID in its own PID namespace (self_pid: the
    kernel's where the broker sees it, else declared; cuda-legacy peers' must differ) and its /dev/shm
    (shm_dev, shm_ino, as declared; 0: not said)."""

    # The package's internal interface to it: what other modules use, and why (tests/python/layers.py).
    _INTERNAL = {
        '_from_c': "made by the client from libgpuipc's struct",
    }

    peer: int
    pid: int
    uid: int
    gid: int
    pidns: int
    pidns_declared: bool
    label: str
    buffers: int
    refs: int
    subs: int
    waits: int
    started_ms: int
    gpus: Tuple[str, ...]
    self_pid: int = 0
    shm_dev: int = 0
    shm_ino: int = 0

    @classmethod
    def _from_c(cls, p):
        return cls(p.peer, p.pid, p.uid, p.gid, p.pidns, bool(p.pidns_declared), _text(p.label), p.buffers, p.refs,
                   p.subs, p.waits, p.started_ms, _gpus(p.n_gpus, p.gpus), p.self_pid, p.shm_dev, p.shm_ino)


@dataclasses.dataclass(frozen=True)
class Stat:
    """One of the broker's counters, gauges or histogram series (docs/protocol.md, `stats`): name;
    status, the series' qualifier (request_errors_total: the reply status counted; shared_bytes and
    held_bytes: the buffer kind; uid_shared_bytes and uid_held_bytes: the uid in decimal; else '');
    le_us (a histogram bucket's upper bound in microseconds, else 0); value."""

    # The package's internal interface to it: what other modules use, and why (tests/python/layers.py).
    _INTERNAL = {
        '_from_c': "made by the client from libgpuipc's struct",
    }

    name: str
    status: str
    le_us: int
    value: int

    @classmethod
    def _from_c(cls, s):
        return cls(_text(s.name), _text(s.status), s.le_us, s.value)


@dataclasses.dataclass(frozen=True)
class ConnectionInfo:
    """What this connection knows about itself and its broker: its peer id (`gpuipcctl peers`), the
    broker instance's epoch (new after a restart), this process's PID namespace and whether the
    broker shares it (the broker then sees this process's PID itself), whether it is connected now,
    the socket path, the GPU UUIDs it declared, this process's own PID (cuda-legacy peers' must
    differ) and its /dev/shm (CUDA IPC events need the same on both sides)."""

    # The package's internal interface to it: what other modules use, and why (tests/python/layers.py).
    _INTERNAL = {
        '_from_c': "made by the client from libgpuipc's struct",
    }

    peer: int
    epoch: int
    pidns: int
    pidns_same: bool
    connected: bool
    socket_path: str
    gpus: Tuple[str, ...]
    self_pid: int = 0
    shm_dev: int = 0
    shm_ino: int = 0

    @classmethod
    def _from_c(cls, c):
        return cls(c.peer, c.epoch, c.pidns, bool(c.pidns_same), bool(c.connected), _text(c.socket_path),
                   _gpus(c.n_gpus, c.gpus), c.self_pid, c.shm_dev, c.shm_ino)
