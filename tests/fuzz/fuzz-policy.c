/* Fuzz target: policy_parse on arbitrary text, then policy_allows over a few identities and names.
 * Errors must name a line that exists; a parsed policy must answer every question without reading
 * past its rules, and the same text must always give the same answers. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fuzz.h"
#include "policy.h"

static const char *const names[] = { "", "a", "frames/0", "frames/cam0/1", "secret/key", "x/../y" };
static const uint32_t ids[] = { 0, 1, 1000, 2000, UINT32_MAX };
static const PolicyAction actions[] = { POLICY_PUBLISH, POLICY_ATTACH, POLICY_ADMIN };

/* Answers for every (uid, gid, action, name) above, as bits. */
static void decide(const Policy *p, uint8_t *out, size_t n)
{
        size_t k = 0;

        memset(out, 0, n);
        for (size_t u = 0; u < sizeof(ids) / sizeof(ids[0]); u++)
                for (size_t g = 0; g < sizeof(ids) / sizeof(ids[0]); g += 2)
                        for (size_t a = 0; a < 3; a++)
                                for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++, k++)
                                        if (policy_allows(p, ids[u], ids[g], actions[a], names[i]))
                                                out[k / 8] |= (uint8_t)(1u << (k % 8));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        uint8_t first[64], second[64];
        char err[128];
        Policy *p = NULL, *q = NULL;
        size_t lines = 1;
        int r;

        for (size_t i = 0; i < size; i++)
                lines += data[i] == '\n';
        memset(err, 0x55, sizeof(err));
        r = policy_parse((const char *)data, size, &p, err, sizeof(err));
        if (r < 0) {
                unsigned long line;
                char *end;

                CHECK(r == -EINVAL || r == -ENOMEM);
                CHECK(p == NULL);
                if (r == -EINVAL) {
                        CHECK(memchr(err, 0, sizeof(err)) != NULL);
                        CHECK(strncmp(err, "line ", 5) == 0);
                        line = strtoul(err + 5, &end, 10);
                        CHECK(line >= 1 && line <= lines);
                        CHECK(*end == ':');
                }
                return 0;
        }
        CHECK_EQ(r, 0);
        CHECK(p);
        CHECK(policy_rule_count(p) <= 4096);
        CHECK(policy_rule_count(p) <= lines);
        decide(p, first, sizeof(first));
        /* Deterministic: the same text, parsed again, decides the same way. */
        CHECK_EQ(policy_parse((const char *)data, size, &q, err, sizeof(err)), 0);
        decide(q, second, sizeof(second));
        CHECK(memcmp(first, second, sizeof(first)) == 0);
        /* No rules: nothing is allowed. */
        if (policy_rule_count(p) == 0)
                for (size_t i = 0; i < sizeof(first); i++)
                        CHECK_EQ(first[i], 0);
        policy_free(q);
        CHECK(policy_free(p) == NULL);
        return 0;
}
