/* Status codes carried in a reply's "status" field. 0 is success; every other code has a stable
 * kebab-case name (the reply's "error" field) and a default text naming the cause and the fix. */
#pragma once

typedef enum ProtoStatus {
        PROTO_STATUS_OK = 0,
        PROTO_STATUS_BAD_REQUEST = 1,    /* a field missing or of the wrong type; connection stays */
        PROTO_STATUS_PROTOCOL = 2,       /* a framing violation; the broker closes the connection */
        PROTO_STATUS_VERSION = 3,        /* protocol version not supported */
        PROTO_STATUS_UNKNOWN_OP = 4,
        PROTO_STATUS_NOT_FOUND = 5,      /* no such buffer, name, or subscription */
        PROTO_STATUS_TIMEOUT = 6,        /* an attach or a group join waited its whole timeout */
        PROTO_STATUS_NAME_TAKEN = 7,     /* another peer has a live buffer under that name */
        PROTO_STATUS_QUOTA = 8,          /* a per-uid or per-peer limit */
        PROTO_STATUS_DENIED = 9,         /* the policy does not allow it */
        PROTO_STATUS_NOT_OWNER = 10,     /* only the producer (or its uid, once it died) may do this */
        PROTO_STATUS_NOT_ATTACHED = 11,  /* release without a reference */
        PROTO_STATUS_STATE = 12,         /* the buffer is not in a state that allows this */
        PROTO_STATUS_BAD_FD = 13,        /* the fd is missing, of the wrong type, size or seals */
        PROTO_STATUS_PIDNS = 14,         /* retired: no broker sends it since same-pid (23) replaced it */
        PROTO_STATUS_DEVICE = 15,        /* the buffer's GPU is not visible to the consumer */
        PROTO_STATUS_GROUP_MISMATCH = 16,/* joined a group with another member count */
        PROTO_STATUS_REVOKED = 17,       /* the buffer is gone or is not the publication the client held
                                          * (reclaim); libgpuipc also uses it for reads of a revoked buffer */
        PROTO_STATUS_HELLO_FIRST = 18,   /* hello must be the first request */
        PROTO_STATUS_SHUTDOWN = 19,      /* the broker is stopping */
        PROTO_STATUS_KIND = 20,          /* the buffer kind does not allow this */
        PROTO_STATUS_INVALID = 21,       /* a value out of range: a bad name, a zero size */
        PROTO_STATUS_KEY_TAKEN = 22,     /* the buffer id (key) a publish chose is registered already */
        PROTO_STATUS_SAME_PID = 23,      /* cuda-legacy between two processes with the same PID value */
        PROTO_STATUS_SHM = 24,           /* a CUDA IPC event between processes with different /dev/shm
                                          * (libgpuipc's own verdict: no broker sends it) */
        _PROTO_STATUS_MAX,
} ProtoStatus;

/* "not-found", ...; "unknown" for codes out of range. */
const char *proto_status_name(unsigned status);

/* A sentence naming the cause and the usual fix. */
const char *proto_status_text(unsigned status);
