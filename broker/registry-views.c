/* Read-only views of the registry for listings, stat and stats. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "registry-internal.h"

void registry_buffer_describe(const RegBuffer *b, ProtoMsg *m)
{
        memset(m, 0, sizeof(*m));
        m->buffer = b->id;
        m->name = proto_str(b->name);
        m->generation = b->generation;
        m->kind = b->kind;
        m->state = b->state;
        m->size = b->size;
        m->offset = b->offset;
        m->writable = b->writable;
        m->broker_held = b->broker_held;
        m->refs = b->refs;
        m->holders = b->holders;
        m->owner = b->owner ? b->owner->id : 0;
        m->uid = b->owner_uid;
        m->pid = b->owner_pid;
        m->has = PROTO_BIT(PF_BUFFER) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_GENERATION) | PROTO_BIT(PF_KIND) |
                 PROTO_BIT(PF_STATE) | PROTO_BIT(PF_SIZE) | PROTO_BIT(PF_OFFSET) | PROTO_BIT(PF_WRITABLE) |
                 PROTO_BIT(PF_BROKER_HELD) | PROTO_BIT(PF_REFS) | PROTO_BIT(PF_HOLDERS) |
                 PROTO_BIT(PF_OWNER) | PROTO_BIT(PF_UID) | PROTO_BIT(PF_PID);
        if (b->device) {
                m->device = proto_str(b->device);
                proto_set(m, PF_DEVICE);
        }
        if (b->meta_len) {
                m->meta = (ProtoRaw){ b->meta, b->meta_len, 0 };
                proto_set(m, PF_META);
        }
        if (b->handle) {
                m->handle = (ProtoStr){ (const char *)b->handle, PROTO_LEGACY_HANDLE_SIZE };
                proto_set(m, PF_HANDLE);
        }
        /* Registered again after a restart, and holders may still come back: it does not drain yet. */
        if (b->restored) {
                m->restored = true;
                proto_set(m, PF_RESTORED);
        }
}

RegBuffer *registry_buffer_after(const Registry *r, uint64_t after)
{
        /* Usually the previous page's last buffer is still there: continue right after it. */
        RegBuffer *last = HMAP_FIND(&r->buffers_by_seq, hash_u64(after), RegBuffer, by_seq, b, b->seq == after);

        if (last)
                return registry_buffer_next(r, last);
        list_for_each(pos, &r->buffers) {
                RegBuffer *b = list_entry(pos, RegBuffer, link);
                if (b->seq > after)
                        return b;
        }
        return NULL;
}

uint64_t registry_buffer_cursor(const RegBuffer *b)
{
        return b->seq;
}

RegBuffer *registry_buffer_next(const Registry *r, const RegBuffer *b)
{
        return b->link.next == &r->buffers ? NULL : list_entry(b->link.next, RegBuffer, link);
}

RegBuffer *registry_buffer_by_id(const Registry *r, uint64_t id)
{
        return reg_buffer_lookup(r, id);
}

RegBuffer *registry_buffer_by_name(const Registry *r, const char *name)
{
        RegName *e = reg_name_lookup(r, name);
        return e ? e->live : NULL;
}

const char *registry_buffer_name(const RegBuffer *b)
{
        return b->name;
}

void registry_buffer_holders(const RegBuffer *b, void (*fn)(const RegPeer *p, uint32_t refs, void *ud), void *ud)
{
        list_for_each(pos, &b->holds) {
                const Hold *h = list_entry(pos, Hold, buf_link);
                if (h->count)
                        fn(h->peer, h->count, ud);
        }
}

RegPeer *registry_peer_first(const Registry *r)
{
        return list_empty(&r->peers) ? NULL : list_entry(r->peers.next, RegPeer, link);
}

RegPeer *registry_peer_next(const Registry *r, const RegPeer *p)
{
        return p->link.next == &r->peers ? NULL : list_entry(p->link.next, RegPeer, link);
}

void registry_gauges(const Registry *r, RegGauges *g)
{
        memset(g, 0, sizeof(*g));
        g->peers = r->n_peers;
        g->buffers = r->n_buffers;
        g->refs = r->n_refs;
        g->fds = r->n_fds;
        g->waits = r->n_waits;
        g->subs = r->n_subs;
        g->groups = r->n_groups;
        g->names = r->names.count;
        g->live = r->n_state[PROTO_STATE_LIVE];
        g->retired = r->n_state[PROTO_STATE_RETIRED];
        g->idle = r->n_state[PROTO_STATE_IDLE];
        g->orphaned = r->n_orphaned;
        g->claims_pending = r->n_claims;
        g->rings = r->n_rings;
        g->ring_members = r->n_seated;
        list_for_each(pos, &r->restored)
                g->restored++;
}

uint64_t registry_epoch(const Registry *r)
{
        return r->epoch;
}

const RegCounters *registry_counters(const Registry *r)
{
        return &r->counters;
}
