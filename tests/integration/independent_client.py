#!/usr/bin/env python3
"""An independent gpuipc client, written from docs/protocol.md alone (standard library only).

It proves that the protocol document is enough to talk to the broker: it builds frames and
msgpack bodies by hand, passes a sealed memfd with SCM_RIGHTS, and checks replies, events and
error statuses against what the document promises.

Usage: independent_client.py [SOCKET]   (default: $GPUIPC_SOCKET)
If $GPUIPC_BROKER names the broker binary, it also starts a broker of its own on a temporary socket
to see a connection refused by the connection quota and what a stopping broker sends (it stops that
broker itself with SIGTERM; the broker at SOCKET is never stopped).
Exit status: 0 success, 1 a check failed, 77 something this test needs is missing.
"""

import array
import errno
import fcntl
import mmap
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

SKIP = 77

# ---- constants from docs/protocol.md ----

MAGIC = b"GIPC"
VERSION = 1
HEADER = struct.Struct("<4sBB2xI")  # magic, version, n_fds, reserved (zero), body_len (LE)
MAX_BODY = 65536
MAX_FRAME = HEADER.size + MAX_BODY

F_ADD_SEALS = 1033
F_GET_SEALS = 1034
F_SEAL_SEAL = 0x1
F_SEAL_SHRINK = 0x2
F_SEAL_GROW = 0x4
F_SEAL_FUTURE_WRITE = 0x10

STATUS = {
    0: "ok", 1: "bad-request", 2: "protocol", 3: "version", 4: "unknown-op", 5: "not-found",
    6: "timeout", 7: "name-taken", 8: "quota", 9: "denied", 10: "not-owner", 11: "not-attached",
    12: "state", 13: "bad-fd", 14: "pidns", 15: "device", 16: "group-mismatch", 17: "revoked",
    18: "hello-first", 19: "shutdown", 20: "kind", 21: "invalid",
}
CODE = {name: code for code, name in STATUS.items()}

TIMEOUT_S = 5.0


# ---- a minimal msgpack codec ----

class Ext:
    """An ext value, kept opaque."""

    def __init__(self, type_, data):
        self.type, self.data = type_, data


class Pairs(list):
    """A map written as its (key, value) pairs, in this order; a key may appear twice."""


class RawStr(bytes):
    """A msgpack str whose bytes are sent as they are (to send text that is not UTF-8)."""


def mp_encode(v):
    """Encodes v (None, bool, int, str, bytes, list, tuple, dict) in the shortest msgpack form."""
    out = bytearray()
    _enc(v, out)
    return bytes(out)


def _enc(v, out):
    if v is None:
        out.append(0xC0)
    elif v is True:
        out.append(0xC3)
    elif v is False:
        out.append(0xC2)
    elif isinstance(v, int):
        if 0 <= v <= 0x7F:
            out.append(v)
        elif 0 <= v <= 0xFF:
            out += b"\xcc" + struct.pack(">B", v)
        elif 0 <= v <= 0xFFFF:
            out += b"\xcd" + struct.pack(">H", v)
        elif 0 <= v <= 0xFFFFFFFF:
            out += b"\xce" + struct.pack(">I", v)
        elif 0 <= v <= 0xFFFFFFFFFFFFFFFF:
            out += b"\xcf" + struct.pack(">Q", v)
        elif -32 <= v < 0:
            out += struct.pack(">b", v)
        elif -0x80 <= v < 0:
            out += b"\xd0" + struct.pack(">b", v)
        elif -0x8000 <= v < 0:
            out += b"\xd1" + struct.pack(">h", v)
        elif -0x80000000 <= v < 0:
            out += b"\xd2" + struct.pack(">i", v)
        elif -0x8000000000000000 <= v < 0:
            out += b"\xd3" + struct.pack(">q", v)
        else:
            raise ValueError("integer out of msgpack range")
    elif isinstance(v, (str, RawStr)):
        b = bytes(v) if isinstance(v, RawStr) else v.encode("utf-8")
        n = len(b)
        if n <= 31:
            out.append(0xA0 | n)
        elif n <= 0xFF:
            out += b"\xd9" + struct.pack(">B", n)
        elif n <= 0xFFFF:
            out += b"\xda" + struct.pack(">H", n)
        else:
            out += b"\xdb" + struct.pack(">I", n)
        out += b
    elif isinstance(v, (bytes, bytearray)):
        n = len(v)
        if n <= 0xFF:
            out += b"\xc4" + struct.pack(">B", n)
        elif n <= 0xFFFF:
            out += b"\xc5" + struct.pack(">H", n)
        else:
            out += b"\xc6" + struct.pack(">I", n)
        out += v
    elif isinstance(v, (list, tuple)) and not isinstance(v, Pairs):
        n = len(v)
        if n <= 15:
            out.append(0x90 | n)
        elif n <= 0xFFFF:
            out += b"\xdc" + struct.pack(">H", n)
        else:
            out += b"\xdd" + struct.pack(">I", n)
        for x in v:
            _enc(x, out)
    elif isinstance(v, (dict, Pairs)):
        n = len(v)
        if n <= 15:
            out.append(0x80 | n)
        elif n <= 0xFFFF:
            out += b"\xde" + struct.pack(">H", n)
        else:
            out += b"\xdf" + struct.pack(">I", n)
        for k, x in (v if isinstance(v, Pairs) else v.items()):
            _enc(k, out)
            _enc(x, out)
    else:
        raise TypeError("cannot encode %r" % type(v))


