"""State dicts: a whole dict of arrays published at once, with versions.

Two modes. Snapshot (``copy=True``, the default: the RL trainer's): every array's bytes are copied
into ONE buffer, and versions are double buffered: the Publisher keeps at most `buffers` buffers per
name and writes a buffer again only once it drained, so holders of a version never see it change and
memory stays flat across any number of updates. The buffers come from a pool of the Publisher's own,
so each is exported once, when it is made; reserve_state_dict() makes them ahead, and then the first
version costs a device copy and a round trip, not an allocation and an export.

Live (``copy=False``: the loader that hands one set of weights to N inference processes): the arrays
already lie in pools of the client (``c.pool()``) and stay there. Each segment they use is published
as one view (a *part*, under ``NAME@part.I``), and the manifest, in a small memfd buffer under NAME,
names the parts and where each array lies in them. Nothing is copied, and consumers see the producer's
later writes as they happen; a new version publishes the manifest again (and the parts whose ranges
changed).

Layout: a snapshot buffer holds every array's bytes at an offset aligned to ALIGN, then the manifest,
a msgpack map ``{'format': FORMAT, 'entries': [[key, dtype, shape, offset], ...]}``; a live manifest's
entries are ``[key, dtype, shape, offset, part]`` (the offset within that part). The manifest is
larger than the 4 KiB metadata limit for real models, so it lives in the buffer; the metadata says
where: ``{'state_dict': {'version': n, 'manifest': [offset, length], 'digest': bytes}}``, with
``'parts': [buffer ids]`` for a live one. A consumer that has seen the digest before (the same
layout: the usual weight update) skips reading and parsing the manifest again, and for a buffer it
has mapped already reuses the tensors it made of it.
"""
import collections
import contextlib
import ctypes
import gc
import hashlib
from typing import Any, Dict

import msgpack

from . import _lib, arrays, dlpack, dtypes, errors, fence as fence_mod, meta as _meta
from ._core import Deadline
from .buffer import Buffer, View
from .errors import InvalidArgument, MetadataError, NotFound, Timeout

FORMAT = 'gpuipc.state_dict/1'
ALIGN = 256
_MANIFEST_CACHE_MAX = 16
_VIEWS_CACHE_MAX = 8
_GRANULE = 2 << 20


class Caches:
    """What a client remembers of the state dicts it attached, kept here and held by the client (one
    per connection): manifests parsed, by digest (_manifest), and torch's views per buffer, mapping
    and layout (_cached_views). The views point into attachments: the client forgets them when it
    closes."""

    def __init__(self):
        self.manifests = {}                     # manifest digest -> parsed entries
        self.views = collections.OrderedDict()  # (buffer id, ptr, size, digest) -> views, oldest first

    def forget_views(self):
        self.views.clear()


@contextlib.contextmanager
def gc_paused():
    """Holds the garbage collector off while a state dict's few thousand small objects are made (a
    publish or an attach of 200 arrays). A collection triggered in the middle lands inside the call:
    in a process that holds a model, a full one takes tens of milliseconds (measured: 41 ms beside a
    0.4 ms attach). Paused, it runs at the first allocation after the call instead."""
    enabled = gc.isenabled()
    if enabled:
        gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _describe(key, value):
    try:
        return arrays.describe(value)
    except errors.UnsupportedDtype as e:
        raise errors.UnsupportedDtype(f'state dict entry {key!r}: {e}') from None
    except TypeError:
        raise TypeError(f'state dict entry {key!r} is a {type(value).__name__}, not an array') from None


def _torch_signature(state_dict):
    """What a plan of a dict of torch tensors depends on, cheaply: each key, tensor object, address,
    shape, dtype and whether it is contiguous (the batch of copies reads its bytes as they lie); None
    if not all torch. The cached plan holds the tensors, so ids cannot be reused."""
    sig = []
    for k, v in state_dict.items():
        if not type(v).__module__.startswith('torch'):
            return None
        sig.append((k, id(v), v.data_ptr(), v.shape, v.dtype, v.is_contiguous()))
    return sig


