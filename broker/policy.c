/* Policy rules, first match wins (pure: no file, no I/O; never a default allow once a policy is
 * loaded):
 *
 *     # comment
 *     allow publish,attach uid=1000 prefix=frames/
 *     allow attach gid=2000 prefix=frames/
 *     deny all any
 *
 * A rule without prefix= covers every name; an empty "prefix=" is an error, not a wildcard.
 * A loaded policy denies what no rule allows. Without a policy file, every peer that can open
 * the socket may publish and attach any name (the socket's mode and group are the gate) and only
 * uid 0 may retire or free other uids' buffers. Numbers only: the broker does no NSS lookups. */
#include "policy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "macro.h"
#include "proto.h"

typedef enum Who { WHO_ANY, WHO_UID, WHO_GID } Who;

/* The prefix is copied in (no pointer into the file's text): the text is freed after parsing, and
 * a reload swaps whole policies. */
typedef struct Rule {
        bool allow;
        unsigned actions;
        Who who;
        uint32_t id;
        char prefix[PROTO_MAX_NAME + 1];
} Rule;

struct Policy {
        size_t n;
        Rule rules[];
};

/* Each request walks the rules in order until one matches, so the count bounds a request's cost;
 * real policies have tens of rules, 4096 is room for generated ones. */
#define POLICY_MAX_RULES 4096

/* Strict: "uid=1000x" or "uid=" is an error rather than uid 1000 or 0; a rule that silently
 * named another uid would grant or deny the wrong peer. */
static int parse_u32(const char *s, uint32_t *ret)
{
        char *end;
        unsigned long v;

        errno = 0;
        v = strtoul(s, &end, 10);
        if (errno || end == s || *end || v > UINT32_MAX)
                return -EINVAL;
        *ret = (uint32_t)v;
        return 0;
}