class MpError(Exception):
    pass


def mp_decode(data):
    """Decodes exactly one msgpack value that fills data."""
    v, pos = _dec(memoryview(data), 0, 0)
    if pos != len(data):
        raise MpError("%d trailing bytes" % (len(data) - pos))
    return v


def _take(buf, pos, n):
    if pos + n > len(buf):
        raise MpError("truncated")
    return bytes(buf[pos:pos + n]), pos + n


def _dec(buf, pos, depth):
    if depth > 64:
        raise MpError("nested too deeply")
    t, pos = _take(buf, pos, 1)
    t = t[0]
    if t <= 0x7F:
        return t, pos
    if t >= 0xE0:
        return t - 0x100, pos
    if 0x80 <= t <= 0x8F:
        return _map(buf, pos, t & 0x0F, depth)
    if 0x90 <= t <= 0x9F:
        return _arr(buf, pos, t & 0x0F, depth)
    if 0xA0 <= t <= 0xBF:
        b, pos = _take(buf, pos, t & 0x1F)
        return _text(b), pos
    if t == 0xC0:
        return None, pos
    if t == 0xC2:
        return False, pos
    if t == 0xC3:
        return True, pos
    fixed = {
        0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q",
        0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q",
        0xCA: ">f", 0xCB: ">d",
    }
    if t in fixed:
        fmt = fixed[t]
        b, pos = _take(buf, pos, struct.calcsize(fmt))
        return struct.unpack(fmt, b)[0], pos
    if t in (0xD9, 0xDA, 0xDB, 0xC4, 0xC5, 0xC6):
        width = {0xD9: ">B", 0xDA: ">H", 0xDB: ">I", 0xC4: ">B", 0xC5: ">H", 0xC6: ">I"}[t]
        b, pos = _take(buf, pos, struct.calcsize(width))
        n = struct.unpack(width, b)[0]
        b, pos = _take(buf, pos, n)
        return (_text(b) if t >= 0xD9 else b), pos
    if t in (0xDC, 0xDD, 0xDE, 0xDF):
        width = ">H" if t in (0xDC, 0xDE) else ">I"
        b, pos = _take(buf, pos, struct.calcsize(width))
        n = struct.unpack(width, b)[0]
        return (_arr if t in (0xDC, 0xDD) else _map)(buf, pos, n, depth)
    if t in (0xD4, 0xD5, 0xD6, 0xD7, 0xD8):
        n = 1 << (t - 0xD4)
        b, pos = _take(buf, pos, 1 + n)
        return Ext(struct.unpack(">b", b[:1])[0], b[1:]), pos
    if t in (0xC7, 0xC8, 0xC9):
        width = {0xC7: ">B", 0xC8: ">H", 0xC9: ">I"}[t]
        b, pos = _take(buf, pos, struct.calcsize(width))
        n = struct.unpack(width, b)[0]
        b, pos = _take(buf, pos, 1 + n)
        return Ext(struct.unpack(">b", b[:1])[0], b[1:]), pos
    raise MpError("byte 0x%02x is not msgpack" % t)


