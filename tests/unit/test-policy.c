/* broker/policy.c: parsing (errors name their line), first match wins, the built-in default. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "policy.h"

/* Parses text from an exact-size heap copy (no NUL after it), so reading past len is caught. */
static int parse(const char *text, size_t len, Policy **ret, char *err, size_t cap)
{
        char *copy = malloc(len ? len : 1);
        int r;

        CHECK(copy);
        memcpy(copy, text, len);
        r = policy_parse(copy, len, ret, err, cap);
        free(copy);
        return r;
}

static Policy *parse_ok(const char *text)
{
        Policy *p = NULL;
        char err[256] = "";
        int r = parse(text, strlen(text), &p, err, sizeof(err));

        if (r != 0)
                fprintf(stderr, "unexpected parse error: %s\n", err);
        CHECK_EQ(r, 0);
        CHECK(p);
        return p;
}

/* Checks text fails on line `line` with a reason containing `why`. */
static void parse_fails(const char *text, size_t len, unsigned line, const char *why)
{
        Policy *p = (Policy *)0x1;
        char err[256] = "", want[32];

        CHECK_EQ(parse(text, len, &p, err, sizeof(err)), -EINVAL);
        CHECK(p == (Policy *)0x1); /* untouched on failure */
        snprintf(want, sizeof(want), "line %u: ", line);
        if (strncmp(err, want, strlen(want)) != 0 || !strstr(err, why))
                fprintf(stderr, "error text: '%s' (want '%s...%s')\n", err, want, why);
        CHECK(strncmp(err, want, strlen(want)) == 0);
        CHECK(strstr(err, why));
}

static void parse_fails_s(const char *text, unsigned line, const char *why)
{
        parse_fails(text, strlen(text), line, why);
}

/* Without a policy file everyone publishes and attaches, and only root may manage other uids' buffers. */
static void test_default(void)
{
        /* Without a policy file: everyone publishes and attaches, only root manages others' buffers. */
        CHECK(policy_allows(NULL, 1000, 1000, POLICY_PUBLISH, "x"));
        CHECK(policy_allows(NULL, 1000, 1000, POLICY_ATTACH, "frames/0"));
        CHECK(policy_allows(NULL, 0, 0, POLICY_ATTACH, ""));
        CHECK(!policy_allows(NULL, 1000, 0, POLICY_ADMIN, "x"));
        CHECK(!policy_allows(NULL, 1, 0, POLICY_ADMIN, "x"));
        CHECK(policy_allows(NULL, 0, 1000, POLICY_ADMIN, "x"));
        CHECK_EQ(policy_rule_count(NULL), 0);
        CHECK(policy_free(NULL) == NULL);
}

/* The example policy in docs/security.md means what the documentation says (prefixes, gid rules, a final deny; root
 * no exception). */
static void test_documented_example(void)
{
        Policy *p = parse_ok("# comment\n"
                             "allow publish,attach uid=1000 prefix=frames/\n"
                             "allow attach gid=2000 prefix=frames/\n"
                             "deny all any\n");

        CHECK_EQ(policy_rule_count(p), 3);
        CHECK(policy_allows(p, 1000, 5, POLICY_PUBLISH, "frames/0"));
        CHECK(policy_allows(p, 1000, 5, POLICY_ATTACH, "frames/0"));
        CHECK(!policy_allows(p, 1000, 5, POLICY_ADMIN, "frames/0"));
        CHECK(!policy_allows(p, 1000, 5, POLICY_PUBLISH, "weights/0"));
        CHECK(!policy_allows(p, 1000, 5, POLICY_PUBLISH, "frames")); /* a prefix, not a glob */
        CHECK(policy_allows(p, 3000, 2000, POLICY_ATTACH, "frames/x"));
        CHECK(!policy_allows(p, 3000, 2000, POLICY_PUBLISH, "frames/x"));
        CHECK(!policy_allows(p, 2000, 3000, POLICY_ATTACH, "frames/x")); /* gid=, not uid= */
        CHECK(!policy_allows(p, 0, 0, POLICY_ADMIN, "frames/x"));          /* root is no exception */
        CHECK(policy_free(p) == NULL);
}

