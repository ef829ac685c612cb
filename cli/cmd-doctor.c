/* gpuipcctl doctor: what an operator checks first, each with a verdict in plain words. Every check
 * runs whatever the others found: without a broker the driver and the GPUs are still worth
 * knowing about. Checks that depend on something missing say so (verdict "??") instead of being
 * left out. What it must never do: change anything it looks at, or say "ok" about what it could
 * not test. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "ctl.h"
#include "json.h"

/* V_NONE: the check does not apply here (the GPU checks without CUDA): neither passed nor failed.
 * V_WARN: nothing fails yet, but a likely setup would (this process as PID 1): not a problem. */
typedef enum Verdict { V_OK, V_FAIL, V_UNKNOWN, V_NONE, V_WARN } Verdict;

#define PAGE 256
#define MAX_LEGACY_STATS 1024 /* cuda-legacy buffers whose holders are asked for: one request each */
#define STR(x) #x
#define TOSTR(x) STR(x)
#define MAX_LISTED 8          /* peers named in one line; the JSON lists them all */

/* A peer this process's PID collides with, as cuda-legacy sees it. */
typedef struct Collision {
        uint64_t peer, buffer;
        bool producer; /* it published the buffer (else it holds it) */
        char name[GPUIPC_MAX_NAME + 1];
} Collision;

typedef struct Doctor {
        Ctl *ctl;
        int problems;
        bool no_gpu; /* CUDA is not usable: the GPU checks did not run */
        Json json, checks; /* --json: {"checks": [...], ...} */
        /* This process as cuda-legacy and IPC events see it, for the JSON's "self" too. */
        uint64_t self_pid, shm_dev, shm_ino;
        Collision *collisions;
        size_t n_collisions;
        gpuipc_peer_info_t *shm_others; /* peers that declared another /dev/shm */
        size_t n_shm_others;
} Doctor;

static void verdict(Doctor *d, Verdict v, const char *check, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));

/* One check's line (or JSON record). Every check reports through here so that the text and the JSON
 * say the same, and so that FAILs are counted for the exit status in one place; the text column is
 * fixed width so a person scans the verdicts down the left edge. */
static void verdict(Doctor *d, Verdict v, const char *check, const char *fmt, ...)
{
        static const char *const text[] = {
                [V_OK] = " ok ", [V_FAIL] = "FAIL", [V_UNKNOWN] = " ?? ", [V_NONE] = " -- ", [V_WARN] = "warn",
        };
        static const char *const name[] = {
                [V_OK] = "ok", [V_FAIL] = "fail", [V_UNKNOWN] = "unknown", [V_NONE] = "none", [V_WARN] = "warn",
        };
        char detail[1024];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(detail, sizeof(detail), fmt, ap);
        va_end(ap);
        d->problems += v == V_FAIL;
        if (d->ctl->json) {
                Json o;
                json_next(&d->checks);
                json_begin(&o, stdout, '{');
                /* "check" and "verdict" are the words scripts match (the verdict's name, not the
                 * text column's " ok "/"FAIL"); "detail" is prose for people. */
                json_kstr(&o, "check", check);
                json_kstr(&o, "verdict", name[v]);
                json_kstr(&o, "detail", detail);
                json_end(&o, '}');
        } else {
                printf("[%s] %-14s %s\n", text[v], check, detail);
        }
}

/* The socket file as a client meets it: there, a socket, and writable by us. Each failure names
 * the fix a pod's spec needs, since that is where these go wrong in practice. */
static bool check_socket(Doctor *d, const char *path)
{
        struct stat st;

        /* stat, not lstat: a symlink to the socket (a mounted directory's alias) is what a client
         * follows too. */
        if (stat(path, &st) < 0) {
                verdict(d, V_FAIL, "socket", "%s: %s. Is the broker running, and is its socket directory mounted "
                        "here (an emptyDir shared by the pod's containers)?", path, strerror(errno));
                return false;
        }
        if (!S_ISSOCK(st.st_mode)) {
                verdict(d, V_FAIL, "socket", "%s exists but is not a socket", path);
                return false;
        }
        /* connect(2) on a Unix socket needs write permission on the file: this is the error a
         * client would otherwise meet as a bare EACCES. */
        if (access(path, W_OK) < 0) {
                verdict(d, V_FAIL, "socket", "%s (mode %04o, uid %u, gid %u) is not writable by uid %u gid %u: run "
                        "in the socket's group (fsGroup or supplementalGroups)", path, (unsigned)(st.st_mode & 07777),
                        (unsigned)st.st_uid, (unsigned)st.st_gid, (unsigned)getuid(), (unsigned)getgid());
                return false;
        }
        verdict(d, V_OK, "socket", "%s (mode %04o, gid %u)", path, (unsigned)(st.st_mode & 07777),
                (unsigned)st.st_gid);
        return true;
}