def _text(b):
    """Every string the broker sends is valid UTF-8 (section 3.1)."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MpError("a string is not valid UTF-8: %s" % e)


def _map(buf, pos, n, depth):
    if 2 * n > len(buf) - pos:
        raise MpError("map count larger than the data")
    m = {}
    for _ in range(n):
        k, pos = _dec(buf, pos, depth + 1)
        v, pos = _dec(buf, pos, depth + 1)
        if not isinstance(k, str):
            raise MpError("a key is not a string")
        if k in m:
            raise MpError("duplicate key %r" % k)
        m[k] = v
    return m, pos


def _arr(buf, pos, n, depth):
    if n > len(buf) - pos:
        raise MpError("array count larger than the data")
    a = []
    for _ in range(n):
        v, pos = _dec(buf, pos, depth + 1)
        a.append(v)
    return a, pos


# ---- frames ----

def frame(body_map, n_fds=0):
    body = mp_encode(body_map)
    if len(body) > MAX_BODY:
        raise ValueError("body too large")
    return HEADER.pack(MAGIC, VERSION, n_fds, len(body)) + body


ID = object()  # placeholder for the request id in Conn.send_pairs


class ProtocolError(Exception):
    pass


class Closed(Exception):
    pass


class Conn:
    """One connection: requests with ids, replies matched by id, events kept in order."""

    def __init__(self, path, tag):
        self.tag = tag
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self.sock.connect(path)
        self.next_id = 0
        self.replies = {}  # id -> (msg, fds)
        self.events = []
        self.reset_seen = False

    def close(self):
        for _, fds in self.replies.values():
            for fd in fds:
                os.close(fd)
        self.replies.clear()
        self.sock.close()

    def send_raw(self, data, fds=()):
        anc = []
        if fds:
            anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        self.sock.sendmsg([data], anc)

    def send(self, op, fd=None, **fields):
        """Sends a request (op and id first, as the document advises); returns its id."""
        self.next_id += 1
        body = {"op": op, "id": self.next_id}
        body.update(fields)
        fds = [fd] if fd is not None else []
        self.send_raw(frame(body, len(fds)), fds)
        return self.next_id

    def send_pairs(self, pairs):
        """Sends a request body written as (key, value) pairs, in that order (a key may appear
        twice); the value ID stands for a fresh request id, which is returned."""
        self.next_id += 1
        self.send_raw(frame(Pairs((k, self.next_id if v is ID else v) for k, v in pairs)))
        return self.next_id

    def recv_frame(self, timeout):
        """Receives one frame: (msg, fds). Raises Closed at end-of-file, socket.timeout."""
        self.sock.settimeout(timeout)
        while True:
            try:
                data, anc, flags, _ = self.sock.recvmsg(MAX_FRAME + 1, socket.CMSG_SPACE(8 * 4),
                                                        socket.MSG_CMSG_CLOEXEC)
                break
            except ConnectionResetError:
                # The broker closed while frames of ours were unread: the kernel says so once,
                # before the frames the broker sent ahead of closing, which can still be read.
                if self.reset_seen:
                    raise
                self.reset_seen = True
        fds = []
        for level, type_, cdata in anc:
            if level == socket.SOL_SOCKET and type_ == socket.SCM_RIGHTS:
                a = array.array("i")
                a.frombytes(cdata[: len(cdata) - len(cdata) % a.itemsize])
                fds.extend(a)
        if not data and not fds:
            raise Closed("%s: the broker closed the connection" % self.tag)
        try:
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                raise ProtocolError("truncated record")
            if len(data) < HEADER.size:
                raise ProtocolError("record shorter than a header")
            magic, version, n_fds, body_len = HEADER.unpack_from(data)
            if magic != MAGIC or version != VERSION or data[6:8] != b"\0\0":
                raise ProtocolError("bad header %r" % data[:HEADER.size])
            if body_len != len(data) - HEADER.size or n_fds != len(fds):
                raise ProtocolError("header says %d bytes/%d fds, record has %d/%d"
                                    % (body_len, n_fds, len(data) - HEADER.size, len(fds)))
            msg = mp_decode(data[HEADER.size:])
            if not isinstance(msg, dict):
                raise ProtocolError("body is not a map")
        except (ProtocolError, MpError):
            for fd in fds:
                os.close(fd)
            raise
        return msg, fds

    def pump(self, timeout):
        """Reads one frame and files it (reply by id, or event). False on timeout."""
        try:
            msg, fds = self.recv_frame(timeout)
        except socket.timeout:
            return False
        if "reply" in msg:
            self.replies[msg["reply"]] = (msg, fds)
        elif "event" in msg:
            for fd in fds:
                os.close(fd)
            self.events.append(msg)
        else:
            for fd in fds:
                os.close(fd)
            raise ProtocolError("%s: neither reply nor event: %r" % (self.tag, msg))
        return True

    def wait_reply(self, rid, timeout=TIMEOUT_S, or_zero=False):
        """Waits for the reply to rid (or, with or_zero, for one addressed to the connection)."""
        deadline = time.monotonic() + timeout
        while rid not in self.replies and not (or_zero and 0 in self.replies):
            left = deadline - time.monotonic()
            if left <= 0 or not self.pump(left):
                raise TimeoutError("%s: no reply to request %d" % (self.tag, rid))
        return self.replies.pop(rid if rid in self.replies else 0)

    def request(self, op, fd=None, **fields):
        """Sends a request and waits for its reply: (msg, fds)."""
        return self.wait_reply(self.send(op, fd, **fields))

    def call(self, op, **fields):
        """A request whose reply carries no fd: returns the reply map."""
        msg, fds = self.request(op, **fields)
        for fd in fds:
            os.close(fd)
        return msg

    def last_words(self, timeout=TIMEOUT_S):
        """Reads frames until the broker closes the connection: the list of their bodies."""
        msgs = []
        while True:
            try:
                msg, fds = self.recv_frame(timeout)
            except Closed:
                return msgs
            for fd in fds:
                os.close(fd)
            msgs.append(msg)

    def wait_event(self, pred, timeout=TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while True:
            for i, ev in enumerate(self.events):
                if pred(ev):
                    return self.events.pop(i)
            left = deadline - time.monotonic()
            if left <= 0 or not self.pump(left):
                return None


# ---- checks ----

failures = []


def check(cond, what, got=None):
    if cond:
        print("ok   %s" % what)
    else:
        print("FAIL %s%s" % (what, "" if got is None else ": got %r" % (got,)))
        failures.append(what)
    return cond


def check_status(msg, name, what):
    """A reply failed (or succeeded) with the named status, with a consistent error name."""
    code = CODE[name]
    ok = msg.get("status") == code
    if code != 0:
        ok = ok and msg.get("error") == name and isinstance(msg.get("message"), str)
    return check(ok, "%s -> %s" % (what, name), msg)


def pattern(size):
    """Each 8-byte little-endian word holds its index XOR a constant."""
    return b"".join(struct.pack("<Q", i ^ 0x5A5A0000A5A5) for i in range(size // 8))


def sealed_memfd(data, seals):
    fd = os.memfd_create("independent-client", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, len(data))
    with mmap.mmap(fd, len(data), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as m:
        m[:] = data
    if seals:
        fcntl.fcntl(fd, F_ADD_SEALS, seals)
    return fd


def is_event(name, buffer=None, sub=None, with_sub=None):
    def pred(ev):
        if ev.get("event") != name:
            return False
        if buffer is not None and ev.get("buffer") != buffer:
            return False
        if sub is not None and ev.get("sub") != sub:
            return False
        if with_sub is not None and ("sub" in ev) != with_sub:
            return False
        return True
    return pred


def nested(levels):
    """A map nested this many containers deep, counting itself."""
    v = 0
    for _ in range(levels):
        v = {"d": v}
    return v


def field_error(conn, pairs, what, field, also=None):
    """Sends a request with a bad field (pairs as for Conn.send_pairs): it must be answered
    bad-request with the request's id and a message naming the field; the connection stays."""
    rid = conn.send_pairs(pairs)
    msg, fds = conn.wait_reply(rid, or_zero=True)
    for fd in fds:
        os.close(fd)
    text = msg.get("message", "")
    check_status(msg, "bad-request", what)
    check(msg.get("reply") == rid, "%s: the reply carries the request's id" % what, msg.get("reply"))
    check("'%s'" % field in text and (also is None or also in text),
          "%s: the message names the field%s" % (what, "" if also is None else " and says '%s'" % also), text)