/* Rules are tried in order and the first that matches decides; no match denies. */
static void test_first_match_wins(void)
{
        Policy *p = parse_ok("deny attach uid=1000 prefix=secret/\n"
                             "allow all any\n"
                             "deny all uid=1000\n");

        CHECK(!policy_allows(p, 1000, 0, POLICY_ATTACH, "secret/k"));
        CHECK(policy_allows(p, 1000, 0, POLICY_PUBLISH, "secret/k")); /* the deny names attach only */
        CHECK(policy_allows(p, 1000, 0, POLICY_ATTACH, "public"));     /* the later deny never runs */
        CHECK(policy_allows(p, 1001, 0, POLICY_ATTACH, "secret/k"));
        CHECK(policy_allows(p, 1001, 0, POLICY_ADMIN, "anything"));
        policy_free(p);

        p = parse_ok("allow attach any prefix=a/\ndeny attach any prefix=a/b\n");
        CHECK(policy_allows(p, 1, 1, POLICY_ATTACH, "a/b"));
        CHECK(!policy_allows(p, 1, 1, POLICY_ATTACH, "b"));           /* no rule matched: denied */
        CHECK(!policy_allows(p, 1, 1, POLICY_PUBLISH, "a/x"));
        policy_free(p);
}

/* A loaded policy with no rules denies everything, to root too. */
static void test_empty_policy_denies(void)
{
        static const char *const empties[] = { "", "\n", "# only a comment\n", "   \t \n\n", "\r\n" };

        for (size_t i = 0; i < sizeof(empties) / sizeof(empties[0]); i++) {
                Policy *p = parse_ok(empties[i]);

                CHECK_EQ(policy_rule_count(p), 0);
                /* A loaded policy denies what no rule allows, to root too. */
                CHECK(!policy_allows(p, 0, 0, POLICY_PUBLISH, "x"));
                CHECK(!policy_allows(p, 0, 0, POLICY_ATTACH, "x"));
                CHECK(!policy_allows(p, 0, 0, POLICY_ADMIN, "x"));
                policy_free(p);
        }
}

/* Each action (and "all") is granted only to the uid or gid its rule names, up to the largest uid; nothing else is
 * implied. */
static void test_actions_and_who(void)
{
        Policy *p = parse_ok("allow admin uid=7\n"
                             "allow publish gid=8 prefix=p/\n"
                             "allow attach,publish uid=9\n"
                             "allow publish,attach,admin uid=10\n"
                             "allow all uid=4294967295\n");

        CHECK_EQ(policy_rule_count(p), 5);
        CHECK(policy_allows(p, 7, 0, POLICY_ADMIN, "any/name"));
        CHECK(!policy_allows(p, 7, 0, POLICY_ATTACH, "any/name"));
        CHECK(policy_allows(p, 100, 8, POLICY_PUBLISH, "p/1"));
        CHECK(!policy_allows(p, 100, 8, POLICY_PUBLISH, "q/1"));
        CHECK(policy_allows(p, 9, 0, POLICY_ATTACH, "z"));
        CHECK(policy_allows(p, 9, 0, POLICY_PUBLISH, "z"));
        CHECK(!policy_allows(p, 9, 0, POLICY_ADMIN, "z"));
        CHECK(policy_allows(p, 10, 0, POLICY_ADMIN, "z"));
        CHECK(policy_allows(p, UINT32_MAX, 0, POLICY_ADMIN, "z"));
        CHECK(!policy_allows(p, 0, 0, POLICY_ADMIN, "z"));
        policy_free(p);
}