/* Connects and pings. Without a socket file, one attempt: waiting for it would only delay the
 * other checks. */
static bool check_broker(Doctor *d, bool socket_ok)
{
        gpuipc_connection_info_t info;
        gpuipc_options_t o = { .struct_size = sizeof(o) };
        uint64_t start;
        int r;

        /* GPUs are probed at connect (no_gpus unset): the connection then declares them as an
         * application's would, and the broker checks see what an application meets. */
        /* Not ctl_connect, which would report a failure as the command's error (with --json, as
         * the error document) and end it: here a failed connect is one verdict among the rest. */
        o.socket_path = d->ctl->socket;
        o.label = "gpuipcctl";
        o.connect_timeout_ms = socket_ok ? d->ctl->timeout_ms : 0;
        r = gpuipc_connect(&d->ctl->c, &o);
        if (r < 0) {
                d->ctl->c = NULL;
                verdict(d, V_FAIL, "broker", "[%s] %s", gpuipc_err_name(r), gpuipc_errmsg(NULL));
                return false;
        }
        /* Timed from after the connect: this is the broker's responsiveness, not the CUDA probe's
         * or the hello's cost (ping times both). */
        start = monotonic_ms();
        r = gpuipc_ping(d->ctl->c, d->ctl->timeout_ms);
        if (r < 0) {
                verdict(d, V_FAIL, "broker", "no answer to ping: [%s] %s", gpuipc_err_name(r),
                        gpuipc_errmsg(d->ctl->c));
                return false;
        }
        gpuipc_connection_info(d->ctl->c, &info);
        verdict(d, V_OK, "broker", "answers (%" PRIu64 " ms round trip), peer id %" PRIu64, monotonic_ms() - start,
                info.peer);
        return true;
}

/* Informational: whether the broker sees this process's PID itself or takes it as declared. It is
 * never a FAIL, since it breaks nothing by itself; the pid check judges what it means for
 * cuda-legacy. Without a broker only our own namespace is known, so the verdict is unknown. */
static void check_pidns(Doctor *d, bool connected)
{
        gpuipc_connection_info_t info;
        struct stat st;

        if (!connected) {
                verdict(d, V_UNKNOWN, "pid-namespace", "%" PRIu64 " here; cannot compare it with the broker's without "
                        "a broker", stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0);
                return;
        }
        gpuipc_connection_info(d->ctl->c, &info);
        /* Either way ok: every kind works across PID namespaces. What differs is whose word the broker
         * has for this process's PID (the pid line says what cuda-legacy needs of it). */
        if (info.pidns_same)
                verdict(d, V_OK, "pid-namespace", "same as the broker (%" PRIu64 "): it sees this process's PID itself",
                        info.pidns);
        else
                verdict(d, V_OK, "pid-namespace", "%" PRIu64 ", not the broker's: it takes this process's PID as "
                        "declared; every kind works across PID namespaces (cuda-legacy: if the two PIDs differ)",
                        info.pidns);
}

/* This process's own PID and /dev/shm: the connection's view when there is one, else the same
 * facts read here (the library reads them the same way). */
static void self_identity(Doctor *d, bool connected)
{
        gpuipc_connection_info_t info;
        struct stat st;

        if (connected && gpuipc_connection_info(d->ctl->c, &info) == 0) {
                d->self_pid = info.self_pid;
                d->shm_dev = info.shm_dev;
                d->shm_ino = info.shm_ino;
                return;
        }
        d->self_pid = (uint64_t)getpid();
        if (stat("/dev/shm", &st) == 0) {
                d->shm_dev = (uint64_t)st.st_dev;
                d->shm_ino = (uint64_t)st.st_ino;
        }
}

