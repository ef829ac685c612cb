/* broker/reply-text.c and reply.c's status table: the one place where the registry's codes become
 * English. The registry's own tests check codes and facts (regenv.h's env_why); this one checks
 * that each code is worded, that the words carry the code's facts, and that each code has its status. */
#include <string.h>

#include "check.h"
#include "registry-change.h"
#include "reply-text.h"
#include "reply.h"

/* Every registry code is worded (reply-text.c), and every code but an event's reason (REG_R_*) has
 * the status it answers a request with in the reply layer's table (reply.c). A code added without
 * either would reach a client as an empty message or as a made-up `invalid`. */
static void test_codes_have_status_and_text(void)
{
        static const RegWhyCode reasons[] = {
                REG_R_MEMBER_GRACE_OVER, REG_R_RING_GRACE_OVER, REG_R_MEMBER_LEFT, REG_R_MEMBER_GONE,
                REG_R_EVICTED_UNRETURNED, REG_R_EVICTED_LEASE, REG_R_RING_CLOSED, REG_R_RING_PRODUCER_GONE,
                REG_R_PRODUCER_GONE, REG_R_CLAIM_GRACE_OVER, REG_R_RESTART_RELEASED, REG_R_RESTART_UNCLAIMED,
                REG_R_RESTORED_UNHELD,
        };
        char text[PROTO_MAX_TEXT + 1];

        CHECK_EQ(reply_status(REG_WHY_NONE), PROTO_STATUS_OK);
        reply_text(&(RegWhy){ REG_WHY_NONE }, text, sizeof(text));
        CHECK_STREQ(text, "");
        for (unsigned c = REG_WHY_NONE + 1; c < _REG_WHY_MAX; c++) {
                bool reason = false;

                for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++)
                        reason |= reasons[i] == c;
                reply_text(&(RegWhy){ (RegWhyCode)c }, text, sizeof(text));
                if (!text[0] || (reply_status((RegWhyCode)c) == PROTO_STATUS_OK) != reason)
                        fprintf(stderr, "code %u: text '%s', status %u\n", c, text, reply_status((RegWhyCode)c));
                CHECK(text[0]);
                CHECK_EQ(reply_status((RegWhyCode)c) == PROTO_STATUS_OK, reason);
        }
}

/* A code with facts, and what its text must show of them. */
typedef struct Worded {
        RegWhy why;
        const char *shows[4];
} Worded;

static const char gpus[2][PROTO_MAX_UUID + 1] = { "GPU-bbbb", "MIG-cccc" };
static const RegWho who = { .peer = 31, .pid = 32, .uid = 33 };

