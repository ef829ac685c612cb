/* What a peer may see and what it may claim: listings (list, stat, peers) show a peer only what the
 * policy lets it attach, or everything to an administrator; a PID namespace the broker reports is
 * the kernel's unless it is marked declared; and strings are text: labels, names and metadata that
 * are not UTF-8 are refused at the door, and gpuipcctl's tables escape what would forge a row or
 * drive the terminal. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "macro.h"

#define NOBODY 65534

/* Lets other users traverse dir and its ancestors (temporary directories are 0700). */
static void let_others_reach(const char *dir)
{
        char path[256];

        snprintf(path, sizeof(path), "%s", dir);
        while (strlen(path) > 1 && strcmp(path, "/tmp") != 0) {
                char *slash;

                CHECK(chmod(path, 0711) == 0 || errno == EPERM);
                slash = strrchr(path, '/');
                if (!slash || slash == path)
                        break;
                *slash = 0;
        }
}

static void write_policy(char *path, size_t cap, const char *rules)
{
        FILE *f;

        snprintf(path, cap, "%s/policy.conf", h_case_dir());
        f = fopen(path, "we");
        CHECK(f);
        fputs(rules, f);
        fclose(f);
}

/* Sends a listing request on a raw connection and counts its records; ret_names (if not NULL)
 * gets the names or labels of the records, separated by spaces. */
static unsigned raw_listing(int sock, ProtoMsg *req, char *ret_names, size_t cap)
{
        HFrame *f = h_frame_new();
        ProtoIter it;
        ProtoMsg rec;
        unsigned n = 0;
        int r;

        CHECK_EQ(h_raw_call(sock, req, -1, f), PROTO_STATUS_OK);
        if (ret_names)
                ret_names[0] = 0;
        proto_iter_init(&it, &f->msg.items);
        while ((r = proto_iter_next(&it, &rec)) == 1) {
                ProtoStr s = req->op == PROTO_OP_PEERS ? rec.label : rec.name;

                if (ret_names)
                        snprintf(ret_names + strlen(ret_names), cap - strlen(ret_names), "%.*s ", (int)s.len,
                                 s.ptr);
                n++;
        }
        CHECK_EQ(r, 0);
        h_frame_free(f);
        return n;
}

static unsigned list_names(int sock, char *names, size_t cap)
{
        ProtoMsg req = { .op = PROTO_OP_LIST, .has = PROTO_BIT(PF_OP) };
        return raw_listing(sock, &req, names, cap);
}

static unsigned peer_labels(int sock, char *labels, size_t cap)
{
        ProtoMsg req = { .op = PROTO_OP_PEERS, .has = PROTO_BIT(PF_OP) };
        return raw_listing(sock, &req, labels, cap);
}

static unsigned raw_stat_name(int sock, const char *name)
{
        ProtoMsg req = { .op = PROTO_OP_STAT, .name = proto_str(name), .has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) };
        HFrame *f = h_frame_new();
        unsigned st = h_raw_call(sock, &req, -1, f);

        h_frame_free(f);
        return st;
}

static unsigned raw_stat_id(int sock, uint64_t id)
{
        ProtoMsg req = { .op = PROTO_OP_STAT, .buffer = id, .has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_BUFFER) };
        HFrame *f = h_frame_new();
        unsigned st = h_raw_call(sock, &req, -1, f);

        h_frame_free(f);
        return st;
}

static int hello_labelled(int sock, const char *label, size_t len, uint64_t pidns, HFrame *reply)
{
        ProtoMsg req = { .op = PROTO_OP_HELLO, .version = PROTO_VERSION, .pid = (uint64_t)getpid() };

        req.label = (ProtoStr){ label, (uint32_t)len };
        req.pidns = pidns;
        req.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_VERSION) | PROTO_BIT(PF_PID) | PROTO_BIT(PF_LABEL);
        if (pidns)
                proto_set(&req, PF_PIDNS);
        return (int)h_raw_call(sock, &req, -1, reply);
}

/* ---- listings follow the policy ---- */

typedef struct Ids {
        const HBroker *b;
        uint64_t theirs, mine;
} Ids;