/* Every peer the broker shows, into a growing array (bounded by the broker's own connection
 * limit, which the listing cannot exceed). NULL with *n 0 when the listing failed. */
static gpuipc_peer_info_t *list_peers(Doctor *d, size_t *n, int *err)
{
        gpuipc_peer_info_t *all = NULL, *grown;
        uint64_t cursor = 0;
        size_t cap = 0;
        int r;

        *n = 0;
        do {
                if (cap - *n < PAGE) {
                        grown = realloc(all, (cap + PAGE) * sizeof(*all));
                        if (!grown) {
                                r = -ENOMEM;
                                break;
                        }
                        all = grown;
                        cap += PAGE;
                }
                r = gpuipc_list_peers(d->ctl->c, &cursor, all + *n, PAGE);
                if (r > 0)
                        *n += (size_t)r;
        } while (r > 0 && cursor);
        *err = r < 0 ? r : 0;
        if (r < 0) {
                free(all);
                *n = 0;
                return NULL;
        }
        return all;
}

/* A linear search: the listing is short (one per connection) and each lookup is per collision. */
static const gpuipc_peer_info_t *peer_by_id(const gpuipc_peer_info_t *peers, size_t n, uint64_t id)
{
        for (size_t i = 0; i < n; i++)
                if (peers[i].peer == id)
                        return &peers[i];
        return NULL;
}

/* Notes one collision for the report. Out of memory drops it silently: doctor is a diagnosis, and a
 * shorter list is better than none. */
static void collide(Doctor *d, uint64_t peer, const gpuipc_buffer_info_t *b, bool producer)
{
        Collision *grown = realloc(d->collisions, (d->n_collisions + 1) * sizeof(*grown));

        if (!grown)
                return;
        d->collisions = grown;
        grown[d->n_collisions] = (Collision){ .peer = peer, .buffer = b->buffer, .producer = producer };
        snprintf(grown[d->n_collisions].name, sizeof(grown->name), "%s", b->name);
        d->n_collisions++;
}

/* The cuda-legacy buffers this process could not share with: published by a process of the same
 * PID (its handle would not open here) or held by one (it could not open a handle from here). */
static int find_collisions(Doctor *d, const gpuipc_peer_info_t *peers, size_t n_peers, size_t *n_legacy,
                           bool *capped)
{
        gpuipc_buffer_info_t *page = calloc(PAGE, sizeof(*page)), b;
        gpuipc_holder_info_t *holders = calloc(GPUIPC_MAX_PAGE, sizeof(*holders));
        uint64_t cursor = 0;
        int n, h, r = 0;

        *n_legacy = 0;
        *capped = false;
        if (!page || !holders) {
                r = -ENOMEM;
                goto out;
        }
        do {
                n = gpuipc_list_buffers(d->ctl->c, NULL, &cursor, page, PAGE);
                for (int i = 0; i < n; i++) {
                        if (page[i].kind != GPUIPC_KIND_CUDA_LEGACY || page[i].state != GPUIPC_STATE_LIVE)
                                continue;
                        /* Each one costs a stat request: past the cap the rest are counted, not
                         * checked, and the verdict says so. */
                        if (++*n_legacy > MAX_LEGACY_STATS) {
                                *capped = true;
                                continue;
                        }
                        /* self_pid 0 is unknown, never a match. */
                        if (page[i].self_pid && page[i].self_pid == d->self_pid)
                                collide(d, page[i].owner, &page[i], true);
                        /* Its holders: the peers reading it, whose PIDs the listing knows. */
                        /* A buffer gone since the listing (h < 0) has no holders left to check. The
                         * producer is skipped among them: it was checked above, as the producer. */
                        h = gpuipc_stat_buffer(d->ctl->c, NULL, page[i].buffer, holders, GPUIPC_MAX_PAGE, &b);
                        for (int k = 0; k < h; k++) {
                                const gpuipc_peer_info_t *p = peer_by_id(peers, n_peers, holders[k].peer);

                                if (p && p->self_pid && p->self_pid == d->self_pid && p->peer != page[i].owner)
                                        collide(d, p->peer, &page[i], false);
                        }
                }
        } while (n > 0 && cursor);
        if (n < 0)
                r = n;
out:
        free(page);
        free(holders);
        return r;
}