/* A rule's prefix is a plain, case-sensitive byte prefix; no prefix matches every name, 255 bytes is the longest. */
static void test_prefixes(void)
{
        char line[400];
        Policy *p;

        p = parse_ok("allow attach any\n");
        CHECK(policy_allows(p, 1, 1, POLICY_ATTACH, "anything"));
        CHECK(policy_allows(p, 1, 1, POLICY_ATTACH, ""));
        policy_free(p);

        p = parse_ok("allow attach any prefix=frames/cam0\n");
        CHECK(policy_allows(p, 1, 1, POLICY_ATTACH, "frames/cam0"));
        CHECK(policy_allows(p, 1, 1, POLICY_ATTACH, "frames/cam0/1"));
        CHECK(policy_allows(p, 1, 1, POLICY_ATTACH, "frames/cam01")); /* plain byte prefix */
        CHECK(!policy_allows(p, 1, 1, POLICY_ATTACH, "frames/cam"));
        CHECK(!policy_allows(p, 1, 1, POLICY_ATTACH, "Frames/cam0"));
        policy_free(p);

        /* 255 bytes is the longest prefix. */
        memset(line, 0, sizeof(line));
        strcpy(line, "allow all any prefix=");
        memset(line + strlen(line), 'a', 255);
        p = parse_ok(line);
        CHECK_EQ(policy_rule_count(p), 1);
        {
                char name[300] = { 0 };
                memset(name, 'a', 255);
                CHECK(policy_allows(p, 1, 1, POLICY_ATTACH, name));
                name[254] = 'b';
                CHECK(!policy_allows(p, 1, 1, POLICY_ATTACH, name));
        }
        policy_free(p);
        strcat(line, "a");
        parse_fails_s(line, 1, "prefix=P");
}

/* Tabs, runs of spaces, CRLF, comment lines, trailing comments and a missing final newline do not change what a
 * rule means. */
static void test_whitespace_and_comments(void)
{
        Policy *p = parse_ok("\t  allow\tattach   uid=5  prefix=x/   # trailing comment\r\n"
                             "#deny all any\n"
                             "\n"
                             "   # indented comment\n"
                             "deny publish any\r\n"
                             "allow publish uid=5"); /* no final newline */

        CHECK_EQ(policy_rule_count(p), 3);
        CHECK(policy_allows(p, 5, 0, POLICY_ATTACH, "x/1"));
        CHECK(!policy_allows(p, 5, 0, POLICY_ATTACH, "y"));
        CHECK(!policy_allows(p, 5, 0, POLICY_PUBLISH, "x/1"));
        policy_free(p);
}