/* One per code that has facts (registry-change.h), each fact a value found nowhere else in the text. */
static const Worded worded[] = {
        { { REG_E_SUBS_LIMIT, .subs_limit = { 4101 } }, { "4101" } },
        { { REG_E_NO_SUB, .no_sub = { 4102 } }, { "4102" } },
        { { REG_E_GROUP_MISMATCH, .group_mismatch = { "grp", 4103, 4104 } }, { "'grp'", "4103", "4104" } },
        { { REG_E_GROUP_JOINED, .group_joined = { "grp" } }, { "'grp'" } },
        { { REG_E_WAITS_LIMIT, .waits_limit = { 4105 } }, { "4105" } },
        { { REG_E_GROUP_TIMEOUT, .group_timeout = { "grp", 4106, 4107 } }, { "'grp'", "4106 of 4107" } },
        { { REG_E_WAIT_MISSED, .wait_missed = { "cam/x", 4108 } }, { "'cam/x'", "4108" } },
        { { REG_E_WAIT_TIMEOUT, .wait_timeout = { "cam/x" } }, { "'cam/x'" } },
        { { REG_E_SAME_PID, .same_pid = { "leg", 4109, 4110, true, false } },
          { "'leg'", "PID 4109", "uid 4110", "(as they declared)" } },
        { { REG_E_SAME_PID, .same_pid = { "leg", 4109, 4110, false, false } }, { "'leg'", "namespace:" } },
        { { REG_E_DEVICE, .device = { "on-a", "GPU-aaaa", gpus, 2 } }, { "'on-a'", "GPU-aaaa", "GPU-bbbb, MIG-cccc" } },
        { { REG_E_DEVICE, .device = { "on-a", "GPU-aaaa", gpus, 0 } }, { "no GPU" } },
        { { REG_E_NO_BUFFER, .no_buffer = { 4111 } }, { "4111" } },
        { { REG_E_PART_OF_NO_RING, .part_of_no_ring = { 4112, "part" } }, { "4112", "'part'" } },
        { { REG_E_RING_MEMBERS_ONLY, .ring_members_only = { 4113, "part", "ring" } }, { "4113", "'part'", "'ring'" } },
        { { REG_E_RING_EXISTS, .ring_exists = { "ring" } }, { "'ring'" } },
        { { REG_E_RING_BUFFERS_LIMIT, .ring_buffers_limit = { 4114, 4115 } }, { "uid 4114", "4115 buffers" } },
        { { REG_E_RING_OTHERS, .ring_others = { "ring" } }, { "'ring'" } },
        { { REG_E_NO_RING, .no_ring = { "ring" } }, { "'ring'" } },
        { { REG_E_PART_MISFIT, .part_misfit = { "ring", 4116, REG_PART_SLOT_DEVICE } },
          { "'ring'", "part 4116", "ring's device" } },
        { { REG_E_PART_KEY_TAKEN, .part_key_taken = { 4117, who } }, { "4117", "peer 31", "uid 33" } },
        { { REG_E_RING_SETTING_UP, .ring_setting_up = { "ring", 4118, 4119 } }, { "'ring'", "4118 of 4119" } },
        { { REG_E_RING_MEMBER, .ring_member = { "ring", 4120 } }, { "'ring'", "seat 4120" } },
        { { REG_E_RING_NO_SEAT_READY, .ring_no_seat_ready = { "ring" } }, { "'ring'" } },
        { { REG_E_RING_FULL, .ring_full = { "ring", 4121 } }, { "'ring'", "4121" } },
        { { REG_E_RING_SEATS, .ring_seats = { "ring", 4122 } }, { "'ring'", "4122" } },
        { { REG_E_SEAT_NOT_WAITING, .seat_not_waiting = { "ring", 4123, 4124 } },
          { "'ring'", "seat 4123", "membership 4124" } },
        { { REG_E_RING_GONE, .ring_gone = { "ring" } }, { "'ring'" } },
        { { REG_E_SEAT_CLAIMS_LIMIT, .seat_claims_limit = { 4125 } }, { "4125" } },
        { { REG_E_NOT_MEMBER, .not_member = { "ring" } }, { "'ring'" } },
        { { REG_R_MEMBER_GRACE_OVER, .member_grace_over = { 4126 } }, { "4126 ms" } },
        { { REG_R_RING_GRACE_OVER, .ring_grace_over = { 4127 } }, { "4127 ms" } },
        { { REG_R_EVICTED_LEASE, .evicted_lease = { 4128 } }, { "4128 ms" } },
        { { REG_R_RING_PRODUCER_GONE, .ring_producer_gone = { who } }, { "peer 31", "pid 32", "uid 33" } },
        { { REG_E_CONNECTIONS_LIMIT, .connections_limit = { 4129 } }, { "4129" } },
        { { REG_E_CONNECTIONS_PER_UID, .connections_per_uid = { 4130, 4131 } }, { "uid 4130", "4131" } },
        { { REG_E_MEMORY_BUDGET, .memory_budget = { 4132, false, 4133, 4134, 4135 } },
          { "uid 4132", "4133", "4134", "4135" } },
        { { REG_E_MEMORY_BUDGET, .memory_budget = { 4132, true, 4133, 4134, 4135 } }, { "4133", "4134", "4135" } },
        { { REG_R_PRODUCER_GONE, .producer_gone = { who } }, { "peer 31", "pid 32", "uid 33" } },
        { { REG_E_REFS_FULL, .refs_full = { 4136 } }, { "4136" } },
        { { REG_E_NOT_LIVE, .not_live = { 4137, PROTO_STATE_RETIRED, "buf" } }, { "4137", "'buf'", "retired" } },
        { { REG_E_NOTHING_UNDER, .nothing_under = { "buf" } }, { "'buf'" } },
        { { REG_E_NAME_ORPHANED, .name_orphaned = { "buf", 4138, 4139 } }, { "'buf'", "uid 4138", "4139" } },
        { { REG_E_NAME_TAKEN, .name_taken = { "buf", who } }, { "'buf'", "peer 31", "pid 32", "uid 33" } },
        { { REG_E_OTHERS_BUFFER, .others_buffer = { 4140 } }, { "4140" } },
        { { REG_E_NOT_IDLE, .not_idle = { 4141, PROTO_STATE_LIVE } }, { "4141", "live" } },
        { { REG_E_KEY_TAKEN, .key_taken = { 4142, who } }, { "4142", "peer 31", "uid 33" } },
        { { REG_E_BUFFERS_LIMIT, .buffers_limit = { 4143, 4144 } }, { "uid 4143", "4144" } },
        { { REG_E_FDS_LIMIT, .fds_limit = { 4145, 4146 } }, { "4145 fds", "uid 4146" } },
        { { REG_E_HELD_MEMORY_LIMIT, .held_memory_limit = { 4147, 4148, 4149, 4150 } },
          { "uid 4147", "4148", "4149", "4150" } },
        { { REG_E_OTHERS_SEGMENT, .others_segment = { 4151 } }, { "4151" } },
        { { REG_E_NOT_A_SEGMENT, .not_a_segment = { 4152, REG_SEGMENT_IS_RING_PART } }, { "4152", "part of a ring" } },
        { { REG_E_SEGMENT_FREED, .segment_freed = { 4153 } }, { "4153" } },
        { { REG_E_NO_SEGMENT, .no_segment = { 4154 } }, { "4154" } },
        { { REG_E_VIEW_OUTSIDE, .view_outside = { 4155, 4156, 4157 } }, { "4155", "4156", "4157" } },
        { { REG_E_RESTORED_GENERATION, .restored_generation = { 4158 } }, { "4158" } },
        { { REG_E_NOT_ATTACHED, .not_attached = { 4159 } }, { "4159" } },
        { { REG_E_NOT_OWNER, .not_owner = { 4160, "buf", who } }, { "4160", "'buf'", "peer 31", "uid 33" } },
        { { REG_E_CLAIM_OWNER, .claim_owner = { 4161, PROTO_KIND_CUDA_VMM, PROTO_KIND_MEMFD, 4162, 4163 } },
          { "4161", "cuda-vmm", "uid 4162", "uid 4163" } },
        { { REG_E_CLAIM_REPUBLISHED, .claim_republished = { 4164, 4165, 4166, "new", "old" } },
          { "4164", "generation 4165, 'new'", "generation 4166, 'old'" } },
        { { REG_E_CLAIM_DRAINED, .claim_drained = { 4167, "buf" } }, { "4167", "'buf'" } },
        { { REG_E_CLAIM_RING_PART, .claim_ring_part = { 4168, "buf" } }, { "4168", "'buf'" } },
        { { REG_E_CLAIM_RETIRED, .claim_retired = { 4169, "buf", 4170 } }, { "4169", "'buf'", "uid 4170" } },
        { { REG_E_CLAIM_RETIRE_AFTER, .claim_retire_after = { 4171, "buf", 4172, 4173, 4174 } },
          { "4171", "'buf'", "4172 attaches", "4174 references" } },
        { { REG_E_REFS_LIMIT, .refs_limit = { 4175, 4176, 4177 } }, { "4175", "4176", "4177" } },
        { { REG_E_CLAIM_UNKNOWN, .claim_unknown = { 4178, "buf", 4179 } }, { "4178", "'buf'", "4179 ms" } },
        { { REG_E_CLAIMS_PER_UID, .claims_per_uid = { 4180, 4181 } }, { "uid 4180", "4181" } },
        { { REG_E_CLAIMS_ALL, .claims_all = { 4182 } }, { "4182" } },
        { { REG_R_CLAIM_GRACE_OVER, .claim_grace_over = { 4183 } }, { "4183 ms" } },
        { { REG_R_RESTART_RELEASED, .restart_released = { 4184, 4185 } }, { "4184 holder(s)", "4185 ms" } },
        { { REG_R_RESTART_UNCLAIMED, .restart_unclaimed = { 4186 } }, { "4186 ms" } },
};

