/* broker/budget.c: charges fit in the uid's share and in the pool or are refused saying which,
 * the two pools are apart, what is given back leaves no entry behind, and the default budget comes
 * out of a cgroup's memory.max as documented. */
#include <errno.h>
#include <stdint.h>

#include "budget.h"
#include "check.h"
#include "macro.h"

/* A budget of 1000 bytes, 400 a uid: each pool holds 500, 200 of them a uid's. */
static void test_budget_shares(void)
{
        BudgetRefusal f = { 0 };
        Budget b;

        budget_init(&b, 1000, 400);
        CHECK_EQ(budget_charge(&b, 1, BUDGET_HELD, 150, &f), 0);
        CHECK_EQ(budget_charge(&b, 1, BUDGET_HELD, 51, &f), BUDGET_E_UID);
        CHECK_EQ(f.which, BUDGET_E_UID);
        CHECK_EQ(f.used, 150);
        CHECK_EQ(f.limit, 200);
        CHECK_EQ(budget_charge(&b, 1, BUDGET_HELD, 50, &f), 0); /* exactly its share */
        CHECK_EQ(budget_charge(&b, 2, BUDGET_HELD, 200, &f), 0);
        CHECK_EQ(budget_charge(&b, 3, BUDGET_HELD, 100, &f), 0);
        /* The pool is full: uid 4 has its whole share left, and still nothing fits. */
        CHECK_EQ(budget_charge(&b, 4, BUDGET_HELD, 1, &f), BUDGET_E_ALL);
        CHECK_EQ(f.used, 500);
        CHECK_EQ(f.limit, 500);
        CHECK_EQ(b.refused, 2);
        /* A charge larger than any share never fits (and cannot overflow the sums). */
        CHECK_EQ(budget_charge(&b, 5, BUDGET_HELD, UINT64_MAX, &f), BUDGET_E_UID);
        /* The output pool is apart: a uid whose held share is full still gets its frames queued. */
        CHECK_EQ(budget_charge(&b, 1, BUDGET_OUTPUT, 200, NULL), 0);
        CHECK_EQ(budget_over(&b, 1, BUDGET_OUTPUT, NULL), 0);
        CHECK_EQ(budget_force(&b, 1, BUDGET_OUTPUT, 10), 0);
        CHECK_EQ(budget_over(&b, 1, BUDGET_OUTPUT, &f), BUDGET_E_UID);
        CHECK_EQ(f.used, 210);
        CHECK_EQ(budget_over(&b, 2, BUDGET_OUTPUT, NULL), 0);
        CHECK_EQ(budget_uid_used(&b, 1, BUDGET_HELD), 200);
        CHECK_EQ(b.peak, 710);
        /* Giving back makes room, and an account with nothing charged goes. */
        budget_uncharge(&b, 1, BUDGET_OUTPUT, 210);
        budget_uncharge(&b, 3, BUDGET_HELD, 100);
        CHECK_EQ(budget_charge(&b, 4, BUDGET_HELD, 100, NULL), 0);
        budget_uncharge(&b, 1, BUDGET_HELD, 200);
        budget_uncharge(&b, 2, BUDGET_HELD, 200);
        budget_uncharge(&b, 4, BUDGET_HELD, 100);
        CHECK_EQ(b.used[BUDGET_HELD], 0);
        CHECK_EQ(b.used[BUDGET_OUTPUT], 0);
        CHECK_EQ(b.uids.count, 0);
        CHECK_EQ(budget_take_freed(&b), 810);
        CHECK_EQ(budget_take_freed(&b), 0);
        CHECK_EQ(b.mismatched, 0);
        /* More given back than was charged is a bug: clamped and counted, never below zero. */
        CHECK_EQ(budget_charge(&b, 7, BUDGET_HELD, 10, NULL), 0);
        budget_uncharge(&b, 7, BUDGET_HELD, 11);
        budget_uncharge(&b, 8, BUDGET_HELD, 1);
        CHECK_EQ(b.mismatched, 2);
        CHECK_EQ(b.used[BUDGET_HELD], 0);
        CHECK_EQ(b.uids.count, 0);
        budget_deinit(&b);
        /* No budget: everything fits. */
        CHECK_EQ(budget_charge(NULL, 1, BUDGET_HELD, UINT64_MAX, NULL), 0);
        CHECK_EQ(budget_over(NULL, 1, BUDGET_OUTPUT, NULL), 0);
}

