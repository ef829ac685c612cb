"""State dicts: a whole dict of arrays in ONE buffer, with versions and double buffering.

Layout of a state-dict buffer: every array's bytes at an offset aligned to ALIGN, then the
manifest, a msgpack map ``{'format': FORMAT, 'entries': [[key, dtype, shape, offset], ...]}``. The
manifest is larger than the 4 KiB metadata limit for real models, so it lives in the buffer; the
metadata says where: ``{'state_dict': {'version': n, 'manifest': [offset, length], 'digest': bytes}}``.
A consumer that has seen the digest before (the same layout: the usual weight update) skips
reading and parsing the manifest again.

Versions: publishing again under the same name replaces the live version at the broker in one
step (new attaches get the new one; holders of the old one keep valid memory). The Publisher
keeps at most `buffers` buffers per name and reuses a buffer only once it drained, so memory stays
flat across any number of updates.
"""
import hashlib
from typing import Any, Dict

import msgpack

from . import arrays, dtypes, meta as _meta
from .buffer import View
from .errors import InvalidArgument, MetadataError, NotFound, Timeout

FORMAT = 'gpuipc.state_dict/1'
ALIGN = 256
_MANIFEST_CACHE_MAX = 16


def _align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan(state_dict):
    """[(key, dtype, shape, offset, array)], the manifest bytes and its offset, for a dict of arrays."""
    entries, offset = [], 0
    for key, value in state_dict.items():
        if not isinstance(key, str):
            raise TypeError(f'state dict keys must be strings, not {key!r}')
        try:
            info = arrays.describe(value)
        except TypeError:
            raise TypeError(f'state dict entry {key!r} is a {type(value).__name__}, not an array') from None
        nbytes = arrays.numel(info.shape) * dtypes.itemsize(info.dtype)
        entries.append((key, info.dtype, list(info.shape), offset, value))
        offset = _align(offset + nbytes)
    manifest = msgpack.packb({'format': FORMAT, 'entries': [e[:4] for e in entries]}, use_bin_type=True)
    return entries, manifest, offset


# ---- views of a buffer, per framework ----

def _torch_views(base, entries):
    import torch
    out = {}
    for key, dtype, shape, offset in entries:
        dt = getattr(torch, dtype)
        n = arrays.numel(shape) * dtypes.itemsize(dtype)
        out[key] = base[offset:offset + n].view(dt).view(shape)
    return out


def _array_views(base, entries, dtype_of):
    # NumPy and CuPy arrays view-cast and reshape the same way
    out = {}
    for key, dtype, shape, offset in entries:
        n = arrays.numel(shape) * dtypes.itemsize(dtype)
        out[key] = base[offset:offset + n].view(dtype_of(dtype)).reshape(shape)
    return out


def views(memory, entries, framework):
    """{key: zero-copy array} over memory (a gpuipc buffer) for manifest entries."""
    if framework == 'torch':
        return _torch_views(memory.torch(), entries)
    if framework == 'numpy':
        return _array_views(memory.numpy(), entries, dtypes.numpy_dtype)
    if framework == 'cupy':
        import cupy
        return _array_views(memory.cupy(), entries, lambda d: cupy.dtype(dtypes.numpy_dtype(d)))
    if framework in ('jax', None, 'gpuipc'):
        made = {key: View(memory, offset, dtype, shape) for key, dtype, shape, offset in entries}
        return {k: v.jax() for k, v in made.items()} if framework == 'jax' else made
    raise InvalidArgument(f"framework must be 'torch', 'numpy', 'cupy', 'jax' or None, not {framework!r}")


def _torch_copy(dst, src):
    """dst[i].copy_(src[i]) for all i, in as few kernel launches as torch allows."""
    import torch
    foreach = getattr(torch, '_foreach_copy_', None)
    if foreach is not None:
        try:
            foreach(dst, src)
            return
        except (RuntimeError, TypeError):
            pass  # mixed devices or dtypes: one copy each
    for d, s in zip(dst, src):
        d.copy_(s)


def _fill(slot, entries, manifest, manifest_offset, torch_views=None):
    """Copies every array into slot, each with its own framework, then the manifest. torch_views:
    this slot's destination views for this manifest, when the producer kept them."""
    fws = {arrays.framework_of(e[4]) for e in entries}
    if fws == {'torch'}:
        dst = torch_views if torch_views is not None else _torch_views(slot.torch(), [e[:4] for e in entries])
        _torch_copy([dst[e[0]] for e in entries], [e[4] for e in entries])
    elif fws == {'numpy'} and slot.kind == 'memfd':
        dst = _array_views(slot.numpy(), [e[:4] for e in entries], dtypes.numpy_dtype)
        for key, _, _, _, src in entries:
            dst[key][...] = src
    else:
        dst = None
        for _, dtype, shape, offset, src in entries:
            arrays.copy_into(View(slot, offset, dtype, shape), src)
    slot.write(manifest, manifest_offset)
    return dst if fws == {'torch'} else None


