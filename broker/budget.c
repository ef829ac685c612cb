/* The memory budget's accounting (budget.h). What it must never do: let an uncharge take a uid
 * below zero (a mismatched pair would let the uid grow without bound later), or keep an entry for a
 * uid that has nothing charged (uids coming and going would grow the table). */
#include "budget.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "macro.h"

/* A uid's share never exceeds the whole: a share larger than the budget would only make the
 * all-uids check the one that refuses, with a message naming the wrong limit. */
void budget_init(Budget *b, uint64_t limit, uint64_t uid_share)
{
        *b = (Budget){ .limit = limit, .uid_share = MIN(uid_share, limit), .uids = HMAP_INIT };
}

void budget_deinit(Budget *b)
{
        /* Freed bucket by bucket: the table is not used again. */
        for (size_t i = 0; b->uids.buckets && i <= b->uids.mask; i++) {
                HNode *n = b->uids.buckets[i];

                while (n) {
                        HNode *next = n->next;
                        free(container_of(n, BudgetUid, node));
                        n = next;
                }
                b->uids.buckets[i] = NULL;
        }
        hmap_deinit(&b->uids);
}

/* Each pool is half the budget and half of each share. */
/* Split in two so that one pool (frames queued for slow peers) cannot starve the other (what the
 * registry holds), and the reverse. */
static uint64_t pool_limit(const Budget *b)
{
        return b->limit / 2;
}

static uint64_t pool_share(const Budget *b)
{
        return b->uid_share / 2;
}

static BudgetUid *uid_find(const Budget *b, uint32_t uid)
{
        return HMAP_FIND(&b->uids, hash_u64(uid), BudgetUid, node, u, u->uid == uid);
}

/* The uid's entry, made on its first charge: uids with nothing charged have none (uid_put). */
static BudgetUid *uid_get(Budget *b, uint32_t uid)
{
        BudgetUid *u = uid_find(b, uid);

        if (u)
                return u;
        u = calloc(1, sizeof(*u));
        if (!u)
                return NULL;
        u->uid = uid;
        if (hmap_insert(&b->uids, &u->node, hash_u64(uid)) < 0) {
                free(u);
                return NULL;
        }
        return u;
}

/* Drops the entry once every pool of the uid is back to 0, so the table holds only uids that keep
 * something now, however many uids have come and gone. */
static void uid_put(Budget *b, BudgetUid *u)
{
        for (int i = 0; i < _BUDGET_POOL_MAX; i++)
                if (u->used[i])
                        return;
        hmap_remove(&b->uids, &u->node);
        free(u);
}

/* The one place usage grows, so the peak (a stat for sizing the budget) cannot miss a charge. */
static void add(Budget *b, BudgetUid *u, BudgetPool pool, uint64_t n)
{
        u->used[pool] += n;
        b->used[pool] += n;
        b->peak = MAX(b->peak, b->used[BUDGET_HELD] + b->used[BUDGET_OUTPUT]);
}

/* Whether uid (with u_used in the pool) may take n more. */
static int fits(const Budget *b, uint64_t u_used, BudgetPool pool, uint64_t n, BudgetRefusal *ret)
{
        uint64_t share = pool_share(b), all = pool_limit(b);

        /* Written as subtractions: u_used + n could wrap for an absurd n and pass. The uid's share is
         * checked first, so a uid over its own share is told so, not that the broker is full. */
        if (n > share || u_used > share - n) {
                if (ret)
                        *ret = (BudgetRefusal){ BUDGET_E_UID, u_used, share };
                return BUDGET_E_UID;
        }
        if (n > all || b->used[pool] > all - n) {
                if (ret)
                        *ret = (BudgetRefusal){ BUDGET_E_ALL, b->used[pool], all };
                return BUDGET_E_ALL;
        }
        return 0;
}

/* Checked before the uid's entry is made: a refused charge leaves no entry behind. No budget (b
 * NULL) charges nothing, which is how the broker runs without --memory-budget. */
int budget_charge(Budget *b, uint32_t uid, BudgetPool pool, uint64_t n, BudgetRefusal *ret)
{
        BudgetUid *u;
        int r;

        if (!b || n == 0)
                return 0;
        u = uid_find(b, uid);
        r = fits(b, u ? u->used[pool] : 0, pool, n, ret);
        if (r) {
                b->refused++;
                return r;
        }
        if (!u && !(u = uid_get(b, uid)))
                return -ENOMEM;
        add(b, u, pool, n);
        return 0;
}

