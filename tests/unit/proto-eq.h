/* Field-by-field comparison of two decoded messages (shared by the proto unit test and the frame
 * fuzzer). Strings and raw parts are compared by content, since they point into different bodies. */
#pragma once

#include <stdbool.h>
#include <string.h>

#include "proto.h"

static inline bool proto_eq_str_(ProtoStr a, ProtoStr b)
{
        return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

static inline bool proto_eq_raw_(ProtoRaw a, ProtoRaw b)
{
        return a.len == b.len && a.count == b.count && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

/* True when a and b carry the same fields with the same values; else *ret_diff (if not NULL) is
 * the first field that differs, or _PF_MAX for the type or the presence mask. */
static inline bool proto_msg_eq(const ProtoMsg *a, const ProtoMsg *b, ProtoField *ret_diff)
{
        ProtoField d = _PF_MAX;

        if (a->type != b->type || a->has != b->has)
                goto out;
        d = PF_OP;
        if (proto_has(a, d) && a->op != b->op)
                goto out;
        d = PF_EVENT;
        if (proto_has(a, d) && a->event != b->event)
                goto out;
        d = PF_KIND;
        if (proto_has(a, d) && a->kind != b->kind)
                goto out;
        d = PF_STATE;
        if (proto_has(a, d) && a->state != b->state)
                goto out;
        d = PF_MODE;
        if (proto_has(a, d) && a->mode != b->mode)
                goto out;
        d = PF_SEAT;
        if (proto_has(a, d) && a->seat != b->seat)
                goto out;
        {
                static const struct { ProtoField f; size_t off; } u64s[] = {
                        { PF_ID, offsetof(ProtoMsg, id) }, { PF_REPLY, offsetof(ProtoMsg, reply) },
                        { PF_STATUS, offsetof(ProtoMsg, status) }, { PF_VERSION, offsetof(ProtoMsg, version) },
                        { PF_PID, offsetof(ProtoMsg, pid) }, { PF_PIDNS, offsetof(ProtoMsg, pidns) },
                        { PF_UID, offsetof(ProtoMsg, uid) }, { PF_GID, offsetof(ProtoMsg, gid) },
                        { PF_SIZE, offsetof(ProtoMsg, size) }, { PF_OFFSET, offsetof(ProtoMsg, offset) },
                        { PF_RETIRE_AFTER, offsetof(ProtoMsg, retire_after) },
                        { PF_TIMEOUT_MS, offsetof(ProtoMsg, timeout_ms) },
                        { PF_BUFFER, offsetof(ProtoMsg, buffer) }, { PF_GENERATION, offsetof(ProtoMsg, generation) },
                        { PF_REFS, offsetof(ProtoMsg, refs) }, { PF_HOLDERS, offsetof(ProtoMsg, holders) },
                        { PF_OWNER, offsetof(ProtoMsg, owner) }, { PF_PEER, offsetof(ProtoMsg, peer) },
                        { PF_SUB, offsetof(ProtoMsg, sub) }, { PF_MEMBERS, offsetof(ProtoMsg, members) },
                        { PF_EPOCH, offsetof(ProtoMsg, epoch) }, { PF_AFTER, offsetof(ProtoMsg, after) },
                        { PF_LIMIT, offsetof(ProtoMsg, limit) }, { PF_VALUE, offsetof(ProtoMsg, value) },
                        { PF_BUFFERS, offsetof(ProtoMsg, buffers) }, { PF_SUBS, offsetof(ProtoMsg, subs) },
                        { PF_WAITS, offsetof(ProtoMsg, waits) }, { PF_FDS, offsetof(ProtoMsg, fds) },
                        { PF_STARTED_MS, offsetof(ProtoMsg, started_ms) },
                        { PF_INDEX, offsetof(ProtoMsg, index) }, { PF_SLOTS, offsetof(ProtoMsg, slots) },
                        { PF_LE_US, offsetof(ProtoMsg, le_us) },
                        { PF_HEAD, offsetof(ProtoMsg, head) }, { PF_TAKEN, offsetof(ProtoMsg, taken) },
                        { PF_POSITION, offsetof(ProtoMsg, position) }, { PF_LAG, offsetof(ProtoMsg, lag) },
                        { PF_SEGMENT, offsetof(ProtoMsg, segment) },
                        { PF_SEGMENT_SIZE, offsetof(ProtoMsg, segment_size) },
                        { PF_SELF_PID, offsetof(ProtoMsg, self_pid) },
                        { PF_SHM_DEV, offsetof(ProtoMsg, shm_dev) }, { PF_SHM_INO, offsetof(ProtoMsg, shm_ino) },
                };
                static const struct { ProtoField f; size_t off; } bools[] = {
                        { PF_BROKER_HELD, offsetof(ProtoMsg, broker_held) },
                        { PF_WRITABLE, offsetof(ProtoMsg, writable) }, { PF_CACHED, offsetof(ProtoMsg, cached) },
                        { PF_MORE, offsetof(ProtoMsg, more) }, { PF_PIDNS_SAME, offsetof(ProtoMsg, pidns_same) },
                        { PF_RESTORED, offsetof(ProtoMsg, restored) }, { PF_PENDING, offsetof(ProtoMsg, pending) },
                        { PF_PIDNS_DECLARED, offsetof(ProtoMsg, pidns_declared) },
                };
                static const struct { ProtoField f; size_t off; } strs[] = {
                        { PF_ERROR, offsetof(ProtoMsg, error) }, { PF_MESSAGE, offsetof(ProtoMsg, message) },
                        { PF_LABEL, offsetof(ProtoMsg, label) }, { PF_NAME, offsetof(ProtoMsg, name) },
                        { PF_PREFIX, offsetof(ProtoMsg, prefix) }, { PF_DEVICE, offsetof(ProtoMsg, device) },
                        { PF_REASON, offsetof(ProtoMsg, reason) }, { PF_GROUP, offsetof(ProtoMsg, group) },
                        { PF_HANDLE, offsetof(ProtoMsg, handle) },
                };
                const char *pa = (const char *)a, *pb = (const char *)b;

                for (size_t i = 0; i < sizeof(u64s) / sizeof(u64s[0]); i++) {
                        d = u64s[i].f;
                        if (proto_has(a, d) && *(const uint64_t *)(pa + u64s[i].off) !=
                                                       *(const uint64_t *)(pb + u64s[i].off))
                                goto out;
                }
                for (size_t i = 0; i < sizeof(bools) / sizeof(bools[0]); i++) {
                        d = bools[i].f;
                        if (proto_has(a, d) && *(const bool *)(pa + bools[i].off) != *(const bool *)(pb + bools[i].off))
                                goto out;
                }
                for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++) {
                        d = strs[i].f;
                        if (proto_has(a, d) && !proto_eq_str_(*(const ProtoStr *)(pa + strs[i].off),
                                                              *(const ProtoStr *)(pb + strs[i].off)))
                                goto out;
                }
        }
        d = PF_META;
        if (proto_has(a, d) && !proto_eq_raw_(a->meta, b->meta))
                goto out;
        d = PF_ITEMS;
        if (proto_has(a, d) && !proto_eq_raw_(a->items, b->items))
                goto out;
        d = PF_GPUS;
        if (proto_has(a, PF_GPUS)) {
                if (a->n_gpus != b->n_gpus)
                        goto out;
                for (uint32_t i = 0; i < a->n_gpus; i++)
                        if (!proto_eq_str_(a->gpus[i], b->gpus[i]))
                                goto out;
        }
        return true;
out:
        if (ret_diff)
                *ret_diff = d;
        return false;
}
