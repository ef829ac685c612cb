"""Broker events (what subscriptions and your own buffers report) and subscriptions."""
import dataclasses

from .buffer import KIND_NAMES

EVENT_TYPES = {1: 'published', 2: 'retired', 3: 'revoked', 4: 'drained', 5: 'reconnected'}


@dataclasses.dataclass(frozen=True)
class Event:
    """One broker event.

    type: 'published', 'retired' (a subscription matched), 'revoked' (a buffer you hold lost its
    memory: its producer died), 'drained' (a buffer you retired, or watch, has no references left),
    'reconnected' (the broker restarted; your buffers were published again).
    subscription: the id of the matching Subscription, 0 for events about your own buffers.
    buffer, generation, kind, name: which publication; reason: the broker's words, if any.
    """

    # The package's internal interface to it: what other modules use, and why (tests/python/layers.py).
    _INTERNAL = {
        '_from_c': "made by the client from libgpuipc's struct",
    }

    type: str
    subscription: int
    buffer: int
    generation: int
    kind: str
    name: str
    reason: str

    @classmethod
    def _from_c(cls, ev):
        return cls(EVENT_TYPES.get(ev.type, str(ev.type)), ev.subscription, ev.buffer, ev.generation,
                   KIND_NAMES.get(ev.kind, ''), ev.name.decode(errors='replace'), ev.reason.decode(errors='replace'))


class Subscription:
    """Events about names starting with `prefix` ('' for all), from `Client.subscribe()`. Take them
    with `Client.next_event()` / `Client.events()` (their `subscription` is this object's `id`);
    `close()` (or leaving a ``with`` block) unsubscribes."""

    def __init__(self, client, sub_id, prefix):
        self._client, self.id, self.prefix = client, sub_id, prefix

    def __repr__(self):
        return f'<gpuipc.Subscription {self.id} prefix={self.prefix!r}>'

    def matches(self, event: Event) -> bool:
        """True if event came from this subscription."""
        return event.subscription == self.id

    def close(self) -> None:
        """Unsubscribes (idempotent)."""
        if self.id:
            sub, self.id = self.id, 0
            self._client._unsubscribe(sub)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
