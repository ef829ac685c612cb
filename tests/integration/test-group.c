/* Rendezvous groups: N processes join and all return together; with one missing, all fail at the
 * earliest member's deadline; a member count mismatch is refused; a member that dies does not
 * count. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

typedef struct MemberArg {
        const HBroker *broker;
        const char *group;
        unsigned members;
        int timeout_ms;
} MemberArg;

/* Connects ('c'), joins when told 'j' (reporting 'J' just before), then reports 'r' with the
 * result, when the join returned, and the error message. */
static int member(HChan *ch, void *arg)
{
        const MemberArg *a = arg;
        gpuipc_t *c = h_connect(a->broker, "member");
        int r;

        h_report(ch, 'c', "connected");
        h_await(ch, 'j', 60000);
        h_report(ch, 'J', "%" PRIu64, monotonic_ms());
        r = gpuipc_group_join(c, a->group, a->members, a->timeout_ms);
        h_report(ch, 'r', "%d %" PRIu64 " %s", r, monotonic_ms(), gpuipc_errmsg(c));
        if (r == 0)
                CHECK_OK(c, gpuipc_ping(c, H_SOON_MS));
        gpuipc_close(c);
        return 0;
}

typedef struct Result {
        int r;
        uint64_t at;
        char msg[200];
} Result;

static Result expect_result(HChild *c)
{
        char text[256];
        unsigned long long at = 0;
        Result res = { 0 };
        int off = 0;

        h_child_expect(c, 'r', H_SOON_MS + 30000, text, sizeof(text));
        CHECK(sscanf(text, "%d %llu %n", &res.r, &at, &off) == 2);
        res.at = at;
        snprintf(res.msg, sizeof(res.msg), "%s", text + off);
        return res;
}

static HChild *spawn_member(const char *name, MemberArg *arg)
{
        HChild *c = h_spawn(name, member, arg);

        h_child_expect(c, 'c', H_SOON_MS, NULL, 0);
        return c;
}

/* Tells the member to join and waits until the broker counts its wait. */
static void join(gpuipc_t *obs, HChild *c, uint64_t waits_after)
{
        h_child_tell(c, 'j');
        h_child_expect(c, 'J', H_SOON_MS, NULL, 0);
        WAIT_UNTIL(h_stats(obs, "waits") == waits_after, H_SOON_MS);
}

/* No member of a rendezvous group returns before the last one joins (here gpuipcctl group), and then all return
 * together (within a second of each other). */
static void test_group_all_return_together(void)
{
        MemberArg arg;
        HChild *m[3], *cli;
        Result res[3];
        uint64_t t_last, lo = UINT64_MAX, hi = 0;
        char *out;
        HCase k;

        h_case_begin(&k, NULL);
        arg = (MemberArg){ k.broker, "rv/all", 4, 30000 };
        for (int i = 0; i < 3; i++) {
                char name[16];
                snprintf(name, sizeof(name), "member-%d", i);
                m[i] = spawn_member(name, &arg);
        }
        for (int i = 0; i < 3; i++)
                join(k.obs, m[i], (uint64_t)i + 1);
        CHECK_EQ(h_stats(k.obs, "groups"), 1);
        /* Three of four joined: nobody has returned. */
        for (int i = 0; i < 3; i++)
                CHECKF(h_child_quiet(m[i]), "member %d returned before the group was complete", i);
        /* The fourth member is gpuipcctl. */
        t_last = monotonic_ms();
        cli = h_spawn_ctl(k.broker, "ctl-group", "group", "rv/all", "--members", "4", "--wait",
                          "30000", NULL);
        for (int i = 0; i < 3; i++) {
                res[i] = expect_result(m[i]);
                CHECKF(res[i].r == 0, "member %d: %d (%s)", i, res[i].r, res[i].msg);
                CHECKF(res[i].at >= t_last, "member %d returned before the last member joined", i);
                lo = res[i].at < lo ? res[i].at : lo;
                hi = res[i].at > hi ? res[i].at : hi;
                h_child_wait_ok(m[i], H_SOON_MS);
                h_child_free(m[i]);
        }
        h_log("members returned within %" PRIu64 " ms of each other", hi - lo);
        CHECKF(hi - lo < 1000, "members returned %" PRIu64 " ms apart", hi - lo);
        h_child_wait_ok(cli, H_SOON_MS);
        out = h_child_output(cli);
        CHECKF(strstr(out, "complete"), "gpuipcctl group said: %s", out);
        free(out);
        h_child_free(cli);
        CHECK_EQ(h_stats(k.obs, "groups_completed_total"), 1);
        CHECK_EQ(h_stats(k.obs, "groups"), 0);
        CHECK_EQ(h_stats(k.obs, "waits"), 0);
        h_case_end(&k);
}