/* This process's PID in its own namespace, against the cuda-legacy producers and holders the
 * broker knows: CUDA takes a handle whose exporting PID equals the opener's for the opener's own
 * (201), and the broker refuses such an attach first (same-pid). */
static void check_pid(Doctor *d, bool connected, const gpuipc_peer_info_t *peers, size_t n_peers, int peers_err)
{
        char list[512] = "";
        size_t n_legacy = 0, used = 0;
        bool capped = false;
        int r;

        if (!connected) {
                verdict(d, V_UNKNOWN, "pid", "%" PRIu64 " in this PID namespace; cannot compare it with cuda-legacy "
                        "producers' without a broker", d->self_pid);
                return;
        }
        if (peers_err < 0 || (r = find_collisions(d, peers, n_peers, &n_legacy, &capped)) < 0) {
                verdict(d, V_UNKNOWN, "pid", "%" PRIu64 " in this PID namespace; the broker did not list its "
                        "cuda-legacy buffers: [%s]", d->self_pid, gpuipc_err_name(peers_err < 0 ? peers_err : r));
                return;
        }
        /* The first few by name, so the line stays readable; --json lists them all. */
        for (size_t i = 0; i < d->n_collisions && i < MAX_LISTED && used < sizeof(list); i++)
                used += (size_t)snprintf(list + used, sizeof(list) - used, "%s%s of '%s' (peer %" PRIu64 ")",
                                         i ? ", " : "", d->collisions[i].producer ? "the producer" : "a holder",
                                         d->collisions[i].name, d->collisions[i].peer);
        if (d->n_collisions)
                verdict(d, V_FAIL, "pid", "%" PRIu64 " in this PID namespace, the same as %s%s: cuda-legacy handles "
                        "cannot pass between them (same-pid). %s", d->self_pid, list,
                        d->n_collisions > MAX_LISTED ? ", ..." : "",
                        d->self_pid == 1 ? "Both are their containers' first process: start the workload with "
                        "gpuipcctl run -- CMD, which picks a PID no peer has"
                                         : "Start one of them with gpuipcctl run -- CMD, or publish as cuda-vmm");
        /* No collision now, but PID 1 is the one every container's first process has: a warning,
         * since the next legacy peer started the same way would collide. */
        else if (d->self_pid == 1)
                verdict(d, V_WARN, "pid", "1 in this PID namespace (a container's first process): any other "
                        "container's PID 1 would be the same, and cuda-legacy handles cannot pass between equal PIDs; "
                        "start the workload with gpuipcctl run -- CMD");
        else
                verdict(d, V_OK, "pid", "%" PRIu64 " in this PID namespace: none of the %zu live cuda-legacy "
                        "buffer(s)%s has a producer or holder with the same PID", d->self_pid, n_legacy,
                        capped ? " (the first " TOSTR(MAX_LEGACY_STATS) " checked)" : "");
}

/* This process's /dev/shm, and the peers that declared another: CUDA IPC events (gpuipc's
 * IPC-event fences) need the same on both sides; memory handles and counter fences do not. */
static void check_shm(Doctor *d, bool connected, const gpuipc_peer_info_t *peers, size_t n_peers, int peers_err)
{
        char list[512] = "";
        size_t used = 0;

        if (!d->shm_dev && !d->shm_ino) {
                verdict(d, V_UNKNOWN, "dev-shm", "no /dev/shm here: IPC-event fences cannot be created or opened; "
                        "counter fences work");
                return;
        }
        if (!connected || peers_err < 0) {
                verdict(d, connected ? V_UNKNOWN : V_OK, "dev-shm", "device %" PRIu64 " inode %" PRIu64 "%s",
                        d->shm_dev, d->shm_ino, connected ? "; the broker did not list its peers" : "");
                return;
        }
        for (size_t i = 0; i < n_peers; i++) {
                const gpuipc_peer_info_t *p = &peers[i];
                gpuipc_peer_info_t *grown;

                /* A peer that declared none (no /dev/shm, or a client that does not say) tells nothing. */
                if ((!p->shm_dev && !p->shm_ino) || (p->shm_dev == d->shm_dev && p->shm_ino == d->shm_ino))
                        continue;
                grown = realloc(d->shm_others, (d->n_shm_others + 1) * sizeof(*grown));
                if (!grown)
                        break;
                d->shm_others = grown;
                grown[d->n_shm_others++] = *p;
                if (d->n_shm_others <= MAX_LISTED && used < sizeof(list))
                        used += (size_t)snprintf(list + used, sizeof(list) - used, "%s%" PRIu64 " (pid %" PRIu64 ")",
                                                 d->n_shm_others > 1 ? ", " : "", p->peer, p->self_pid);
        }
        /* Information, not a fault: separate pods have separate /dev/shm, and only IPC-event
         * fences care. */
        if (d->n_shm_others)
                verdict(d, V_OK, "dev-shm", "device %" PRIu64 " inode %" PRIu64 "; %zu peer(s) declared another: %s%s. "
                        "IPC-event fences between them and this process are refused (shm): mount one emptyDir "
                        "(medium: Memory) at /dev/shm in both containers, or use counter fences", d->shm_dev,
                        d->shm_ino, d->n_shm_others, list, d->n_shm_others > MAX_LISTED ? ", ..." : "");
        else
                verdict(d, V_OK, "dev-shm", "device %" PRIu64 " inode %" PRIu64 ", as every peer that declared one",
                        d->shm_dev, d->shm_ino);
}