# ---- producer ----

class StateDictVersion:
    """One published version (from Client.publish_state_dict): its number, the broker's
    generation and buffer id, its size; `drained` / `wait_drained()` say when no consumer holds it."""

    def __init__(self, publisher, slot, version, generation, nbytes):
        self._publisher, self._slot = publisher, slot
        self.version, self.generation, self.buffer_id, self.nbytes = version, generation, slot.id, nbytes

    def __repr__(self):
        return f'<gpuipc.StateDictVersion {self._publisher.name!r} v{self.version} ({self.nbytes} bytes)>'

    def _superseded(self):
        return not self._slot._handle or self._slot.generation != self.generation

    @property
    def drained(self) -> bool:
        """True once this version is retired (a newer one replaced it) and no consumer holds it."""
        return self._superseded() or (self._publisher.live is not self._slot and self._slot.drained)

    def wait_drained(self, timeout_ms: int = -1) -> None:
        """Waits until `drained` (a newer version must have been published first)."""
        if self._superseded():
            return
        if self._publisher.live is self._slot:
            raise MetadataError(f'version {self.version} of {self._publisher.name!r} is still the live one; it '
                                f'drains after a newer version replaced it (or unpublish_state_dict)')
        self._slot.wait_drained(timeout_ms)


class Publisher:
    """The versions of one state dict name in one Client: its buffers (slots) and which is live."""

    def __init__(self, client, name):
        self.client, self.name = client, name
        self.slots, self.live, self.version = [], None, 0
        self._torch_dst = {}  # slot handle -> (manifest digest, destination views): the same layout
                              # again (every weight update) needs no new views

    def owns_buffer(self, buffer_id):
        """True if buffer_id is one of this publisher's buffers (its events are internal)."""
        return any(s._handle and s.id == buffer_id for s in self.slots)

    def _fits(self, slot, need, kind, device):
        return slot.size >= need and slot.kind == kind and (kind == 'memfd' or slot.device_ordinal == device)

    def _drop(self, slot):
        self._torch_dst.pop(slot._handle, None)
        self.slots.remove(slot)
        self.client.free(slot)

    def _take_slot(self, need, kind, device, buffers, timeout_ms):
        for slot in [s for s in self.slots if s is not self.live]:
            if slot.drained:
                if self._fits(slot, need, kind, device):
                    return slot
                self._drop(slot)
        if len(self.slots) < max(buffers, 1):
            slot = self.client.alloc(need, kind, device)
            self.slots.append(slot)
            return slot
        waiting = [s for s in self.slots if s is not self.live]
        if not waiting:  # buffers=1: the live version must drain before its memory is written again
            self.client.retire(self.live)
            self.live, waiting = None, list(self.slots)
        slot = waiting[0]
        try:
            slot.wait_drained(timeout_ms)
        except Timeout as e:
            raise Timeout(f'publish state dict {self.name!r}: all {len(self.slots)} buffers are still held by '
                          f'consumers after {timeout_ms} ms (release old versions, or allow more buffers)',
                          e.code, e.operation, e.detail, e.hint) from None
        if self._fits(slot, need, kind, device):
            return slot
        self._drop(slot)
        slot = self.client.alloc(need, kind, device)
        self.slots.append(slot)
        return slot

    def publish(self, state_dict, kind, device, meta, buffers, timeout_ms, broker_held):
        entries, manifest, manifest_offset = plan(state_dict)
        need = manifest_offset + len(manifest)
        slot = self._take_slot(need, kind, device, buffers, timeout_ms)
        digest = hashlib.blake2b(manifest, digest_size=8).digest()
        kept = self._torch_dst.get(slot._handle)
        views = _fill(slot, entries, manifest, manifest_offset, kept[1] if kept and kept[0] == digest else None)
        if views is not None:
            self._torch_dst[slot._handle] = (digest, views)
        version = self.version + 1
        raw = _meta.pack(meta, {'state_dict': {'version': version, 'manifest': [manifest_offset, len(manifest)],
                                               'digest': digest}})
        self.client._publish_raw(slot, self.name.encode(), raw, broker_held=broker_held)
        self.version = version
        old, self.live = self.live, slot
        if old is not None and old is not slot and old._handle:
            # The broker retired it when the new version took the name; this tells libgpuipc.
            self.client.retire(old)
        return StateDictVersion(self, slot, version, slot.generation, need)

    def close(self):
        """Frees every buffer (retiring the live one)."""
        self._torch_dst.clear()
        for slot in list(self.slots):
            if slot._handle:
                self.client.free(slot)
        self.slots, self.live = [], None