/* A share larger than the budget is the budget; deinit frees accounts still charged. */
static void test_budget_share_clamped(void)
{
        Budget b;

        budget_init(&b, 100, 1000);
        CHECK_EQ(b.uid_share, 100);
        CHECK_EQ(budget_charge(&b, 1, BUDGET_HELD, 50, NULL), 0);
        CHECK_EQ(budget_charge(&b, 1, BUDGET_HELD, 1, NULL), BUDGET_E_UID);
        for (uint32_t uid = 10; uid < 60; uid++)
                CHECK_EQ(budget_force(&b, uid, BUDGET_OUTPUT, 1), 0);
        budget_deinit(&b); /* LeakSanitizer: nothing left behind */
}

/* The cgroup v2 path from /proc/self/cgroup, and the limit from memory.max ("max": none). */
static void test_budget_cgroup_files(void)
{
        char path[64];
        uint64_t v = 0;

        CHECK_EQ(budget_parse_cgroup("0::/kubepods.slice/pod1/cri-containerd-1.scope\n", path, sizeof(path)), 0);
        CHECK_STREQ(path, "/kubepods.slice/pod1/cri-containerd-1.scope");
        CHECK_EQ(budget_parse_cgroup("0::/\n", path, sizeof(path)), 0);
        CHECK_STREQ(path, "/");
        /* Hybrid: v1 hierarchies, then the unified one. */
        CHECK_EQ(budget_parse_cgroup("12:memory:/a\n1:name=systemd:/b\n0::/user.slice\n", path, sizeof(path)), 0);
        CHECK_STREQ(path, "/user.slice");
        CHECK_EQ(budget_parse_cgroup("12:memory:/a\n11:cpu:/b\n", path, sizeof(path)), -ENOENT);
        CHECK_EQ(budget_parse_cgroup("", path, sizeof(path)), -ENOENT);
        CHECK_EQ(budget_parse_cgroup("0::/a-path-longer-than-the-buffer-it-goes-into-by-far-0123456789abcdef\n", path,
                                     sizeof(path)),
                 -ENAMETOOLONG);

        CHECK_EQ(budget_parse_memory_max("max\n", &v), 0);
        CHECK_EQ(v, UINT64_MAX);
        CHECK_EQ(budget_parse_memory_max("67108864\n", &v), 0);
        CHECK_EQ(v, 64u << 20);
        CHECK_EQ(budget_parse_memory_max("0", &v), 0);
        CHECK_EQ(v, 0);
        CHECK_EQ(budget_parse_memory_max("", &v), -EINVAL);
        CHECK_EQ(budget_parse_memory_max("-1\n", &v), -EINVAL);
        CHECK_EQ(budget_parse_memory_max("64M\n", &v), -EINVAL);
        CHECK_EQ(budget_parse_memory_max("maximum\n", &v), -EINVAL);
        CHECK_EQ(budget_parse_memory_max("99999999999999999999999\n", &v), -EINVAL);

        /* Half the limit; without one, a quarter of the machine; a limit too small to halve is none. */
        CHECK_EQ(budget_default(64u << 20, UINT64_C(16) << 30), 32u << 20);
        CHECK_EQ(budget_default(UINT64_MAX, UINT64_C(16) << 30), UINT64_C(4) << 30);
        CHECK_EQ(budget_default(1, UINT64_C(16) << 30), UINT64_C(4) << 30);
        CHECK_EQ(budget_default_share(32u << 20), 8u << 20);
}

/* Sizes as the flags take them. */
static void test_budget_parse_size(void)
{
        uint64_t v = 0;

        CHECK_EQ(budget_parse_size("4096", &v), 0);
        CHECK_EQ(v, 4096);
        CHECK_EQ(budget_parse_size("8M", &v), 0);
        CHECK_EQ(v, 8u << 20);
        CHECK_EQ(budget_parse_size("2G", &v), 0);
        CHECK_EQ(v, UINT64_C(2) << 30);
        CHECK_EQ(budget_parse_size("64K", &v), 0);
        CHECK_EQ(v, 64u << 10);
        CHECK_EQ(budget_parse_size("", &v), -EINVAL);
        CHECK_EQ(budget_parse_size("M", &v), -EINVAL);
        CHECK_EQ(budget_parse_size("-8M", &v), -EINVAL);
        CHECK_EQ(budget_parse_size("8MB", &v), -EINVAL);
        CHECK_EQ(budget_parse_size("8T", &v), -EINVAL);
        CHECK_EQ(budget_parse_size("17179869184G", &v), -EINVAL); /* 2^64 bytes */
        CHECK_EQ(budget_parse_size("99999999999999999999999", &v), -EINVAL);
}

int main(int argc, char **argv)
{
        TEST_RUN(argc, argv, test_budget_shares);
        TEST_RUN(argc, argv, test_budget_share_clamped);
        TEST_RUN(argc, argv, test_budget_cgroup_files);
        TEST_RUN(argc, argv, test_budget_parse_size);
        return TEST_END();
}