/* --json: the facts behind the pid and dev-shm lines, for scripts. */
static void json_self(Doctor *d)
{
        Json o, a;

        json_key(&d->json, "self");
        json_begin(&o, stdout, '{');
        json_ku64(&o, "pid", d->self_pid);
        json_ku64(&o, "shm_dev", d->shm_dev);
        json_ku64(&o, "shm_ino", d->shm_ino);
        /* Every collision, not the first MAX_LISTED the text names. */
        json_key(&o, "pid_collisions");
        json_begin(&a, stdout, '[');
        for (size_t i = 0; i < d->n_collisions; i++) {
                Json c;

                json_next(&a);
                json_begin(&c, stdout, '{');
                json_ku64(&c, "peer", d->collisions[i].peer);
                json_kstr(&c, "role", d->collisions[i].producer ? "producer" : "holder");
                json_ku64(&c, "buffer", d->collisions[i].buffer);
                json_kstr(&c, "name", d->collisions[i].name);
                json_end(&c, '}');
        }
        json_end(&a, ']');
        json_key(&o, "other_shm");
        json_begin(&a, stdout, '[');
        for (size_t i = 0; i < d->n_shm_others; i++) {
                Json c;

                json_next(&a);
                json_begin(&c, stdout, '{');
                json_ku64(&c, "peer", d->shm_others[i].peer);
                json_ku64(&c, "self_pid", d->shm_others[i].self_pid);
                json_kstr(&c, "label", d->shm_others[i].label);
                json_ku64(&c, "shm_dev", d->shm_others[i].shm_dev);
                json_ku64(&c, "shm_ino", d->shm_others[i].shm_ino);
                json_end(&c, '}');
        }
        json_end(&a, ']');
        json_end(&o, '}');
}

/* A yes/no fact about a device, as a verdict: "no" is a problem only when it blocks a kind. */
static void device_fact(Doctor *d, int ordinal, const char *check, const gpuipc_cuda_fact_t *f, const char *yes,
                        const char *no)
{
        char label[32];

        snprintf(label, sizeof(label), "gpu%d %s", ordinal, check);
        if (!f->ok)
                verdict(d, V_UNKNOWN, label, "cannot tell: %s", f->why);
        else
                verdict(d, f->value ? V_OK : V_FAIL, label, "%s", f->value ? yes : no);
}

/* The CUDA side, independent of the broker: the driver, each visible device and the capabilities
 * each kind needs. No usable CUDA is "none", not a FAIL, because a host without GPUs still runs
 * memfd buffers, and doctor must not fail a CPU-only node for it. */