/* Each code's text names the facts it was given: a client reads what happened in this case there. */
static void test_texts_name_their_facts(void)
{
        char text[PROTO_MAX_TEXT + 1];

        for (size_t i = 0; i < sizeof(worded) / sizeof(worded[0]); i++) {
                reply_text(&worded[i].why, text, sizeof(text));
                for (size_t k = 0; k < 4 && worded[i].shows[k]; k++) {
                        if (!strstr(text, worded[i].shows[k]))
                                fprintf(stderr, "code %u: '%s' lacks '%s'\n", (unsigned)worded[i].why.code, text,
                                        worded[i].shows[k]);
                        CHECK(strstr(text, worded[i].shows[k]));
                }
        }
}

/* A text longer than the room it is given is cut and still terminated. */
static void test_text_cut_to_fit(void)
{
        char text[16];

        reply_text(&worded[8].why, text, sizeof(text));
        CHECK_EQ(strlen(text), sizeof(text) - 1);
        reply_text(&worded[8].why, text, 1);
        CHECK_STREQ(text, "");
}

int main(int argc, char **argv)
{
        TEST_RUN(argc, argv, test_codes_have_status_and_text);
        TEST_RUN(argc, argv, test_texts_name_their_facts);
        TEST_RUN(argc, argv, test_text_cut_to_fit);
        return TEST_END();
}