def hello(conn, label):
    return conn.call("hello", version=1, pid=os.getpid(), pidns=os.stat("/proc/self/ns/pid").st_ino,
                     label=label, gpus=[])


# ---- the scenario ----

def run(path):
    size = 64 * 1024
    data = pattern(size)
    name = "indep/buf-%d" % os.getpid()
    prefix = "indep/"

    prod = Conn(path, "producer")
    cons = Conn(path, "consumer")
    subc = Conn(path, "subscriber")

    # Before hello: ping works, anything else is hello-first.
    r = prod.call("ping")
    check(r.get("status") == 0 and r.get("reply") == 1 and isinstance(r.get("epoch"), int)
          and r["epoch"] != 0, "ping before hello answers with a non-zero epoch", r)
    epoch = r.get("epoch")
    check_status(prod.call("list"), "hello-first", "list before hello")

    # hello, and hello twice.
    r = hello(prod, "independent-producer")
    check_status(r, "ok", "hello")
    check(r.get("version") == 1, "hello reply version is 1", r.get("version"))
    check(isinstance(r.get("peer"), int) and r["peer"] > 0, "hello reply has a peer id", r.get("peer"))
    check(r.get("epoch") == epoch, "hello and ping report the same epoch", (r.get("epoch"), epoch))
    check(r.get("uid") == os.getuid() and r.get("gid") == os.getgid(), "hello reply has our uid and gid",
          (r.get("uid"), r.get("gid")))
    check(r.get("pid") in (os.getpid(), 0), "hello reply pid is ours (or 0 outside the namespace)",
          r.get("pid"))
    check(isinstance(r.get("pidns_same"), bool), "hello reply says pidns_same", r.get("pidns_same"))
    check(str(r.get("label", "")).startswith("gpuipc-broker"), "hello reply label names the broker",
          r.get("label"))
    check_status(hello(prod, "again"), "state", "second hello")

    check_status(hello(cons, "independent-consumer"), "ok", "consumer hello")
    check_status(hello(subc, "independent-subscriber"), "ok", "subscriber hello")

    # Unknown op (after hello).
    check_status(prod.call("frobnicate", name="x"), "unknown-op", "unknown op")

    # Subscribe to the prefix.
    r = subc.call("subscribe", prefix=prefix)
    check_status(r, "ok", "subscribe")
    sub = r.get("sub")
    check(isinstance(sub, int) and sub > 0, "subscribe reply has a subscription id", sub)

    # Attach a missing name without waiting.
    check_status(cons.call("attach", name=prefix + "missing", timeout_ms=0), "not-found",
                 "attach of a missing name with timeout 0")

    # A publish whose memfd lacks seals, and one that lacks only FUTURE_WRITE for a read-only buffer.
    fd = sealed_memfd(data, 0)
    r, fds = prod.request("publish", fd=fd, name=name, kind="memfd", size=size)
    os.close(fd)
    check(not fds, "an error reply carries no fd", len(fds))
    check_status(r, "bad-fd", "publish of an unsealed memfd")
    fd = sealed_memfd(data, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
    r, _ = prod.request("publish", fd=fd, name=name, kind="memfd", size=size)
    os.close(fd)
    check_status(r, "bad-fd", "read-only publish of a memfd without F_SEAL_FUTURE_WRITE")

    # An fd on a request other than publish.
    fd = sealed_memfd(b"x" * 8, 0)
    r, _ = prod.request("ping", fd=fd)
    os.close(fd)
    check_status(r, "bad-fd", "ping carrying an fd")

    # The consumer waits for the name (rendezvous): its reply comes after the publish.
    wait_id = cons.send("attach", name=name, timeout_ms=5000)

    # Publish a sealed, read-only memfd.
    fd = sealed_memfd(data, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | F_SEAL_FUTURE_WRITE)
    r, _ = prod.request("publish", fd=fd, name=name, kind="memfd", size=size, meta={"dtype": "u64"})
    os.close(fd)  # the broker holds its own copy
    check_status(r, "ok", "publish of a sealed read-only memfd")
    buf = r.get("buffer")
    gen = r.get("generation")
    check(isinstance(buf, int) and buf > 0 and isinstance(gen, int) and gen > 0,
          "publish reply has buffer id and generation", r)

    ev = subc.wait_event(is_event("published", buffer=buf))
    check(ev is not None and ev.get("name") == name and ev.get("generation") == gen
          and ev.get("kind") == "memfd" and ev.get("sub") == sub,
          "subscriber sees 'published' with name, generation, kind and sub", ev)

    # The waiting attach is answered with the fd.
    r, fds = cons.wait_reply(wait_id)
    check_status(r, "ok", "waiting attach by name")
    check(r.get("cached") is False and len(fds) == 1, "first attach: cached false and one fd",
          (r.get("cached"), len(fds)))
    check(r.get("buffer") == buf and r.get("generation") == gen and r.get("name") == name
          and r.get("kind") == "memfd" and r.get("size") == size and r.get("state") == "live"
          and r.get("refs") == 1 and r.get("writable") is False,
          "attach reply describes the buffer", r)
    check(r.get("meta") == {"dtype": "u64"}, "attach reply returns meta verbatim", r.get("meta"))
    if fds:
        cfd = fds[0]
        for extra in fds[1:]:
            os.close(extra)
        check(os.fstat(cfd).st_size >= size, "received memfd is large enough", os.fstat(cfd).st_size)
        check(fcntl.fcntl(cfd, F_GET_SEALS) & F_SEAL_FUTURE_WRITE != 0,
              "received memfd carries F_SEAL_FUTURE_WRITE")
        with mmap.mmap(cfd, size, mmap.MAP_SHARED, mmap.PROT_READ) as m:
            got = bytes(m[:])
        check(got == data, "the consumer's mapping holds the producer's bytes",
              None if got == data else "first difference at byte %d"
              % next(i for i in range(size) if got[i] != data[i]))
        try:
            mmap.mmap(cfd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE).close()
            check(False, "a writable mapping of a read-only buffer is refused")
        except OSError as e:
            check(e.errno in (errno.EPERM, errno.EACCES), "a writable mapping of a read-only buffer is refused",
                  e.errno)
        os.close(cfd)

    # A second attach of the same buffer from the same connection: cached, no fd.
    r, fds = cons.request("attach", buffer=buf)
    check_status(r, "ok", "second attach (by id)")
    check(r.get("cached") is True and not fds, "second attach: cached true and no fd",
          (r.get("cached"), len(fds)))
    check(r.get("refs") == 2, "two references now", r.get("refs"))
    for fd in fds:
        os.close(fd)

    r = cons.call("stat", buffer=buf)
    check(r.get("status") == 0 and r.get("refs") == 2 and r.get("holders") == 1
          and isinstance(r.get("items"), list) and len(r["items"]) == 1
          and r["items"][0].get("refs") == 2, "stat shows one holder with two references", r)

    # Release one, retire, and the buffer is not drained yet.
    check_status(cons.call("release", buffer=buf), "ok", "first release")
    check_status(prod.call("retire", buffer=buf), "ok", "retire")
    ev = subc.wait_event(is_event("retired", buffer=buf))
    check(ev is not None and ev.get("sub") == sub and ev.get("name") == name,
          "subscriber sees 'retired'", ev)
    check_status(cons.call("attach", name=name, timeout_ms=0), "not-found", "attach by name after retire")
    check_status(cons.call("attach", buffer=buf), "state", "attach by id after retire")
    prod.call("ping")  # everything sent to the producer before this reply has arrived
    check(not any(e.get("event") == "drained" for e in prod.events),
          "no 'drained' while a reference remains", prod.events)

    # The last release drains it.
    check_status(cons.call("release", buffer=buf), "ok", "second release")
    check_status(cons.call("release", buffer=buf), "not-attached", "a third release")
    ev = prod.wait_event(is_event("drained", buffer=buf, with_sub=False))
    check(ev is not None and ev.get("generation") == gen and ev.get("name") == name,
          "producer receives 'drained' (without sub)", ev)
    ev = subc.wait_event(is_event("drained", buffer=buf, sub=sub))
    check(ev is not None, "subscriber receives 'drained' with its sub", ev)
    r = prod.call("stat", buffer=buf)
    check(r.get("state") == "idle" and r.get("refs") == 0, "the buffer is idle", r)

    # Publish it again by id: no fd travels, new generation; an empty meta clears the metadata.
    r = prod.call("publish", name=name, buffer=buf, meta={})
    check_status(r, "ok", "publish again by id")
    check(r.get("buffer") == buf and isinstance(r.get("generation"), int) and r["generation"] > gen,
          "publish again keeps the id and raises the generation", r)
    gen2 = r.get("generation")
    ev = subc.wait_event(is_event("published", buffer=buf))
    check(ev is not None and ev.get("generation") == gen2, "subscriber sees the second 'published'", ev)

    # The consumer still has the fd's mapping as far as the broker knows: cached.
    r, fds = cons.request("attach", name=name, timeout_ms=0)
    check(r.get("status") == 0 and r.get("cached") is True and not fds and r.get("generation") == gen2,
          "attach after publish again: cached true, no fd, new generation", (r, len(fds)))
    check("meta" not in r, "publish again with an empty meta cleared the metadata", r.get("meta"))
    for fd in fds:
        os.close(fd)
    check_status(cons.call("release", buffer=buf), "ok", "release")

    # After unmap the fd travels again.
    check_status(cons.call("unmap", buffer=buf), "ok", "unmap")
    r, fds = cons.request("attach", buffer=buf)
    check(r.get("status") == 0 and r.get("cached") is False and len(fds) == 1,
          "attach after unmap: cached false and one fd", (r, len(fds)))
    for fd in fds:
        with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) as m:
            check(bytes(m[:64]) == data[:64], "the fd after unmap maps the same bytes")
        os.close(fd)
    check_status(cons.call("release", buffer=buf), "ok", "release")

    # Free: retired and drained at once (no references), forgotten; the consumer got the fd: freed.
    check_status(prod.call("free", buffer=buf), "ok", "free")
    check(prod.wait_event(is_event("drained", buffer=buf, with_sub=False)) is not None,
          "producer receives 'drained' after free")
    ev = cons.wait_event(is_event("freed", buffer=buf))
    check(ev is not None and ev.get("name") == name and "sub" not in ev,
          "consumer receives 'freed'", ev)
    check_status(prod.call("stat", buffer=buf), "not-found", "stat of a freed buffer")

    check_status(subc.call("unsubscribe", sub=sub), "ok", "unsubscribe")
    check_status(subc.call("unsubscribe", sub=sub), "not-found", "unsubscribe twice")

    # A meta nested 8 deep is accepted, and a listing of it nests items 10 deep.
    deep_name = name + "-deep"
    fd = sealed_memfd(b"\0" * 4096, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | F_SEAL_FUTURE_WRITE)
    r, _ = prod.request("publish", fd=fd, name=deep_name, kind="memfd", size=4096, meta=nested(8))
    os.close(fd)
    check_status(r, "ok", "publish with a meta nested 8 deep")
    deep_buf = r.get("buffer")
    r = prod.call("list", prefix=deep_name)
    items = r.get("items") or [{}]
    check(r.get("status") == 0 and len(items) == 1 and items[0].get("meta") == nested(8),
          "list returns the 8-deep meta inside its record", r)
    check_status(prod.call("free", buffer=deep_buf), "ok", "free of the deep-meta buffer")

    # A bad request keeps the connection; a framing violation closes it.
    check_status(prod.call("attach", name=name, buffer=buf), "bad-request", "attach with name and buffer")
    check_status(prod.call("ping"), "ok", "the connection survives a bad request")

    # Field errors name the field and answer the request's id, even when id comes after the bad
    # field (section 3.4).
    field_error(prod, [("op", "attach"), ("name", 5), ("id", ID)], "a wrong-type field before id", "name")
    field_error(prod, [("op", "attach"), ("id", ID), ("name", name), ("name", name)],
                "a key given twice", "name", also="twice")
    field_error(prod, [("op", "publish"), ("name", deep_name), ("kind", "memfd"), ("size", 4096),
                       ("meta", nested(9)), ("id", ID)], "publish with a meta nested 9 deep", "meta")
    check_status(prod.call("ping"), "ok", "the connection survives field errors")
    check_status(prod.call("publish", name=name, buffer=0), "invalid", "publish again with buffer 0")
    check_status(cons.call("attach", buffer=1 << 40), "not-found", "attach by an unknown buffer id")

    run_contract(path, prod, cons, name)

    bad = Conn(path, "violator")
    bad.send_raw(b"XIPC" + frame({"op": "ping", "id": 1})[4:])
    try:
        msg, fds = bad.recv_frame(TIMEOUT_S)
        check(msg.get("reply") == 0 and msg.get("status") == CODE["protocol"]
              and msg.get("error") == "protocol", "bad magic is answered 'protocol' with reply 0", msg)
        try:
            more = bad.recv_frame(TIMEOUT_S)
            check(False, "the broker closes the connection after a protocol error", more)
        except Closed:
            check(True, "the broker closes the connection after a protocol error")
    except (Closed, socket.timeout) as e:
        check(False, "bad magic is answered 'protocol' with reply 0", str(e))
    bad.close()

    for c in (prod, cons, subc):
        c.close()