int budget_force(Budget *b, uint32_t uid, BudgetPool pool, uint64_t n)
{
        BudgetUid *u;

        if (!b || n == 0)
                return 0;
        u = uid_get(b, uid);
        if (!u)
                return -ENOMEM;
        add(b, u, pool, n);
        return 0;
}

void budget_uncharge(Budget *b, uint32_t uid, BudgetPool pool, uint64_t n)
{
        BudgetUid *u;

        if (!b || n == 0)
                return;
        u = uid_find(b, uid);
        if (!u || u->used[pool] < n || b->used[pool] < n) {
                /* Given back twice, or by the wrong uid: a bug, counted (the tests require none) and
                 * clamped, so that the broker keeps serving with a budget a little off. */
                b->mismatched++;
                n = MIN(n, MIN(u ? u->used[pool] : 0, b->used[pool]));
                if (!u)
                        return;
        }
        u->used[pool] -= n;
        b->used[pool] -= n;
        b->freed += n;
        uid_put(b, u);
}

int budget_over(const Budget *b, uint32_t uid, BudgetPool pool, BudgetRefusal *ret)
{
        if (!b)
                return 0;
        return fits(b, budget_uid_used(b, uid, pool), pool, 0, ret);
}

uint64_t budget_uid_used(const Budget *b, uint32_t uid, BudgetPool pool)
{
        const BudgetUid *u = b ? uid_find(b, uid) : NULL;

        return u ? u->used[pool] : 0;
}

uint64_t budget_take_freed(Budget *b)
{
        uint64_t n = b->freed;

        b->freed = 0;
        return n;
}

/* ---- the default ---- */

int budget_parse_cgroup(const char *text, char *ret, size_t cap)
{
        const char *line = text;

        /* cgroup v2 has one line, "0::/path"; v1 lines have a hierarchy number and controllers. */
        while (line && *line) {
                const char *end = strchr(line, '\n');
                size_t len = end ? (size_t)(end - line) : strlen(line);

                if (len >= 3 && memcmp(line, "0::", 3) == 0) {
                        if (len - 3 >= cap)
                                return -ENAMETOOLONG;
                        memcpy(ret, line + 3, len - 3);
                        ret[len - 3] = 0;
                        return 0;
                }
                line = end ? end + 1 : NULL;
        }
        return -ENOENT;
}

/* cgroup v2's memory.max: a byte count, or "max" for no limit (UINT64_MAX); a trailing newline, as
 * the kernel writes it, is fine; anything else is refused rather than guessed. */
int budget_parse_memory_max(const char *text, uint64_t *ret)
{
        size_t len = strlen(text);
        unsigned long long v;
        char *end;

        while (len && (text[len - 1] == '\n' || text[len - 1] == ' '))
                len--;
        if (len == 3 && memcmp(text, "max", 3) == 0) {
                *ret = UINT64_MAX;
                return 0;
        }
        if (len == 0 || !isdigit((unsigned char)text[0]))
                return -EINVAL;
        errno = 0;
        v = strtoull(text, &end, 10);
        if (errno || (size_t)(end - text) != len)
                return -EINVAL;
        *ret = v;
        return 0;
}

/* Without a container limit (or one too small to halve), a quarter of the machine, and at least
 * 1 MiB. */
uint64_t budget_default(uint64_t limit, uint64_t phys)
{
        if (limit != UINT64_MAX && limit / 2 > 0)
                return limit / 2;
        return MAX(phys / 4, (uint64_t)1 << 20);
}

int budget_parse_size(const char *s, uint64_t *ret)
{
        unsigned long long v;
        unsigned shift = 0;
        char *end;

        if (!isdigit((unsigned char)s[0]))
                return -EINVAL;
        errno = 0;
        v = strtoull(s, &end, 10);
        if (errno)
                return -EINVAL;
        if (*end) {
                const char *suffixes = "KMG";
                const char *at = strchr(suffixes, *end);

                if (!at || end[1])
                        return -EINVAL;
                shift = 10 * (unsigned)(at - suffixes + 1);
        }
        if (v > (UINT64_MAX >> shift))
                return -EINVAL;
        *ret = (uint64_t)v << shift;
        return 0;
}