# ---- consumer ----

class StateDict(dict):
    """A state dict attached from a broker: {key: zero-copy array}, plus `version` (the producer's
    count), `generation` and `buffer_id` (the broker's), `meta` (the producer's own metadata) and
    `name`. release() (or leaving a ``with`` block) empties the dict and gives the buffer back;
    arrays taken from it must not be used afterwards. Dropped unreleased, it is released once it
    and all its arrays are garbage (with a ResourceWarning)."""

    name: str
    version: int
    generation: int
    buffer_id: int
    meta: Dict[str, Any]

    def release(self) -> None:
        """Empties the dict and releases the buffer (idempotent)."""
        self.clear()
        attached, self._attached = getattr(self, '_attached', None), None
        if attached is not None:
            attached.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def _manifest(client, attached, info):
    cache = client._manifest_cache
    digest = info.get('digest')
    if digest is not None and digest in cache:
        return cache[digest]
    try:
        offset, length = (int(x) for x in info['manifest'])
    except (KeyError, TypeError, ValueError):
        raise MetadataError(f"state dict {attached.name!r}: its metadata has no usable 'manifest'") from None
    if offset < 0 or length <= 0 or offset + length > attached.size:
        raise MetadataError(f'state dict {attached.name!r}: the manifest [{offset}, +{length}] lies outside the '
                            f'{attached.size}-byte buffer')
    raw = View(attached, 0, 'uint8', (attached.size,)).read(offset, length)
    if digest is not None and hashlib.blake2b(raw, digest_size=8).digest() != digest:
        raise MetadataError(f'state dict {attached.name!r}: the manifest does not match its digest')
    try:
        m = msgpack.unpackb(raw, raw=False)
        if m.get('format') != FORMAT:
            raise ValueError(f"format {m.get('format')!r}")
        entries = []
        for key, dtype, shape, off in m['entries']:
            shape = [int(x) for x in shape]
            dtype = dtypes.name(dtype)
            end = int(off) + arrays.numel(shape) * dtypes.itemsize(dtype)
            if int(off) < 0 or any(x < 0 for x in shape) or end > offset:
                raise ValueError(f'entry {key!r} lies outside the data')
            entries.append((str(key), dtype, shape, int(off)))
    except Exception as e:
        raise MetadataError(f'state dict {attached.name!r}: unusable manifest ({e})') from None
    if digest is not None:
        if len(cache) >= _MANIFEST_CACHE_MAX:
            cache.pop(next(iter(cache)))
        cache[digest] = entries
    return entries


def _attach_newer(client, name, timeout_ms, device, after):
    from .client import _Deadline
    deadline = _Deadline(timeout_ms)
    sub = client._subscribe(name)
    client._internal_subs.add(sub)
    try:
        while True:
            try:
                a = client.attach(name, 0, device)
            except NotFound:
                a = None
            if a is not None:
                if (a.id, a.generation) != (after.buffer_id, after.generation):
                    return a
                a.release()
            ev = client._wait_for(lambda e: e.subscription == sub and e.type == 'published' and e.name == name,
                                  deadline.left_ms())
            if ev is None:
                raise Timeout(f"attach state dict '{name}': no newer version than {after.version} within "
                              f'{timeout_ms} ms', -1006, f"attach state dict '{name}'")
    finally:
        client._unsubscribe(sub)


def attach(client, name, framework, timeout_ms, device, after):
    """Client.attach_state_dict()."""
    a = _attach_newer(client, name, timeout_ms, device, after) if after is not None else \
        client.attach(name, timeout_ms, device)
    try:
        info = a.meta.get('state_dict')
        if not isinstance(info, dict):
            raise MetadataError(f"'{name}' is not a state dict (its metadata has no 'state_dict' key)")
        entries = _manifest(client, a, info)
        sd = StateDict(views(a, entries, framework))
    except BaseException:
        a.release()
        raise
    sd._attached = a
    sd.name, sd.version = name, info.get('version', 0)
    sd.generation, sd.buffer_id = a.generation, a.id
    sd.meta = {k: v for k, v in a.meta.items() if k != 'state_dict'}
    return sd