def closed_with_protocol(conn, what, says):
    """The connection's last words are one 'reply: 0' protocol notice whose message says this."""
    try:
        words = conn.last_words()
    except (ProtocolError, MpError) as e:
        words = [{"error": str(e)}]
    check(len(words) == 1 and failed_with(words[0], 0, "protocol"), "%s: a protocol notice, then end-of-file"
          % what, words)
    check(bool(words) and says in words[-1].get("message", ""), "%s: the notice says '%s'" % (what, says),
          words and words[-1].get("message"))


def run_contract(path, prod, cons, name):
    """Strings, ids, handles, paging, waits and identities, as sections 3-6 and 11 state them."""
    # Strings are UTF-8 (3.1): a label, or a string inside meta, that is not is bad-request.
    c = Conn(path, "utf8")
    r = c.call("hello", version=1, label=RawStr(b"caf\xe9"))
    check_status(r, "bad-request", "hello with a label that is not UTF-8")
    check("'label'" in r.get("message", "") and "UTF-8" in r.get("message", ""),
          "the message names the label and UTF-8", r.get("message"))
    check_status(hello(c, "caf\u00e9 \u2713"), "ok", "hello with a UTF-8 label on the same connection")
    fd = sealed_memfd(b"\0" * 4096, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | F_SEAL_FUTURE_WRITE)
    r, _ = c.request("publish", fd=fd, name=name + "-utf8", kind="memfd", size=4096, meta={"dtype": RawStr(b"\xff")})
    check_status(r, "bad-request", "publish with a meta string that is not UTF-8")
    check("'meta'" in r.get("message", ""), "the message names meta", r.get("message"))

    # A handle is for cuda-legacy only (6.3).
    r, _ = c.request("publish", fd=fd, name=name + "-handle", kind="memfd", size=4096, handle=b"\1" * 64)
    check_status(r, "invalid", "a memfd publish with a handle")
    os.close(fd)

    # A name over 255 bytes is over the field's limit: bad-request (6.3).
    r = c.call("attach", name="n" * 256, timeout_ms=0)
    check_status(r, "bad-request", "attach of a 256-byte name")
    check("'name'" in r.get("message", ""), "the message names the field", r.get("message"))

    # peers: our own connection is in the broker's PID namespace, which the kernel shows (11).
    r = c.call("peers")
    ours = [p for p in r.get("items", []) if p.get("label") == "caf\u00e9 \u2713"]
    check(len(ours) == 1 and ours[0].get("pidns_declared") is False
          and ours[0].get("pidns") == os.stat("/proc/self/ns/pid").st_ino,
          "peers: our namespace, read by the kernel, is not marked declared", ours)

    # stat pages its holders by peer id (6.12).
    holders = [Conn(path, "holder-%d" % i) for i in range(3)]
    fd = sealed_memfd(b"\0" * 4096, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | F_SEAL_FUTURE_WRITE)
    r, _ = c.request("publish", fd=fd, name=name + "-held", kind="memfd", size=4096)
    os.close(fd)
    held = r.get("buffer")
    for h in holders:
        hello(h, "holder")
        _, fds = h.request("attach", buffer=held)
        for x in fds:
            os.close(x)
    seen, after, pages = [], 0, 0
    while pages < 10:
        r = c.call("stat", buffer=held, after=after, limit=1)
        pages += 1
        seen += [i.get("peer") for i in r.get("items", [])]
        after = r.get("after")
        if not r.get("more"):
            break
    check(len(seen) == 3 and seen == sorted(seen) and len(set(seen)) == 3 and pages == 3,
          "stat with limit 1 pages through three holders in peer order", (seen, pages))
    for h in holders:
        h.close()

    # Waiters that lose a retire_after race time out saying so (6.4).
    w1, w2 = Conn(path, "waiter-1"), Conn(path, "waiter-2")
    hello(w1, "waiter")
    hello(w2, "waiter")
    ids = [w.send("attach", name=name + "-once", timeout_ms=500) for w in (w1, w2)]
    c.call("ping")
    w1.call("ping")  # both waits are registered before the publish
    w2.call("ping")
    fd = sealed_memfd(b"\0" * 4096, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | F_SEAL_FUTURE_WRITE)
    r, _ = c.request("publish", fd=fd, name=name + "-once", kind="memfd", size=4096, retire_after=1)
    os.close(fd)
    answers = []
    for w, rid in ((w1, ids[0]), (w2, ids[1])):
        msg, fds = w.wait_reply(rid)
        for x in fds:
            os.close(x)
        answers.append(msg)
    served = [a for a in answers if a.get("status") == 0]
    late = [a for a in answers if a.get("status") == CODE["timeout"]]
    check(len(served) == 1 and len(late) == 1, "retire_after 1 with two waiters: one served, one times out",
          answers)
    check(bool(late) and "nothing was published" not in late[0].get("message", "")
          and "retired" in late[0].get("message", ""),
          "the late waiter's timeout says the publication was retired before its turn",
          late and late[0].get("message"))
    w1.close()
    w2.close()
    c.close()

    # A field error without a readable id cannot be answered: protocol, close (3.4).
    c = Conn(path, "no-id")
    hello(c, "no-id")
    c.send_raw(frame(Pairs([("op", "attach"), ("name", 5)])))
    closed_with_protocol(c, "a field error in a request without an id", "no readable id")
    c.close()

    # Reserved header bytes must be zero (2).
    c = Conn(path, "reserved")
    f = bytearray(frame({"op": "ping", "id": 1}))
    f[6] = 1
    c.send_raw(bytes(f))
    closed_with_protocol(c, "a header with a reserved byte set", "reserved")
    c.close()