static int parse_actions(char *s, unsigned *ret)
{
        unsigned a = 0;

        for (char *save = NULL, *t = strtok_r(s, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (strcmp(t, "publish") == 0)
                        a |= POLICY_PUBLISH;
                else if (strcmp(t, "attach") == 0)
                        a |= POLICY_ATTACH;
                else if (strcmp(t, "admin") == 0)
                        a |= POLICY_ADMIN;
                else if (strcmp(t, "all") == 0)
                        a |= POLICY_PUBLISH | POLICY_ATTACH | POLICY_ADMIN;
                else
                        return -EINVAL;
        }
        *ret = a;
        return a ? 0 : -EINVAL;
}

/* Parses one non-empty, non-comment line (modified in place) into r; returns a reason on error. */
static const char *parse_rule(char *line, Rule *r)
{
        char *save = NULL, *tok[4];
        int n = 0;

        for (char *t = strtok_r(line, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) {
                if (n == 4)
                        return "too many words (expected: allow|deny ACTIONS WHO [prefix=P])";
                tok[n++] = t;
        }
        if (n < 3)
                return "too few words (expected: allow|deny ACTIONS WHO [prefix=P])";
        memset(r, 0, sizeof(*r));
        if (strcmp(tok[0], "allow") == 0)
                r->allow = true;
        else if (strcmp(tok[0], "deny") != 0)
                return "a rule starts with allow or deny";
        if (parse_actions(tok[1], &r->actions) < 0)
                return "actions are publish, attach, admin or all, separated by commas";
        if (strcmp(tok[2], "any") == 0)
                r->who = WHO_ANY;
        else if (strncmp(tok[2], "uid=", 4) == 0 && parse_u32(tok[2] + 4, &r->id) == 0)
                r->who = WHO_UID;
        else if (strncmp(tok[2], "gid=", 4) == 0 && parse_u32(tok[2] + 4, &r->id) == 0)
                r->who = WHO_GID;
        else
                return "who is any, uid=N or gid=N (numbers, not names)";
        if (n == 4) {
                if (strncmp(tok[3], "prefix=", 7) != 0 || strlen(tok[3] + 7) > PROTO_MAX_NAME)
                        return "the fourth word is prefix=P, with P at most 255 bytes";
                /* A line cut short after "prefix=" would otherwise match every name: a rule for
                 * every name says so by leaving the prefix out. */
                if (!tok[3][7])
                        return "prefix= is empty (leave prefix= out for a rule on every name)";
                strcpy(r->prefix, tok[3] + 7);
        }
        return NULL;
}

int policy_parse(const char *text, size_t len, Policy **ret, char *err, size_t err_cap)
{
        _cleanup_free_ Policy *p = NULL;
        size_t lineno = 0, cap = 16;
        const char *pos = text, *end = text + len;

        p = calloc(1, sizeof(*p) + cap * sizeof(Rule));
        if (!p)
                return -ENOMEM;
        while (pos < end) {
                const char *nl = memchr(pos, '\n', (size_t)(end - pos));
                size_t l = nl ? (size_t)(nl - pos) : (size_t)(end - pos);
                char line[1024];
                const char *why;
                char *s;

                lineno++;
                /* A rule is four short words and a name of at most 255 bytes: a longer line is
                 * not a rule, and refusing it keeps the copy below bounded. */
                if (l >= sizeof(line)) {
                        snprintf(err, err_cap, "line %zu: longer than %zu bytes", lineno, sizeof(line) - 1);
                        return -EINVAL;
                }
                memcpy(line, pos, l);
                line[l] = 0;
                pos += l + 1;
                /* A NUL would end the line early for the parser and hide what follows it: a file
                 * that is not text is refused rather than half read. */
                if (memchr(line, 0, l)) {
                        snprintf(err, err_cap, "line %zu: NUL byte", lineno);
                        return -EINVAL;
                }
                s = line + strspn(line, " \t\r");
                s[strcspn(s, "#\r")] = 0;
                if (!*s || strspn(s, " \t") == strlen(s))
                        continue;
                if (p->n == POLICY_MAX_RULES) {
                        snprintf(err, err_cap, "line %zu: more than %d rules", lineno, POLICY_MAX_RULES);
                        return -EINVAL;
                }
                if (p->n == cap) {
                        Policy *q = realloc(p, sizeof(*p) + cap * 2 * sizeof(Rule));
                        if (!q)
                                return -ENOMEM;
                        p = q;
                        cap *= 2;
                }
                why = parse_rule(s, &p->rules[p->n]);
                if (why) {
                        snprintf(err, err_cap, "line %zu: %s", lineno, why);
                        return -EINVAL;
                }
                p->n++;
        }
        *ret = steal_ptr(p);
        return 0;
}

Policy *policy_free(Policy *p)
{
        free(p);
        return NULL;
}

size_t policy_rule_count(const Policy *p)
{
        return p ? p->n : 0;
}

size_t policy_named_uids(const Policy *p, uint32_t *uids, size_t cap)
{
        size_t n = 0;

        for (size_t i = 0; p && i < p->n && n < cap; i++) {
                const Rule *r = &p->rules[i];
                size_t j = 0;

                if (r->who != WHO_UID)
                        continue;
                while (j < n && uids[j] != r->id)
                        j++;
                if (j == n)
                        uids[n++] = r->id;
        }
        return n;
}

bool policy_allows(const Policy *p, uint32_t uid, uint32_t gid, PolicyAction action, const char *name)
{
        /* No policy file: the socket's permissions already chose who may connect; only acting on
         * other uids' buffers (admin) stays root's. */
        if (!p)
                return action != POLICY_ADMIN || uid == 0;
        for (size_t i = 0; i < p->n; i++) {
                const Rule *r = &p->rules[i];

                if (!(r->actions & action))
                        continue;
                if ((r->who == WHO_UID && r->id != uid) || (r->who == WHO_GID && r->id != gid))
                        continue;
                /* A plain byte prefix: names are validated (no "..", no leading '/') before they
                 * get here, so "frames/" cannot be escaped by a path trick. */
                if (strncmp(name, r->prefix, strlen(r->prefix)) != 0)
                        continue;
                return r->allow;
        }
        /* Nothing matched: a loaded policy is an allow-list. */
        return false;
}