static void check_gpus(Doctor *d)
{
        gpuipc_cuda_info_t *info = calloc(1, sizeof(*info)); /* large: per-device facts with their reasons */

        if (!info) {
                verdict(d, V_UNKNOWN, "gpus", "out of memory");
                return;
        }
        if (gpuipc_cuda_describe(info) < 0 || !info->loaded) {
                /* Not ok: nothing about a GPU was checked. Not a failure either: memfd works. */
                verdict(d, V_NONE, "gpus", "no GPU checked: CUDA is not usable here (%s); memfd buffers work, "
                        "cuda-vmm and cuda-legacy fail with no-cuda", info->reason);
                d->no_gpu = true;
                free(info);
                return;
        }
        verdict(d, V_OK, "driver", "CUDA driver %d.%d, %d visible device(s)", info->driver_version / 1000,
                (info->driver_version % 1000) / 10, info->n_devices);
        /* CUDA works but sees no device: the container was given none, which no kind of CUDA
         * buffer can work around, so a FAIL, unlike a host without CUDA at all. */
        if (info->n_devices == 0)
                verdict(d, V_FAIL, "gpus", "no GPU is visible: give this container the same ResourceClaim as the "
                        "producer (or set the same visible devices)");
        for (int i = 0; i < info->n_devices; i++) {
                const gpuipc_cuda_device_t *dev = &info->devices[i];
                bool mig = dev->mig.ok && dev->mig.value;
                char label[32];

                snprintf(label, sizeof(label), "gpu%d", dev->ordinal);
                verdict(d, dev->uuid.ok ? V_OK : V_FAIL, label, "%s %s%s%s%s", dev->name.ok ? dev->name.text : "?",
                        dev->uuid.ok ? dev->uuid.text : dev->uuid.why, mig ? " (MIG instance of " : "",
                        mig ? dev->gpu_uuid.text : "", mig ? ")" : "");
                device_fact(d, dev->ordinal, "vmm", &dev->vmm, "virtual memory management: cuda-vmm possible",
                            "no virtual memory management: cuda-vmm impossible, use cuda-legacy or memfd");
                device_fact(d, dev->ordinal, "posix-fd", &dev->posix_fd, "exports memory as POSIX fds: cuda-vmm "
                            "crosses containers", "cannot export POSIX fds: cuda-vmm impossible on this device");
                device_fact(d, dev->ordinal, "fences", &dev->mem_ops_64, "64-bit stream memory operations: gpuipc "
                            "fences work", "no 64-bit stream memory operations: gpuipc fences cannot be used");
        }
        free(info);
}

/* The checks run in dependency order (socket, broker, then what needs a connection) and each one
 * runs even after an earlier failure, with the verdict unknown where it lacks its input: the whole
 * picture at once saves a round of fixing one thing, rerunning and meeting the next. */
int cmd_doctor(Ctl *ctl, int argc, char **argv)
{
        Doctor d = { .ctl = ctl };
        gpuipc_peer_info_t *peers = NULL;
        const char *none = NULL;
        bool socket_ok, broker_ok;
        size_t n_peers = 0;
        int c, r, peers_err = 0;

        /* --help is the only option. */
        if ((c = ctl_next_option(ctl, argc, argv, &r)) < 0)
                return r;
        if ((r = ctl_operand(ctl, argc, argv, false, &none)) != CTL_CONTINUE)
                return r;
        if (ctl->json) {
                json_begin(&d.json, stdout, '{');
                json_key(&d.json, "checks");
                json_begin(&d.checks, stdout, '[');
        }
        socket_ok = check_socket(&d, ctl_socket_path(ctl));
        broker_ok = check_broker(&d, socket_ok);
        check_pidns(&d, broker_ok);
        self_identity(&d, broker_ok);
        if (broker_ok)
                peers = list_peers(&d, &n_peers, &peers_err);
        check_pid(&d, broker_ok, peers, n_peers, peers_err);
        check_shm(&d, broker_ok, peers, n_peers, peers_err);
        check_gpus(&d);
        if (ctl->json) {
                json_end(&d.checks, ']');
                json_self(&d);
                json_ku64(&d.json, "problems", (uint64_t)d.problems);
                json_kbool(&d.json, "broker", broker_ok);
                json_kbool(&d.json, "gpus_checked", !d.no_gpu);
                json_end(&d.json, '}');
                putchar('\n');
        } else if (d.problems) {
                printf("problems found\n");
        } else if (d.no_gpu) {
                printf("no check failed; no GPU was checked (memfd buffers only on this host)\n");
        } else {
                printf("all checks passed\n");
        }
        free(peers);
        free(d.collisions);
        free(d.shm_others);
        /* No broker outranks other problems: exit 3 is what a probe or an init container waits on. */
        if (!broker_ok)
                return CTL_NO_BROKER;
        return d.problems ? CTL_FAILED : CTL_OK;
}
