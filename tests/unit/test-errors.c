/* libgpuipc's error codes (client/error.c): the one table in gpuipc.h (GPUIPC_ERRNO_MAP) names the
 * broker's statuses exactly as the protocol does, covers every status, and every code has a name
 * and a text; and the options structs carry their size. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "gpuipc.h"
#include "proto.h"

static const struct {
        int code;
        const char *name;
} map[] = {
#define XX(code, value, name) { value, name },
        GPUIPC_ERRNO_MAP(XX)
#undef XX
};

/* The broker's statuses: each has its code, named as the protocol names it, with its text. */
static void test_broker_statuses_match_the_protocol(void)
{
        for (unsigned status = 1; status < _PROTO_STATUS_MAX; status++) {
                int code = -(int)(1000 + status);
                bool found = false;

                for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
                        found |= map[i].code == code;
                CHECKF(found, "status %u (%s) has no GPUIPC_E_ code", status, proto_status_name(status));
                CHECK_STREQ(gpuipc_err_name(code), proto_status_name(status));
                CHECK_STREQ(gpuipc_strerror(code), proto_status_text(status));
        }
}

/* Every code in the map has its own name and a text of its own (not the errno fallback). */
static void test_every_code_named_and_explained(void)
{
        for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
                CHECK_STREQ(gpuipc_err_name(map[i].code), map[i].name);
                CHECK(strcmp(gpuipc_strerror(map[i].code), "unknown error") != 0);
                for (size_t j = 0; j < i; j++)
                        CHECK(map[i].code != map[j].code && strcmp(map[i].name, map[j].name) != 0);
        }
        CHECK_EQ(GPUIPC_E_NOT_FOUND, -1005);
        CHECK_EQ(GPUIPC_E_BAD_REPLY, -1105);
}

/* Every code's text names the cause and then the fix, as the README promises: a clause after ';' or
 * ':' that tells the reader what to do (one of the verbs below), never a bare "no such buffer". */
static void test_every_text_names_a_fix(void)
{
        static const char *const verbs[] = { "check", "set ", "use ", "give", "retire", "release", "start", "reconnect",
                                             "raise", "send", "wait", "publish", "see ", "pick", "draw", "stop",
                                             "attach", "upgrade", "follow", "do it", "mount" };

        for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
                const char *text = gpuipc_strerror(map[i].code), *fix = strpbrk(text, ";:");
                bool names_fix = false;

                CHECKF(fix != NULL, "%s: '%s' has no fix after the cause", map[i].name, text);
                for (size_t v = 0; v < sizeof(verbs) / sizeof(verbs[0]); v++)
                        names_fix |= strstr(fix, verbs[v]) != NULL;
                CHECKF(names_fix, "%s: '%s' names no fix", map[i].name, text);
        }
        /* The two that did not: a zero struct_size was answered with name rules, not-found with nothing. */
        CHECK(strstr(gpuipc_strerror(GPUIPC_E_INVALID), "struct_size") != NULL);
        CHECK(strstr(gpuipc_strerror(GPUIPC_E_NOT_FOUND), "gpuipcctl ls") != NULL);
}

/* Outside the map: 0, an errno, and nonsense. */
static void test_other_codes(void)
{
        CHECK_STREQ(gpuipc_err_name(0), "ok");
        CHECK_STREQ(gpuipc_err_name(-ENOENT), "ENOENT");
        CHECK_STREQ(gpuipc_strerror(-ENOENT), strerror(ENOENT));
        CHECK_STREQ(gpuipc_err_name(-999999), "unknown");
        CHECK_STREQ(gpuipc_strerror(-999999), "unknown error");
}

/* An options struct whose struct_size was never set is refused before anything happens, saying why
 * (a later release could not tell what it holds). */
static void test_options_need_their_size(void)
{
        gpuipc_options_t o = { .socket_path = "/nonexistent/s.sock" };
        gpuipc_t *c = NULL;

        CHECK_EQ(gpuipc_connect(&c, &o), GPUIPC_E_INVALID);
        CHECK(c == NULL);
        CHECK(strstr(gpuipc_errmsg(NULL), "struct_size") != NULL);
        o.struct_size = sizeof(o);
        o.no_gpus = 1;
        CHECK_EQ(gpuipc_connect(&c, &o), GPUIPC_E_NO_BROKER); /* now it tries */
}

int main(int argc, char **argv)
{
        TEST_RUN(argc, argv, test_broker_statuses_match_the_protocol);
        TEST_RUN(argc, argv, test_every_code_named_and_explained);
        TEST_RUN(argc, argv, test_every_text_names_a_fix);
        TEST_RUN(argc, argv, test_other_codes);
        TEST_RUN(argc, argv, test_options_need_their_size);
        return TEST_END();
}