/* Every malformed rule is refused with its line number and what is wrong in it. */
static void test_errors_name_their_line(void)
{
        char buf[2048];

        parse_fails_s("allow\n", 1, "too few words");
        parse_fails_s("allow all\n", 1, "too few words");
        parse_fails_s("permit all any\n", 1, "allow or deny");
        parse_fails_s("Allow all any\n", 1, "allow or deny");
        parse_fails_s("allow fly any\n", 1, "actions");
        parse_fails_s("allow publish,fly any\n", 1, "actions");
        parse_fails_s("allow , any\n", 1, "actions");
        parse_fails_s("allow all user=5\n", 1, "who");
        parse_fails_s("allow all uid=\n", 1, "who");
        parse_fails_s("allow all uid=abc\n", 1, "who");
        parse_fails_s("allow all uid=5x\n", 1, "who");
        parse_fails_s("allow all uid=0x10\n", 1, "who");
        parse_fails_s("allow all uid=4294967296\n", 1, "who");
        parse_fails_s("allow all uid=-1\n", 1, "who");
        parse_fails_s("allow all gid=99999999999999999999999\n", 1, "who");
        parse_fails_s("allow all uid=root\n", 1, "numbers");
        parse_fails_s("allow all any foo=bar\n", 1, "prefix=P");
        parse_fails_s("allow all any prefix=x extra\n", 1, "too many words");
        /* An empty prefix= (a line cut short) is not a wildcard: it is refused, naming its line. */
        parse_fails_s("allow all any prefix=\n", 1, "prefix= is empty");
        parse_fails_s("allow attach uid=5 prefix=frames/\nallow publish,attach uid=5 prefix=\r\n", 2,
                      "prefix= is empty");
        parse_fails_s("deny all any prefix=   # cut\n", 1, "prefix= is empty");
        /* The line number counts every line, blank and comment lines too. */
        parse_fails_s("# header\nallow all uid=1\n\ndeny all\n", 4, "too few words");
        parse_fails_s("allow all any\r\nallow all any\r\nbogus all any\r\n", 3, "allow or deny");
        /* Over-long lines and NUL bytes. */
        memset(buf, 'a', sizeof(buf));
        memcpy(buf, "allow all any\n", 14);
        parse_fails(buf, 14 + 1024, 2, "longer than");
        parse_fails(buf, 14 + 1023, 2, "too few words"); /* 1023 bytes are read, then judged */
        parse_fails("allow all any\nallow\0all any\n", sizeof("allow all any\nallow\0all any\n") - 1, 2, "NUL byte");

        /* A small error buffer truncates the text, never overflows. */
        {
                char small[8];
                Policy *p = NULL;

                memset(small, 'z', sizeof(small));
                CHECK_EQ(parse("bogus", 5, &p, small, sizeof(small)), -EINVAL);
                CHECK_EQ(strlen(small), sizeof(small) - 1);
                CHECK(p == NULL);
        }
}

/* A policy of 4096 rules loads; one more is refused, saying so. */
/* The uids the rules name, once each, in order of first appearance, bounded by cap; gid and any
 * rules name none. */
static void test_named_uids(void)
{
        Policy *p = parse_ok("allow publish uid=10001 prefix=a/\n"
                             "deny attach gid=10001\n"
                             "allow attach uid=10002\n"
                             "allow all uid=10001 prefix=b/\n"
                             "allow all any\n"
                             "deny admin uid=0\n");
        uint32_t uids[8];

        CHECK_EQ(policy_named_uids(p, uids, 8), 3);
        CHECK_EQ(uids[0], 10001);
        CHECK_EQ(uids[1], 10002);
        CHECK_EQ(uids[2], 0);
        CHECK_EQ(policy_named_uids(p, uids, 2), 2);
        CHECK_EQ(policy_named_uids(NULL, uids, 8), 0);
        policy_free(p);
}

static void test_rule_limit(void)
{
        enum { LINE = 14 }; /* "allow all any\n" */
        size_t n = 4096;
        char *text = malloc(LINE * (n + 1));
        Policy *p = NULL;
        char err[128];

        CHECK(text);
        for (size_t i = 0; i <= n; i++)
                memcpy(text + i * LINE, "allow all any\n", LINE);
        CHECK_EQ(parse(text, LINE * n, &p, err, sizeof(err)), 0);
        CHECK_EQ(policy_rule_count(p), n);
        CHECK(policy_allows(p, 1, 1, POLICY_ADMIN, "x"));
        policy_free(p);
        parse_fails(text, LINE * (n + 1), 4097, "more than 4096 rules");
        free(text);
}

int main(int argc, char **argv)
{
        TEST_RUN(argc, argv, test_default);
        TEST_RUN(argc, argv, test_documented_example);
        TEST_RUN(argc, argv, test_first_match_wins);
        TEST_RUN(argc, argv, test_empty_policy_denies);
        TEST_RUN(argc, argv, test_actions_and_who);
        TEST_RUN(argc, argv, test_prefixes);
        TEST_RUN(argc, argv, test_whitespace_and_comments);
        TEST_RUN(argc, argv, test_errors_name_their_line);
        TEST_RUN(argc, argv, test_rule_limit);
        TEST_RUN(argc, argv, test_named_uids);
        return TEST_END();
}