def plan(state_dict):
    """[(key, dtype, shape, offset, array, its dlpack.Info, its bytes)], the manifest bytes and its
    offset, for a dict of arrays."""
    entries, offset, sizes = [], 0, dtypes.ITEMSIZES
    for key, value in state_dict.items():
        if not isinstance(key, str):
            raise TypeError(f'state dict keys must be strings, not {key!r}')
        info = _describe(key, value)
        nbytes = arrays.numel(info.shape) * sizes[info.dtype]
        entries.append((key, info.dtype, list(info.shape), offset, value, info, nbytes))
        offset = _align(offset + nbytes)
    manifest = msgpack.packb({'format': FORMAT, 'entries': [e[:4] for e in entries]}, use_bin_type=True)
    return entries, manifest, offset


# ---- views of a buffer, per framework ----

def _torch_views(base, entries):
    """{key: tensor} over base (a uint8 tensor) for manifest entries (key, dtype, shape, offset): one
    as_strided each, on a view of base per dtype (building 200 views costs what 200 small ops do)."""
    import torch
    out, typed, strides_of = {}, {}, {}  # a model's layers repeat a few shapes: their strides once each
    n, sizes = base.numel(), dtypes.ITEMSIZES
    for key, dtype, shape, offset in entries:
        size = sizes[dtype]
        t = typed.get(dtype)
        if t is None:
            torch_dtype = getattr(torch, dtype, None)
            if torch_dtype is None:
                raise errors.UnsupportedDtype(f'state dict entry {key!r} is {dtype}, which this torch '
                                              f'({torch.__version__}) has no dtype for')
            t = typed[dtype] = base[:n - n % size].view(torch_dtype)
        if offset % size:  # not an offset this module writes; still a valid view
            out[key] = base[offset:offset + arrays.numel(shape) * size].view(t.dtype).view(shape)
            continue
        dims = tuple(shape)
        strides = strides_of.get(dims)
        if strides is None:
            strides = strides_of[dims] = dlpack.contiguous_strides(dims)
        out[key] = t.as_strided(dims, strides, offset // size)
    return out


def _array_views(base, entries, dtype_of):
    # NumPy and CuPy arrays view-cast and reshape the same way
    out, typed = {}, {}
    for key, dtype, shape, offset in entries:
        n = arrays.numel(shape) * dtypes.itemsize(dtype)
        t = typed.get(dtype)
        if t is None:
            try:
                t = typed[dtype] = dtype_of(dtype)
            except (TypeError, errors.UnsupportedDtype) as e:
                raise errors.UnsupportedDtype(f'state dict entry {key!r} is {dtype}: {e} (framework=None gives '
                                              f'views of any dtype, whose bytes .read() returns)') from None
        out[key] = base[offset:offset + n].view(t).reshape(shape)
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


def _cached_views(client, memory, entries, framework, digest):
    """views(), remembered per buffer, mapping and layout: a consumer that attaches a buffer it has
    seen (double buffering: every version from the third on) gets the same arrays again, made once.
    Only torch's: the others are cheap, or not safe to hand out twice."""
    if framework != 'torch' or digest is None:
        return views(memory, entries, framework)
    key = (memory.id, memory.ptr, memory.size, digest)
    cache = client._sd_caches.views
    made = cache.get(key)
    if made is None:
        made = views(memory, entries, framework)
        if len(cache) >= _VIEWS_CACHE_MAX:
            cache.popitem(last=False)
        cache[key] = made
    else:
        cache.move_to_end(key)
    return dict(made)


# ---- copies into a snapshot buffer ----

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


class _SlotCopies:
    """What a slot remembers of the last copy into it: the manifest it holds, the torch views of its
    destinations, and the batch of device copies (valid while the sources stay where they are)."""

    def __init__(self):
        self.digest = None
        self.torch_views = None
        self.items, self.n_items, self.srcs = None, 0, None  # srcs: the plan's entries they were made of


def _batch_copy(slot, entries, copies, digest, stream=None):
    """Every torch array into slot with one library call (device-to-device copies in torch's current
    stream, no kernel: no module to load on the first use). False when the arrays are not all
    contiguous CUDA tensors on the slot's device (then torch copies)."""
    if copies.items is None or copies.srcs is not entries or copies.digest != digest:
        device = (dlpack.KDL_CUDA, slot.device_ordinal)
        if any(e[5].device != device or e[5].strides is not None for e in entries):
            return False
        todo = [e for e in entries if e[6]]
        items = (_lib.Copy * max(len(todo), 1))()
        for item, e in zip(items, todo):
            item.src, item.offset, item.len = e[5].ptr, e[3], e[6]
        # the plan is kept only while its arrays stay where it found them (Publisher._plan)
        copies.items, copies.n_items, copies.srcs = items, len(todo), entries
    raw = fence_mod.stream_handle(stream) if stream is not None else \
        fence_mod.torch_current_stream(slot.device_ordinal)
    slot.copy_in(copies.items, copies.n_items, raw)
    return True


def _torch_stream_ctx(stream, ordinal):
    """torch's `with torch.cuda.stream(...)` for any stream fence.stream_handle() takes (None: as is)."""
    import contextlib
    if stream is None:
        return contextlib.nullcontext()
    import torch
    if isinstance(stream, torch.cuda.Stream):
        return torch.cuda.stream(stream)
    handle = fence_mod.stream_handle(stream)
    return torch.cuda.stream(torch.cuda.ExternalStream(handle, device=ordinal) if handle else
                             torch.cuda.default_stream(ordinal))


def _fill(slot, entries, manifest, manifest_offset, digest, stream=None):
    """Copies every array into slot, each with its own framework (torch's with one batch of device
    copies where it can, in `stream`, default torch's current one), then the manifest unless the
    slot holds it already."""
    copies = slot.copies
    fws = {arrays.framework_of(e[4]) for e in entries}
    if fws == {'torch'} and slot.kind != 'memfd' and _batch_copy(slot, entries, copies, digest, stream):
        pass
    elif fws == {'torch'}:
        if copies.torch_views is None or copies.digest != digest:
            copies.torch_views = _torch_views(slot.torch(), [e[:4] for e in entries])
        dst = copies.torch_views
        with _torch_stream_ctx(stream if slot.kind != 'memfd' else None, slot.device_ordinal):
            _torch_copy([dst[e[0]] for e in entries], [e[4] for e in entries])
    elif fws == {'numpy'} and slot.kind == 'memfd':
        dst = _array_views(slot.numpy(), [e[:4] for e in entries], dtypes.numpy_dtype)
        for e in entries:
            dst[e[0]][...] = e[4]
    else:
        for _, dtype, shape, offset, src, _, _ in entries:
            arrays.copy_into(View(slot.view, offset, dtype, shape), src)
    if copies.digest != digest:
        slot.view.write(manifest, manifest_offset)
        copies.digest = digest


# ---- producer ----

class _Slot:
    """One buffer of a Publisher: an allocation of its pool (exported when the pool made it) and the
    view it is published as, published again (one round trip, nothing travels) once it drained."""

    def __init__(self, client, pool, need):
        self.client, self.pool = client, pool
        self.block = pool._alloc(need)
        h = ctypes.c_void_p()
        with client._locked():
            client._check(_lib.load().gpuipc_pool_view(pool._handle, self.block.ptr, need, ctypes.byref(h)),
                          'make a state dict buffer')
        self.view = Buffer(client, h.value)
        self.size, self.kind = need, pool.kind
        self.device_ordinal = pool.device
        self.copies = _SlotCopies()

    @property
    def handle(self):
        return self.view._handle

    @property
    def id(self):
        return self.view.id

    @property
    def generation(self):
        return self.view.generation

    def torch(self):
        return self.view.torch()

    def numpy(self):
        return self.view.numpy()

    def copy_in(self, items, n, stream):
        c = self.client
        with c._locked():
            c._check(_lib.load().gpuipc_buffer_copy_in(self.view._handle, items, n, stream), 'copy into the state dict')

    @property
    def drained(self):
        c = self.client
        with c._locked():
            _lib.load().gpuipc_process(c._c)
            return _lib.load().gpuipc_wait_drained(c._c, self.view._handle, 0) == 0

    def wait_drained(self, timeout_ms):
        c, deadline = self.client, Deadline(timeout_ms)
        while True:
            ms, last = deadline.next_slice()
            with c._locked():
                r = _lib.load().gpuipc_wait_drained(c._c, self.view._handle, ms)
                if r == errors.E_TIMEOUT and not last:
                    continue
                c._check(r, 'wait for a state dict buffer to drain')
                return

    def retire(self):
        c = self.client
        with c._locked():
            c._check(_lib.load().gpuipc_retire(c._c, self.view._handle), 'retire a state dict version')

    def free(self):
        """The broker forgets the view once drained; the memory goes back to the pool."""
        c = self.client
        if self.view._handle and c._c:
            with c._locked():
                _lib.load().gpuipc_buffer_free(c._c, self.view._handle)
        self.view._handle = None
        self.block = None


class StateDictVersion:
    """One published version (from Client.publish_state_dict): its number, the broker's
    generation and buffer id, its size; `drained` / `wait_drained()` say when no consumer holds it."""

    def __init__(self, publisher, slot, version, generation, nbytes):
        self._publisher, self._slot = publisher, slot
        self.version, self.generation, self.buffer_id, self.nbytes = version, generation, slot.id, nbytes

    def __repr__(self):
        return f'<gpuipc.StateDictVersion {self._publisher.name!r} v{self.version} ({self.nbytes} bytes)>'

    def _superseded(self):
        return not self._slot.handle or self._slot.generation != self.generation

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


def _segment_bytes(need):
    return max((need + _GRANULE - 1) // _GRANULE * _GRANULE, _GRANULE)


class Publisher:
    """The versions of one snapshot state dict name in one Client: its buffers (slots, each a whole
    segment of the Publisher's own pool) and which is live."""

    # The package's internal interface to it: what other modules use, and why (tests/python/layers.py).
    _INTERNAL = {
        '_plan': 'the layout of a state dict: Client.reserve_state_dict writes its manifest ahead',
    }

    live_mode = False

    def __init__(self, client, name):
        self.client, self.name = client, name
        self.slots, self.live, self.version = [], None, 0
        self.pools = {}  # (kind, device) -> Pool whose segments are this name's buffers
        self._planned = None  # (torch signature, plan()): a weight update has the same layout

    def _plan(self, state_dict):
        sig = _torch_signature(state_dict)
        if sig is not None and self._planned is not None and self._planned[0] == sig:
            return self._planned[1]
        result = plan(state_dict)
        self._planned = (sig, result) if sig is not None else None
        return result

    def owns_buffer(self, buffer_id):
        """True if buffer_id is one of this publisher's buffers (its events are internal)."""
        return any(s.handle and s.id == buffer_id for s in self.slots)

    def _pool(self, kind, device, need):
        key = (kind, device if kind != 'memfd' else -1)
        pool = self.pools.get(key)
        if pool is None or pool.closed:
            size = _segment_bytes(need)
            pool = self.pools[key] = self.client.pool(device=device, kind=kind, segment_size=size,
                                                      max_segment_size=size)
        return pool

    def _fits(self, slot, need, kind, device):
        return slot.size >= need and slot.kind == kind and (kind == 'memfd' or slot.device_ordinal == device)

    def _new_slot(self, need, kind, device):
        slot = _Slot(self.client, self._pool(kind, device, need), need)
        self.slots.append(slot)
        return slot

    def _drop(self, slot):
        self.slots.remove(slot)
        slot.free()

    def reserve(self, need, kind, device, buffers, manifest=None, manifest_offset=0):
        """Makes buffers of need bytes (allocated and exported now) until there are `buffers`
        (drained ones that are too small or elsewhere go first), and writes the manifest into those
        not live: a first version then writes no manifest (a host write to device memory waits for
        the GPU work already queued, which would make a fenced publish wait for the GPU)."""
        for slot in [s for s in self.slots if s is not self.live and not self._fits(s, need, kind, device)]:
            if slot.drained:
                self._drop(slot)
        while len(self.slots) < max(buffers, 1):
            self._new_slot(need, kind, device)
        if manifest is None:
            return
        digest = hashlib.blake2b(manifest, digest_size=8).digest()
        for slot in self.slots:
            if slot is not self.live and slot.copies.digest != digest and slot.drained:
                slot.view.write(manifest, manifest_offset)
                slot.copies.digest = digest

    def _take_slot(self, need, kind, device, buffers, timeout_ms):
        for slot in [s for s in self.slots if s is not self.live]:
            if slot.drained:
                if self._fits(slot, need, kind, device):
                    return slot
                self._drop(slot)
        if len(self.slots) < max(buffers, 1):
            return self._new_slot(need, kind, device)
        waiting = [s for s in self.slots if s is not self.live]
        if not waiting:  # buffers=1: the live version must drain before its memory is written again
            self.live.retire()
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
        return self._new_slot(need, kind, device)

    def publish(self, state_dict, kind, device, meta, buffers, timeout_ms, broker_held, fence=None, stream=None):
        if stream is not None and fence is None:
            raise InvalidArgument(f'publish state dict {self.name!r}: stream= orders the copies before a fence; give '
                                  f'fence= too (without one the device is synchronized)')
        with gc_paused():
            entries, manifest, manifest_offset = self._plan(state_dict)
        need = manifest_offset + len(manifest)
        slot = self._take_slot(need, kind, device, buffers, timeout_ms)  # may wait for a drain: collections run
        with gc_paused():
            return self._publish_into(slot, need, entries, manifest, manifest_offset, meta, broker_held, fence,
                                      stream)

    def _publish_into(self, slot, need, entries, manifest, manifest_offset, meta, broker_held, fence, stream):
        digest = hashlib.blake2b(manifest, digest_size=8).digest()
        _fill(slot, entries, manifest, manifest_offset, digest, stream)
        version = self.version + 1
        info = {'version': version, 'manifest': [manifest_offset, len(manifest)], 'digest': digest}
        if fence is not None:
            if stream is None:
                stream = fence_mod.torch_current_stream(slot.device_ordinal)
            info['fence'], info['fence_value'] = fence.name, fence.signal(stream=stream)
        raw = _meta.pack(meta, {'state_dict': info})
        self.client._publish_raw(slot.view, self.name.encode(), raw, broker_held=broker_held,
                                 no_sync=fence is not None)
        self.version = version
        old, self.live = self.live, slot
        if old is not None and old is not slot and old.handle:
            # The broker retired it when the new version took the name; this tells libgpuipc.
            old.retire()
        return StateDictVersion(self, slot, version, slot.generation, need)

    def publish_manifest(self, manifest, info, meta, broker_held, timeout_ms):
        """A live state dict's root: its manifest alone, in a memfd buffer (double buffered like a
        snapshot's), under the name; info goes into its metadata."""
        slot = self._take_slot(len(manifest), 'memfd', -1, 2, timeout_ms)
        slot.view.write(manifest, 0)
        version = self.version + 1
        raw = _meta.pack(meta, {'state_dict': dict(info, version=version, manifest=[0, len(manifest)])})
        self.client._publish_raw(slot.view, self.name.encode(), raw, broker_held=broker_held)
        self.version = version
        old, self.live = self.live, slot
        if old is not None and old is not slot and old.handle:
            old.retire()
        return StateDictVersion(self, slot, version, slot.generation, len(manifest))

    def close(self):
        """Frees every buffer (retiring the live one) and the pools they came from."""
        for slot in list(self.slots):
            slot.free()
        self.slots, self.live, self._planned = [], None, None
        for pool in self.pools.values():
            if not pool.closed:
                pool.close(force=True)
        self.pools.clear()


class LivePublisher:
    """The versions of one live state dict name: the arrays stay in the client's pools; each segment
    they use is published as one view (a part), and the manifest under the name (module docstring)."""

    live_mode = True

    def __init__(self, client, name):
        self.client, self.name = client, name
        self.root = Publisher(client, name)
        self.parts = []  # (pool, base, size, buffer id) of the live version's parts
        self.keep = None  # the live version's arrays: they must stay where the manifest says
        self._laid_out = None  # (torch signature, _layout(), pools, tensors): see _layout

    @property
    def slots(self):
        return self.root.slots

    @property
    def version(self):
        return self.root.version

    def owns_buffer(self, buffer_id):
        return self.root.owns_buffer(buffer_id) or any(p[3] == buffer_id for p in self.parts)

    def _locate(self, state_dict):
        """[(key, dtype, shape, pool, base, size)] for every array, each checked to lie in one segment
        of one of the client's pools; and the parts: {(pool, segment base): [lowest, highest byte)}."""
        located, parts = [], {}
        last = None  # (pool, segment base, segment end) of the previous array: a model's lie together
        for key, value in state_dict.items():
            if not isinstance(key, str):
                raise TypeError(f'state dict keys must be strings, not {key!r}')
            info = _describe(key, value)
            if info.strides is not None:
                raise errors.NotContiguous(f'state dict entry {key!r} is not contiguous: a live state dict lists '
                                           f'each array by offset and shape (publish .contiguous(), or copy=True)')
            base, size = info.ptr, arrays.numel(info.shape) * dtypes.itemsize(info.dtype)
            if last is not None and size and last[1] <= base and base + size <= last[2]:
                pool, seg = last[0], last[1]
            else:
                pool = self.client._pool_of(info)
                if pool is None:
                    raise errors.InvalidArgument(f'state dict entry {key!r} does not lie in a pool of this client: '
                                                 f'allocate the model in c.pool() (with pool: ...), or publish with '
                                                 f'copy=True')
                base, size, (seg, seg_size) = pool._range(info, f'state dict entry {key!r}')
                last = (pool, seg, seg + seg_size)
            span = parts.get((pool, seg))
            if span is None:
                parts[(pool, seg)] = [base, base + size]
            else:
                if base < span[0]:
                    span[0] = base
                if base + size > span[1]:
                    span[1] = base + size
            located.append((key, info.dtype, list(info.shape), pool, base, seg))
        return located, parts

    def _layout(self, state_dict):
        """The parts wanted [(pool, lowest byte, size)], the manifest and its digest; kept while the
        dict holds the same torch tensors at the same addresses (a weight update), as a snapshot's
        plan is, so an update locates nothing again."""
        sig = _torch_signature(state_dict)
        cached = self._laid_out
        if sig is not None and cached is not None and cached[0] == sig and not any(p.closed for p in cached[2]):
            return cached[1]
        located, spans = self._locate(state_dict)
        order = sorted(spans, key=lambda k: spans[k][0])
        index = {k: i for i, k in enumerate(order)}
        wanted = [(k[0], spans[k][0], spans[k][1] - spans[k][0]) for k in order]
        entries = [[key, dtype, shape, base - spans[(pool, seg)][0], index[(pool, seg)]]
                   for key, dtype, shape, pool, base, seg in located]
        manifest = msgpack.packb({'format': FORMAT, 'entries': entries}, use_bin_type=True)
        result = wanted, manifest, hashlib.blake2b(manifest, digest_size=8).digest()
        # holding the tensors keeps their memory, so their segments stay as located
        self._laid_out = (sig, result, {k[0] for k in order}, list(state_dict.values())) if sig is not None else None
        return result

    def publish(self, state_dict, meta, broker_held, timeout_ms):
        with gc_paused():
            wanted, manifest, digest = self._layout(state_dict)
        same = [p[:3] for p in self.parts] == wanted
        if not same:
            old, self.parts = self.parts, []
            for i, (pool, lo, size) in enumerate(wanted):
                info = dlpack.Info(lo, _dl_device(pool), 'uint8', (size,), None, False)
                pid = pool._publish(state_dict, info, f'{self.name}@part.{i}'.encode(), None, None,
                                    broker_held=broker_held)
                self.parts.append((pool, lo, size, pid))
            for pool, lo, size, _ in old:  # replaced under their names: retired; freed once drained
                if not pool.closed:
                    pool._free(dlpack.Info(lo, _dl_device(pool), 'uint8', (size,), None, False))
        self.keep = state_dict
        return self.root.publish_manifest(manifest, {'digest': digest, 'parts': [p[3] for p in self.parts]}, meta,
                                          broker_held, timeout_ms)

    def close(self):
        for pool, lo, size, _ in self.parts:
            if not pool.closed:
                pool._free(dlpack.Info(lo, _dl_device(pool), 'uint8', (size,), None, False))
        self.parts, self.keep, self._laid_out = [], None, None
        self.root.close()


def _dl_device(pool):
    return (dlpack.KDL_CPU, 0) if pool.kind == 'memfd' else (dlpack.KDL_CUDA, pool.device)


# ---- consumer ----

class StateDict(dict):
    """A state dict attached from a broker: {key: zero-copy array}, plus `version` (the producer's
    count), `generation` and `buffer_id` (the broker's), `meta` (the producer's own metadata) and
    `name`; `live` is True for a live state dict (its arrays change when the producer writes them).
    release() (or leaving a ``with`` block) empties the dict and gives the buffers back; arrays taken
    from it must not be used afterwards. Dropped unreleased, it is released once it and all its
    arrays are garbage (with a ResourceWarning)."""

    name: str
    version: int
    generation: int
    buffer_id: int
    meta: Dict[str, Any]
    live: bool
    # Set by attach() below: its client, attachment, live parts and fence.
    _client = _attached = _parts = _fence = None

    def wait_ready(self, stream: Any = None) -> None:
        """If the version was published with a fence, queues in `stream` (default: torch's current
        stream on the buffer's GPU; a torch or CuPy stream or a raw CUstream) a wait until its copies
        are complete. attach_state_dict() did this once for the stream it was given."""
        fence = getattr(self, '_fence', None)
        if fence is None:
            return
        if stream is None:
            stream = fence_mod.torch_current_stream(self._attached.device_ordinal)
        self._client._fence_for(fence[0]).wait(fence[1], stream)

    def release(self) -> None:
        """Empties the dict and releases the buffers (idempotent)."""
        self.clear()
        attached, self._attached = getattr(self, '_attached', None), None
        parts, self._parts = getattr(self, '_parts', None) or [], []
        for part in parts:
            part.release()
        if attached is not None:
            attached.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class _Manifest:
    """A parsed, checked manifest: `entries` [(key, dtype, shape, offset)] as views() takes them and,
    for a live state dict, `parts` {part index: (its entries, the end of the furthest one)}."""

    __slots__ = ('entries', 'parts')

    def __init__(self, entries, parts):
        self.entries, self.parts = entries, parts


def _parse_entries(raw_entries, live, data_end):
    """_Manifest of a manifest's entry lists, each checked (ValueError says what is wrong). One pass,
    no call per field: a model's 200 entries are parsed at every cold attach."""
    width, sizes = (5 if live else 4), dtypes.ITEMSIZES
    max_ndim, int64 = arrays.MAX_NDIM, 1 << 63
    entries, parts, keys = [], {}, set()
    for e in raw_entries:
        if type(e) is not list or len(e) != width:
            raise ValueError(f'entry {e!r:.80} is not a list of {width} fields')
        key, dtype, shape, off = e[0], e[1], e[2], e[3]
        n = sizes.get(dtype) if type(dtype) is str else None
        if n is None:
            raise ValueError(f'entry {key!r} has dtype {dtype!r:.40}, none of gpuipc\'s dtype names')
        # arrays.check_layout's rules, inline: this runs for each of a model's entries
        if type(shape) is not list or len(shape) > max_ndim:
            raise ValueError(f'entry {key!r} has shape {shape!r:.80}')
        span = n
        for x in shape:
            if type(x) is not int or x < 0 or x >= int64:
                raise ValueError(f'entry {key!r} has shape {shape!r:.80}')
            n *= x
            span *= x or 1
        if span >= int64:
            raise ValueError(f'entry {key!r} has shape {shape!r:.80}')
        if type(off) is not int or off < 0:
            raise ValueError(f'entry {key!r} has offset {off!r:.40}')
        # a snapshot's arrays lie before its manifest; a live one's within its part (checked at attach)
        if not live and off + n > data_end:
            raise ValueError(f'entry {key!r} lies outside the data')
        entry = (key if type(key) is str else str(key), dtype, shape, off)
        if entry[0] in keys:  # a dict holds one array per key: a second would hide the first
            raise ValueError(f'entry {key!r} appears twice')
        keys.add(entry[0])
        entries.append(entry)
        if live:
            part = e[4]
            if type(part) is not int or part < 0:
                raise ValueError(f'entry {key!r} names part {part!r:.40}')
            mine = parts.get(part)
            if mine is None:
                mine = parts[part] = [[], 0]
            mine[0].append(entry)
            if off + n > mine[1]:
                mine[1] = off + n
    return _Manifest(entries, {i: tuple(v) for i, v in parts.items()} if live else None)


def _manifest(client, attached, info):
    cache = client._sd_caches.manifests
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
        if type(m) is not dict or m.get('format') != FORMAT:
            raise ValueError(f"format {m.get('format') if type(m) is dict else m!r:.80}")
        if type(m.get('entries')) is not list:
            raise ValueError('no list of entries')
        parsed = _parse_entries(m['entries'], 'parts' in info, offset)
    except Exception as e:
        raise MetadataError(f'state dict {attached.name!r}: unusable manifest ({e})') from None
    if digest is not None:
        if len(cache) >= _MANIFEST_CACHE_MAX:
            cache.pop(next(iter(cache)))
        cache[digest] = parsed
    return parsed


def _attach_newer(client, name, timeout_ms, device, after):
    deadline = Deadline(timeout_ms)
    sub = client._subscribe(name, internal=True)
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
                              f'{timeout_ms} ms', errors.E_TIMEOUT, f"attach state dict '{name}'")
    finally:
        client._unsubscribe(sub)


def _publisher(client, buffer_id):
    """(peer, uid, pid) of the producer of a buffer, as the broker says (a stat without holders)."""
    out = _lib.BufferInfo()
    with client._locked():
        client._check(_lib.load().gpuipc_stat_buffer(client._c, None, buffer_id, None, 0, ctypes.byref(out)),
                      f'stat buffer {buffer_id}')
    return out.owner, out.uid, out.pid


def _same_publisher(a, b):
    """Whether two (peer, uid, pid) are one producer: one uid and one connection, or, while either
    buffer has no owner (its producer died broker-held, or has not registered it again since a broker
    restart), one process (pid 0: outside the broker's PID namespace, then only the uid is known)."""
    if a[1] != b[1]:
        return False
    return a[0] == b[0] if a[0] and b[0] else a[2] == b[2]


def _check_part(root, i, part):
    """Part i must be the state dict's own NAME@part.I, and not the manifest again: a producer's
    manifest can name any buffer id its consumers may attach, not only its own."""
    want = f'{root.name}@part.{i}'
    if part.name != want or part.id == root.id:
        raise MetadataError(f'state dict {root.name!r}: part {i} is buffer {part.id} {part.name!r}, not its own '
                            f'{want!r}')


def _check_publishers(client, root, parts):
    """Every part must come from the manifest's producer: a part published under NAME@part.I by
    another peer (the name was free) is someone else's memory all the same."""
    mine = _publisher(client, root.id)
    for i, part in enumerate(parts):
        theirs = _publisher(client, part.id)
        if not _same_publisher(mine, theirs):
            raise MetadataError(f'state dict {root.name!r}: part {i} (buffer {part.id} {part.name!r}) was published '
                                f'by peer {theirs[0]} (uid {theirs[1]}, pid {theirs[2]}), not by the state dict\'s '
                                f'producer, peer {mine[0]} (uid {mine[1]}, pid {mine[2]})')


def _live_views(client, root, info, manifest, framework, device, digest):
    """The arrays of a live state dict: its parts attached by id, each checked to be a part of this
    publication (its producer's NAME@part.I), each array a view of its part."""
    ids = info['parts']
    if type(ids) is not list or any(type(x) is not int or x <= 0 for x in ids):
        raise MetadataError(f"state dict {root.name!r}: unusable 'parts' {ids!r:.80}")
    parts = []
    try:
        for i, pid in enumerate(ids):
            parts.append(client.attach_id(pid, device))
            _check_part(root, i, parts[-1])
        _check_publishers(client, root, parts)
        if any(i >= len(parts) for i in manifest.parts):
            raise MetadataError(f'state dict {root.name!r}: entries name parts it does not list')
        out = {}
        for i, part in enumerate(parts):
            mine, end = manifest.parts.get(i, ((), 0))
            if end > part.size:
                raise MetadataError(f'state dict {root.name!r}: an entry lies outside part {i} ({end} > {part.size} '
                                    f'bytes)')
            out.update(_cached_views(client, part, mine, framework, digest))
    except BaseException:
        for part in parts:
            part.release()
        raise
    return out, parts


def attach(client, name, framework, timeout_ms, device, after, stream=None):
    """Client.attach_state_dict()."""
    a = _attach_newer(client, name, timeout_ms, device, after) if after is not None else \
        client.attach(name, timeout_ms, device)
    parts = []
    try:
        info = a.meta.get('state_dict')
        if not isinstance(info, dict):
            raise MetadataError(f"'{name}' is not a state dict (its metadata has no 'state_dict' key)")
        with gc_paused():
            manifest = _manifest(client, a, info)
            digest = info.get('digest')
            if 'parts' in info:
                made, parts = _live_views(client, a, info, manifest, framework, device, digest)
            else:
                made = _cached_views(client, a, manifest.entries, framework, digest)
            sd = StateDict(made)
    except BaseException:
        a.release()
        raise
    sd._attached, sd._parts = a, parts
    sd.name, sd.version, sd.live = name, info.get('version', 0), bool(parts)
    sd.generation, sd.buffer_id = a.generation, a.id
    sd.meta = {k: v for k, v in a.meta.items() if k != 'state_dict'}
    sd._client, sd._fence = client, None
    if 'fence' in info and not parts:
        try:
            sd._fence = (str(info['fence']), int(info.get('fence_value', 1)))
        except (TypeError, ValueError):
            sd.release()
            raise MetadataError(f"state dict '{name}': unusable 'fence' in its metadata") from None
        try:
            sd.wait_ready(stream)
        except BaseException:
            sd.release()
            raise
    return sd