static int limited_child(HChan *ch, void *arg)
{
        const Ids *ids = arg;
        char names[512], labels[512];
        gpuipc_buffer_t *own = NULL;
        gpuipc_t *c;
        int sock;

        CHECK(setgid(NOBODY) == 0 && setuid(NOBODY) == 0);
        c = h_connect(ids->b, "limited");
        CHECK_OK(c, gpuipc_buffer_alloc(c, GPUIPC_KIND_MEMFD, 4096, 0, &own));
        /* It may publish under pub/ but not attach there: its own buffer stays visible to it. */
        CHECK_OK(c, gpuipc_publish(c, own, "pub/own", NULL));
        sock = h_raw_connect(ids->b);
        h_raw_hello(sock);
        list_names(sock, names, sizeof(names));
        CHECKF(strstr(names, "mine/b ") && strstr(names, "pub/own "), "a buffer it may see is not listed: %s", names);
        CHECKF(!strstr(names, "theirs/"), "list shows a buffer the policy does not let it attach: %s", names);
        CHECKF(!strstr(names, "bystander/"), "list shows the bystander's buffer: %s", names);
        CHECK_EQ(raw_stat_name(sock, "theirs/a"), PROTO_STATUS_NOT_FOUND);
        CHECK_EQ(raw_stat_id(sock, ids->theirs), PROTO_STATUS_NOT_FOUND);
        CHECK_EQ(raw_stat_id(sock, ids->mine), PROTO_STATUS_OK);
        /* Peers: only the connections of its own uid (these two), never root's. */
        CHECK_EQ(peer_labels(sock, labels, sizeof(labels)), 2);
        CHECKF(strstr(labels, "limited ") && strstr(labels, "raw-test-peer "), "peers shows: %s", labels);
        close(sock);
        gpuipc_close(c);
        h_report(ch, 'd', "done");
        return 0;
}

/* Under a policy, list, stat and peers show a peer only the buffers it may attach or owns and the connections of
 * its own uid, while an administrator sees everything. */
static void test_listings_follow_policy(void)
{
        char policy[256], names[512], labels[512];
        const char *flags[] = { "--policy", policy, "--socket-mode", "0666", NULL };
        gpuipc_buffer_t *theirs, *mine;
        HChild *kid;
        Ids ids;
        HCase k;
        int sock;

        if (getuid() != 0)
                h_skip("switching uid needs root");
        let_others_reach(h_case_dir());
        write_policy(policy, sizeof(policy),
                     "allow all uid=0\n"
                     "allow publish,attach uid=65534 prefix=mine/\n"
                     "allow publish uid=65534 prefix=pub/\n");
        h_case_begin(&k, flags);
        let_others_reach(k.broker->dir);
        theirs = h_publish(k.by_prod, "theirs/a", 4096, 1, NULL);
        mine = h_publish(k.by_prod, "mine/b", 4096, 2, NULL);
        ids = (Ids){ k.broker, gpuipc_buffer_id(theirs), gpuipc_buffer_id(mine) };
        kid = h_spawn("limited", limited_child, &ids);
        h_child_expect(kid, 'd', H_SOON_MS, NULL, 0);
        h_child_wait_ok(kid, H_SOON_MS);
        h_child_free(kid);
        /* An administrator of every name sees everything. */
        sock = h_raw_connect(k.broker);
        h_raw_hello(sock);
        list_names(sock, names, sizeof(names));
        CHECKF(strstr(names, "theirs/a ") && strstr(names, "mine/b ") && strstr(names, "bystander/data "),
               "the administrator's list: %s", names);
        CHECK(peer_labels(sock, labels, sizeof(labels)) >= 4);
        CHECKF(strstr(labels, "observer "), "the administrator's peers: %s", labels);
        close(sock);
        h_case_end(&k);
}

/* Without a policy file every peer may attach every name: listings are not filtered. */
static int unfiltered_child(HChan *ch, void *arg)
{
        char names[512], labels[512];
        int sock;

        CHECK(setgid(NOBODY) == 0 && setuid(NOBODY) == 0);
        sock = h_raw_connect(arg);
        h_raw_hello(sock);
        list_names(sock, names, sizeof(names));
        CHECKF(strstr(names, "theirs/a "), "list without a policy: %s", names);
        peer_labels(sock, labels, sizeof(labels));
        CHECKF(strstr(labels, "observer "), "peers without a policy: %s", labels);
        close(sock);
        h_report(ch, 'd', "done");
        return 0;
}

/* Without a policy file listings are not filtered: another uid sees every buffer and peer (every peer may attach
 * every name anyway). */
static void test_listings_without_policy(void)
{
        const char *flags[] = { "--socket-mode", "0666", NULL };
        HChild *kid;
        HCase k;

        if (getuid() != 0)
                h_skip("switching uid needs root");
        let_others_reach(h_case_dir());
        h_case_begin(&k, flags);
        let_others_reach(k.broker->dir);
        h_publish(k.by_prod, "theirs/a", 4096, 1, NULL);
        kid = h_spawn("unfiltered", unfiltered_child, k.broker);
        h_child_expect(kid, 'd', H_SOON_MS, NULL, 0);
        h_child_wait_ok(kid, H_SOON_MS);
        h_child_free(kid);
        h_case_end(&k);
}