def run_private_limits(broker):
    """On a broker of our own with a policy and a small queue: group-join asks the policy, and a
    connection that does not read is dropped with a 'reply: 0' quota notice after what it was sent."""
    tmp = tempfile.mkdtemp(prefix="gpuipc-indep-")
    path = os.path.join(tmp, "s.sock")
    policy = os.path.join(tmp, "policy.conf")
    with open(policy, "w") as f:
        f.write("allow publish,attach any prefix=indep/\nallow attach any prefix=indep-ok\n")
    proc = subprocess.Popen([broker, "--socket", path, "--seccomp", "off", "--log-level", "error",
                             "--policy", policy, "--max-queued-bytes", "65536"])
    conns = []
    try:
        a = connect_when_ready(path, "limits-a", proc)
        conns.append(a)
        hello(a, "independent-limits")
        r = a.call("group-join", group="indep-no", members=1, timeout_ms=1000)
        check_status(r, "denied", "group-join of a group the policy does not let us attach")
        r = a.call("group-join", group="indep-ok", members=1, timeout_ms=1000)
        check_status(r, "ok", "group-join of a group the policy allows")

        flood = Conn(path, "flood")
        conns.append(flood)
        hello(flood, "flood")
        # Send without reading until the broker hangs up (the send fails), however fast it reads.
        flood.sock.settimeout(0.2)
        sent, deadline = 0, time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                flood.send("ping")
                sent += 1
            except (socket.timeout, BlockingIOError):
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        words = flood.last_words()
        check(bool(words) and failed_with(words[-1], 0, "quota")
              and "--max-queued-bytes" in words[-1].get("message", ""),
              "a connection that does not read gets a quota notice naming --max-queued-bytes before "
              "end-of-file (%d pings sent, %d frames read)" % (sent, len(words)), words[-1:])
    finally:
        for conn in conns:
            conn.close()
        proc.terminate()
        try:
            proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def failed_with(msg, reply, name):
    """msg is a failed reply to request reply (0: to the connection) with the named status."""
    return (msg.get("reply") == reply and msg.get("status") == CODE[name] and msg.get("error") == name
            and isinstance(msg.get("message"), str))


