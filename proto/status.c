/* Names and default texts of reply status codes. The texts say what happened and what to do. */
#include "status.h"

/* Indexed by the status number, which is the wire value: a status is never renumbered, only added
 * at the end (the library maps status N to -(1000 + N), GPUIPC_ERRNO_MAP, and programs compare
 * with those). The names are stable too (docs/protocol.md), the texts may be improved. */
static const struct {
        const char *name, *text;
} statuses[_PROTO_STATUS_MAX] = {
        [PROTO_STATUS_OK] = { "ok", "success" },
        [PROTO_STATUS_BAD_REQUEST] = { "bad-request",
                "the request is missing a field or has one of the wrong type; see docs/protocol.md" },
        [PROTO_STATUS_PROTOCOL] = { "protocol",
                "the frame violates the protocol (framing, size or fd count) and the broker closed the connection; "
                "use libgpuipc, or follow docs/protocol.md exactly" },
        [PROTO_STATUS_VERSION] = { "version",
                "the broker does not speak this protocol version; use a client and broker of the same release" },
        [PROTO_STATUS_UNKNOWN_OP] = { "unknown-op", "the broker does not know this operation; upgrade the broker" },
        [PROTO_STATUS_NOT_FOUND] = { "not-found",
                "no such buffer, ring, name or subscription; check the name (gpuipcctl ls lists what is "
                "published) and that both sides use the same socket, or attach with a timeout to wait for it" },
        [PROTO_STATUS_TIMEOUT] = { "timeout",
                "the wait ended first: nothing was published under that name, the group did not fill, or the "
                "broker did not answer in time; check the producer (and the broker) run and use the same name "
                "and socket, or wait longer" },
        [PROTO_STATUS_NAME_TAKEN] = { "name-taken",
                "another producer has a live buffer under this name; retire it first or pick another name" },
        [PROTO_STATUS_QUOTA] = { "quota",
                "a broker limit was reached (buffers, fds, waits, subscriptions or connections for this uid); "
                "release what you hold or raise the limit with the broker's --max-* flags" },
        [PROTO_STATUS_DENIED] = { "denied",
                "the broker's policy does not allow this uid/gid to do this on that name; see the policy file" },
        [PROTO_STATUS_NOT_OWNER] = { "not-owner",
                "only the producer of a buffer (or a peer of its uid once it died) may retire or free it; do it from "
                "the producer's connection, or as a policy admin" },
        [PROTO_STATUS_NOT_ATTACHED] = { "not-attached",
                "this connection holds no reference to that buffer; release only what this connection attached, "
                "once per attach" },
        [PROTO_STATUS_STATE] = { "state",
                "the buffer is not in a state that allows this (retired buffers take no new attaches; "
                "only idle buffers can be published again); wait for drained before publishing it again, and "
                "attach a live one" },
        [PROTO_STATUS_BAD_FD] = { "bad-fd",
                "the buffer's file descriptor is missing or wrong; send a memfd sealed against growing and "
                "shrinking and exactly as large as announced, a read-only buffer read-only, and never a socket "
                "(libgpuipc does)" },
        [PROTO_STATUS_PIDNS] = { "pidns",
                "(a status no broker sends any more: it claimed that cuda-legacy needs one PID namespace, which "
                "measurement disproved; see same-pid)" },
        [PROTO_STATUS_DEVICE] = { "device",
                "the buffer lives on a GPU the consumer cannot see; give producer and consumer the same "
                "ResourceClaim (or the same visible devices)" },
        [PROTO_STATUS_GROUP_MISMATCH] = { "group-mismatch",
                "the group already exists with another member count; pass the same count from every member, or "
                "pick another group name" },
        [PROTO_STATUS_REVOKED] = { "revoked",
                "the buffer was revoked: its producer died (publish with broker-held lifetime, memfd or "
                "cuda-vmm, to let buffers outlive their producer), or it did not come back within the broker's "
                "restart grace; stop using the memory" },
        [PROTO_STATUS_HELLO_FIRST] = { "hello-first",
                "the first request on a connection must be hello; send it first (docs/protocol.md), as "
                "libgpuipc does" },
        [PROTO_STATUS_SHUTDOWN] = { "shutdown", "the broker is shutting down; reconnect once it is back" },
        [PROTO_STATUS_KIND] = { "kind",
                "this buffer kind does not allow the operation (cuda-legacy memory dies with its producer, so "
                "it cannot be broker-held; use cuda-vmm)" },
        [PROTO_STATUS_INVALID] = { "invalid",
                "a value is out of range or unset; gpuipc_errmsg() names it. Set every options struct's "
                "struct_size to its sizeof, give names of 1-255 bytes of [A-Za-z0-9._:/@+=-] without '..' or a "
                "leading '/', and sizes above 0" },
        [PROTO_STATUS_KEY_TAKEN] = { "key-taken",
                "another registration already uses this buffer id; draw a fresh random id for every allocation "
                "and never reuse one (libgpuipc does)" },
        [PROTO_STATUS_SAME_PID] = { "same-pid",
                "the producer and consumer of this cuda-legacy buffer have the same PID in their own PID "
                "namespaces (both PID 1 of their containers, say), and CUDA takes such a handle for one of the "
                "opener's own ('invalid device context'); start one of them at another PID (gpuipcctl run -- "
                "CMD) or publish the buffer as cuda-vmm" },
        [PROTO_STATUS_SHM] = { "shm",
                "CUDA IPC events open only between processes that see the same /dev/shm; mount one emptyDir "
                "(medium: Memory) at /dev/shm in both containers, or use a counter fence (gpuipc_fence_create), "
                "which needs neither" },
};

/* A status from a newer broker is shown as "unknown", not looked up past the table. */
const char *proto_status_name(unsigned status)
{
        return status < _PROTO_STATUS_MAX ? statuses[status].name : "unknown";
}

const char *proto_status_text(unsigned status)
{
        return status < _PROTO_STATUS_MAX ? statuses[status].text : "unknown status code";
}