/* ---- PID namespaces: the kernel's, or marked declared ---- */

static bool peer_record(int sock, const char *label, ProtoMsg *ret)
{
        ProtoMsg req = { .op = PROTO_OP_PEERS, .has = PROTO_BIT(PF_OP) };
        HFrame *f = h_frame_new();
        ProtoIter it;
        bool found = false;

        CHECK_EQ(h_raw_call(sock, &req, -1, f), PROTO_STATUS_OK);
        proto_iter_init(&it, &f->msg.items);
        while (!found && proto_iter_next(&it, ret) == 1)
                found = proto_str_eq(ret->label, label);
        /* ret points into f: copy what the callers look at */
        ret->label = (ProtoStr){ NULL, 0 };
        h_frame_free(f);
        return found;
}

static uint64_t own_pidns(void)
{
        struct stat st;

        CHECK(stat("/proc/self/ns/pid", &st) == 0);
        return st.st_ino;
}

/* A peer in the broker's PID namespace that declares another one is placed where the kernel says; the lie changes
 * nothing. */
static void test_pidns_in_broker_namespace_is_verified(void)
{
        HFrame *reply = h_frame_new();
        ProtoMsg rec;
        uint64_t broker_ns;
        HCase k;
        int liar;

        h_case_begin(&k, NULL);
        /* A peer in the broker's own PID namespace that declares another one: the kernel shows where
         * it is, sandbox or not, and the lie changes nothing. */
        liar = h_raw_connect(k.broker);
        CHECK_EQ(hello_labelled(liar, "liar", 4, 12345, reply), PROTO_STATUS_OK);
        broker_ns = reply->msg.pidns;
        CHECK_EQ(broker_ns, own_pidns());
        CHECKF(reply->msg.pidns_same, "the broker took the declared namespace over the kernel's");
        CHECK(peer_record(liar, "liar", &rec));
        CHECK_EQ(rec.pidns, broker_ns);
        CHECK(proto_has(&rec, PF_PIDNS_DECLARED) && !rec.pidns_declared);
        close(liar);
        h_frame_free(reply);
        h_case_end(&k);
}

/* A child in a PID namespace of its own declares 777. Whatever the broker reports for it must be
 * either the kernel's inode (unmarked) or the declared value, marked declared. */
static int nested_child(HChan *ch, void *arg)
{
        HCase *k = arg;
        HFrame *reply = h_frame_new();
        uint64_t real_ns = own_pidns();
        ProtoMsg rec;
        int sock = h_raw_connect(k->broker);

        CHECK_EQ(hello_labelled(sock, "nested", 6, 777, reply), PROTO_STATUS_OK);
        CHECK(!reply->msg.pidns_same);
        CHECK(peer_record(sock, "nested", &rec));
        if (rec.pidns_declared)
                CHECK_EQ(rec.pidns, 777);
        else
                CHECK_EQ(rec.pidns, real_ns);
        h_report(ch, 'd', "pidns %llu %s", (unsigned long long)rec.pidns, rec.pidns_declared ? "declared" : "kernel");
        close(sock);
        h_frame_free(reply);
        return 0;
}

/* For a peer in another PID namespace the broker reports either the kernel's view or the declared namespace marked
 * as declared, never a declared value as verified. */
static void test_pidns_elsewhere_is_marked_declared(void)
{
        char what[64];
        HChild *kid;
        HCase k;

        if (getuid() != 0)
                h_skip("a new PID namespace needs root");
        h_case_begin(&k, NULL);
        /* The next child forked is the first process of a new PID namespace. */
        CHECK(unshare(CLONE_NEWPID) == 0);
        kid = h_spawn("nested", nested_child, &k);
        h_child_expect(kid, 'd', H_SOON_MS, what, sizeof(what));
        h_log("the nested peer: %s", what);
        /* Under the broker's sandbox the kernel cannot tell its namespace: the value is declared. */
        if (strcmp(getenv("GPUIPC_TEST_SECCOMP") ? getenv("GPUIPC_TEST_SECCOMP") : "off", "off") != 0)
                CHECKF(strstr(what, "declared"), "under the sandbox the broker claimed to know: %s", what);
        h_child_wait_ok(kid, H_SOON_MS);
        h_child_free(kid);
        h_case_end(&k);
}