def connect_when_ready(path, tag, proc):
    """Connects once the broker listens (it may still be starting)."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            return Conn(path, tag)
        except (FileNotFoundError, ConnectionRefusedError):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def run_private(broker):
    """On a broker of our own, limited to two connections: a third is refused with a quota notice
    naming the limit; then SIGTERM, and every pending wait is answered 'shutdown', every
    connection gets a 'reply: 0' shutdown notice, and the broker exits cleanly."""
    tmp = tempfile.mkdtemp(prefix="gpuipc-indep-")
    path = os.path.join(tmp, "s.sock")
    conns = []
    proc = subprocess.Popen([broker, "--socket", path, "--seccomp", "off", "--log-level", "error",
                             "--max-connections", "2"])
    try:
        a = connect_when_ready(path, "private-a", proc)
        conns.append(a)
        check_status(hello(a, "independent-a"), "ok", "hello on a broker of our own")
        b = Conn(path, "private-b")
        conns.append(b)
        check_status(hello(b, "independent-b"), "ok", "hello on the second connection")

        # The third connection is over --max-connections: refused at accept, with reasons.
        c = Conn(path, "private-c")
        conns.append(c)
        words = c.last_words()
        check(len(words) == 1 and failed_with(words[0], 0, "quota"),
              "a connection over the limit gets one 'reply: 0' quota notice, then end-of-file", words)
        check(bool(words) and "--max-connections" in words[0].get("message", ""),
              "the quota notice names the limit's flag", words and words[0].get("message"))

        # Pending waits, then SIGTERM.
        wait_id = a.send("attach", name="indep/never-published", timeout_ms=60000)
        join_id = b.send("group-join", group="indep-group", members=2, timeout_ms=60000)
        check_status(a.call("ping"), "ok", "ping while an attach waits")
        check_status(b.call("ping"), "ok", "ping while a group-join waits")
        os.kill(proc.pid, signal.SIGTERM)
        for conn, rid, what in ((a, wait_id, "waiting attach"), (b, join_id, "pending group-join")):
            words = conn.last_words()
            check(len(words) == 2, "%s: two last frames, then end-of-file" % what, words)
            check(len(words) >= 1 and failed_with(words[0], rid, "shutdown"),
                  "%s is answered 'shutdown' with its id" % what, words[:1])
            check(len(words) >= 2 and failed_with(words[1], 0, "shutdown"),
                  "%s: then the connection gets a 'reply: 0' shutdown notice" % what, words[1:])
        try:
            rc = proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            rc = None
        check(rc == 0, "the broker exits with status 0 after SIGTERM", rc)
        check(not os.path.exists(path), "the stopped broker removed its socket")
    finally:
        for conn in conns:
            conn.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("GPUIPC_SOCKET")
    if not path:
        print("skip: no socket path (argument or $GPUIPC_SOCKET)")
        return SKIP
    for need in ("AF_UNIX", "SOCK_SEQPACKET", "MSG_CMSG_CLOEXEC"):
        if not hasattr(socket, need):
            print("skip: this Python has no socket.%s" % need)
            return SKIP
    if not hasattr(os, "memfd_create"):
        print("skip: this Python has no os.memfd_create")
        return SKIP
    try:
        run(path)
    except (OSError, TimeoutError, ProtocolError, MpError, Closed) as e:
        if isinstance(e, (FileNotFoundError, ConnectionRefusedError)) and not failures:
            print("skip: cannot reach the broker at %s: %s" % (path, e))
            return SKIP
        print("FAIL unexpected %s: %s" % (type(e).__name__, e))
        failures.append(str(e))
    broker = os.environ.get("GPUIPC_BROKER")
    if broker and os.access(broker, os.X_OK):
        for scenario in (run_private, run_private_limits):
            try:
                scenario(broker)
            except (OSError, TimeoutError, ProtocolError, MpError, Closed, socket.timeout) as e:
                print("FAIL unexpected %s on the private broker: %s" % (type(e).__name__, e))
                failures.append(str(e))
    else:
        print("note: $GPUIPC_BROKER is not set; the connection quota and shutdown checks are skipped")
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