/* A group that never completes fails every member together, at the earliest member's deadline and within a second
 * of each other, leaving no group or wait behind. */
static void test_group_missing_member_fails_all(void)
{
        const int first_timeout = 800;
        MemberArg early, patient;
        HChild *m[3];
        Result res[3];
        uint64_t t_first = 0, lo = UINT64_MAX, hi = 0;
        char text[64];
        HCase k;

        h_case_begin(&k, NULL);
        /* The first member's deadline is the group's: the others would wait 30 s on their own. */
        early = (MemberArg){ k.broker, "rv/short", 4, first_timeout };
        patient = (MemberArg){ k.broker, "rv/short", 4, 30000 };
        m[0] = spawn_member("member-0", &early);
        m[1] = spawn_member("member-1", &patient);
        m[2] = spawn_member("member-2", &patient);
        for (int i = 0; i < 3; i++) {
                h_child_tell(m[i], 'j');
                h_child_expect(m[i], 'J', H_SOON_MS, text, sizeof(text));
                if (i == 0)
                        t_first = strtoull(text, NULL, 10);
                WAIT_UNTIL(h_stats(k.obs, "waits") == (uint64_t)i + 1 || !h_child_quiet(m[0]), H_SOON_MS);
        }
        for (int i = 0; i < 3; i++) {
                res[i] = expect_result(m[i]);
                CHECKF(res[i].r == GPUIPC_E_TIMEOUT, "member %d: %d (%s), expected a timeout", i, res[i].r,
                       res[i].msg);
                CHECKF(strstr(res[i].msg, "3 of 4") || strstr(res[i].msg, "of 4"), "member %d's error: %s",
                       i, res[i].msg);
                lo = res[i].at < lo ? res[i].at : lo;
                hi = res[i].at > hi ? res[i].at : hi;
                h_child_wait_ok(m[i], H_SOON_MS);
                h_child_free(m[i]);
        }
        h_log("all failed %" PRIu64 "-%" PRIu64 " ms after the first join (deadline %d ms)", lo - t_first,
              hi - t_first, first_timeout);
        CHECKF(lo >= t_first + first_timeout - 50,
               "failed %" PRIu64 " ms after the first join, before its deadline", lo - t_first);
        CHECKF(hi <= t_first + first_timeout + 5000, "failed only %" PRIu64 " ms after the first join",
               hi - t_first);
        CHECKF(hi - lo < 1000, "members failed %" PRIu64 " ms apart", hi - lo);
        CHECK_EQ(h_stats(k.obs, "groups_failed_total"), 1);
        CHECK_EQ(h_stats(k.obs, "groups"), 0);
        CHECK_EQ(h_stats(k.obs, "waits"), 0);
        h_case_end(&k);
}

/* Joining a group twice from one connection, or with another member count, is refused at once (naming both counts)
 * and the first join stands. */