/* ---- strings are text ---- */

static void expect_bad_utf8(int sock, ProtoMsg *req, const char *field)
{
        HFrame *f = h_frame_new();
        char want[64];

        CHECK_EQ(h_raw_call(sock, req, -1, f), PROTO_STATUS_BAD_REQUEST);
        snprintf(want, sizeof(want), "field '%s' is not valid UTF-8", field);
        CHECKF(f->msg.message.len && memmem(f->msg.message.ptr, f->msg.message.len, want, strlen(want)),
               "the message does not say %s: %.*s", want, (int)f->msg.message.len, f->msg.message.ptr);
        h_frame_free(f);
}

/* Labels and metadata strings that are not UTF-8 are refused naming the field, and the connection stays usable. */
static void test_strings_must_be_utf8(void)
{
        static const uint8_t bad_meta[] = { 0x81, 0xa5, 'd', 't', 'y', 'p', 'e', 0xa2, 'f', 0xff };
        ProtoMsg hello = { .op = PROTO_OP_HELLO, .version = PROTO_VERSION };
        ProtoMsg publish = { .op = PROTO_OP_PUBLISH, .name = proto_str("utf8/x"), .kind = PROTO_KIND_MEMFD,
                             .size = 4096 };
        HFrame *f = h_frame_new();
        HCase k;
        int sock;

        h_case_begin(&k, NULL);
        sock = h_raw_connect(k.broker);
        hello.label = (ProtoStr){ "caf\xe9", 4 }; /* Latin-1, not UTF-8 */
        hello.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_VERSION) | PROTO_BIT(PF_LABEL);
        expect_bad_utf8(sock, &hello, "label");
        /* The connection stays, and a UTF-8 label is accepted. */
        CHECK_EQ(hello_labelled(sock, "caf\xc3\xa9", 5, 0, f), PROTO_STATUS_OK);
        publish.meta = (ProtoRaw){ bad_meta, sizeof(bad_meta), 1 };
        publish.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME) | PROTO_BIT(PF_KIND) | PROTO_BIT(PF_SIZE) |
                      PROTO_BIT(PF_META);
        expect_bad_utf8(sock, &publish, "meta");
        close(sock);
        h_frame_free(f);
        h_case_end(&k);
}

/* A label may be valid UTF-8 and still carry a newline (a forged table row) and terminal escapes:
 * gpuipcctl's table shows them escaped, and its JSON stays valid. */
static void test_ctl_output_is_safe(void)
{
        static const char evil[] = "x\n999    0    0    0    forged-row\x1b[2J\x1b]0;pwned\x07";
        char path[300], cmd[600];
        HFrame *f = h_frame_new();
        HChild *ctl;
        char *out;
        HCase k;
        int sock;

        h_case_begin(&k, NULL);
        sock = h_raw_connect(k.broker);
        CHECK_EQ(hello_labelled(sock, evil, strlen(evil), 0, f), PROTO_STATUS_OK);
        ctl = h_spawn_ctl(k.broker, "ctl-peers", "peers", NULL);
        h_child_wait_ok(ctl, H_SOON_MS);
        out = h_child_output(ctl);
        CHECKF(!strchr(out, '\x1b') && !strchr(out, '\x07'), "the table passes terminal escapes through:\n%s", out);
        CHECKF(!strstr(out, "\n999 "), "the label forged a row of the table:\n%s", out);
        CHECKF(strstr(out, "forged-row?[2J"), "the label is not shown escaped:\n%s", out);
        free(out);
        h_child_free(ctl);
        ctl = h_spawn_ctl(k.broker, "ctl-peers-json", "--json", "peers", NULL);
        h_child_wait_ok(ctl, H_SOON_MS);
        snprintf(path, sizeof(path), "%s", ctl->out);
        snprintf(cmd, sizeof(cmd),
                 "python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); "
                 "sys.exit(0 if any(x[\"label\"].startswith(\"x\\n999\") for x in p) else 3)' %s",
                 path);
        CHECKF(system(cmd) == 0, "gpuipcctl --json peers is not valid JSON carrying the label: %s", path);
        h_child_free(ctl);
        close(sock);
        h_frame_free(f);
        h_case_end(&k);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_listings_follow_policy),
                H_TEST(test_listings_without_policy),
                H_TEST(test_pidns_in_broker_namespace_is_verified),
                H_TEST(test_pidns_elsewhere_is_marked_declared),
                H_TEST(test_strings_must_be_utf8),
                H_TEST(test_ctl_output_is_safe),
        };

        return h_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]));
}