static void test_group_mismatch_and_double_join(void)
{
        ProtoMsg j = {
                .op = PROTO_OP_GROUP_JOIN, .group = proto_str("rv/m"), .members = 3, .timeout_ms = 20000
        };
        HFrame *f = h_frame_new();
        gpuipc_t *c;
        int sock;
        HCase k;

        h_case_begin(&k, NULL);
        j.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_GROUP) | PROTO_BIT(PF_MEMBERS) | PROTO_BIT(PF_TIMEOUT_MS);
        sock = h_raw_connect(k.broker);
        h_raw_hello(sock);
        CHECK_EQ(h_raw_send_msg(sock, &j, 0, NULL, 0), 0);
        WAIT_UNTIL(h_stats(k.obs, "waits") == 1, H_SOON_MS);
        /* The same connection again: refused, its first join stands. */
        j.has &= ~PROTO_BIT(PF_ID);
        CHECK_EQ(h_raw_call(sock, &j, -1, f), PROTO_STATUS_STATE);
        /* Another member count: refused at once, with both counts named. */
        c = h_connect(k.broker, "wrong-count");
        CHECK_ERR(c, gpuipc_group_join(c, "rv/m", 2, 20000), GPUIPC_E_GROUP_MISMATCH);
        CHECKF(strstr(gpuipc_errmsg(c), "3") && strstr(gpuipc_errmsg(c), "2"), "mismatch message: %s",
               gpuipc_errmsg(c));
        CHECK_EQ(h_stats(k.obs, "waits"), 1);
        /* Invalid counts and names. */
        CHECK_ERR(c, gpuipc_group_join(c, "rv/zero", 0, 1000), GPUIPC_E_INVALID);
        CHECK_ERR(c, gpuipc_group_join(c, "bad name", 2, 1000), GPUIPC_E_INVALID);
        /* The pending member leaves by closing its connection: the group goes with it. */
        close(sock);
        WAIT_UNTIL(h_stats(k.obs, "groups") == 0, H_SOON_MS);
        CHECK_EQ(h_stats(k.obs, "waits"), 0);
        /* A one-member group completes at once. */
        CHECK_OK(c, gpuipc_group_join(c, "rv/solo", 1, 1000));
        gpuipc_close(c);
        h_frame_free(f);
        h_case_end(&k);
}

/* A joined member that dies no longer counts: the group completes only when enough living members have joined. */
static void test_group_member_killed(void)
{
        MemberArg arg;
        HChild *m[4];
        Result res;
        HCase k;

        h_case_begin(&k, NULL);
        arg = (MemberArg){ k.broker, "rv/kill", 3, 30000 };
        for (int i = 0; i < 4; i++) {
                char name[16];
                snprintf(name, sizeof(name), "member-%d", i);
                m[i] = spawn_member(name, &arg);
        }
        join(k.obs, m[0], 1);
        join(k.obs, m[1], 2);
        /* A joined member dies: it no longer counts towards the three. */
        h_child_kill9(m[1]);
        WAIT_UNTIL(h_stats(k.obs, "waits") == 1, H_SOON_MS);
        CHECK_EQ(h_stats(k.obs, "groups"), 1);
        join(k.obs, m[2], 2);
        CHECK(h_child_quiet(m[0]) && h_child_quiet(m[2]));
        h_child_tell(m[3], 'j');
        h_child_expect(m[3], 'J', H_SOON_MS, NULL, 0);
        for (int i = 0; i < 4; i++) {
                if (i == 1)
                        continue;
                res = expect_result(m[i]);
                CHECKF(res.r == 0, "member %d: %d (%s)", i, res.r, res.msg);
                h_child_wait_ok(m[i], H_SOON_MS);
        }
        for (int i = 0; i < 4; i++)
                h_child_free(m[i]);
        CHECK_EQ(h_stats(k.obs, "groups_completed_total"), 1);
        CHECK_EQ(h_stats(k.obs, "groups"), 0);
        h_case_end(&k);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_group_all_return_together),
                H_TEST(test_group_missing_member_fails_all),
                H_TEST(test_group_mismatch_and_double_join),
                H_TEST(test_group_member_killed),
        };

        return h_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]));
}
