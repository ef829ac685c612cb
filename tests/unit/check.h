/* Assertions for the unit tests: they cannot be compiled out (NDEBUG does not touch them), print
 * file:line and the failed expression, and abort so the test runner sees a failure. */
#pragma once

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define check(cond)                                                                             \
        do {                                                                                    \
                if (!(cond)) {                                                                  \
                        fprintf(stderr, "%s:%d: %s: check failed: %s\n", __FILE__, __LINE__,   \
                                __func__, #cond);                                               \
                        abort();                                                                \
                }                                                                               \
        } while (0)

/* Integer equality that prints both values on failure. */
#define check_eq(a, b)                                                                          \
        do {                                                                                    \
                uint64_t _a = (uint64_t)(a), _b = (uint64_t)(b);                                \
                if (_a != _b) {                                                                 \
                        fprintf(stderr, "%s:%d: %s: check failed: %s == %s (%" PRIu64           \
                                " != %" PRIu64 ")\n", __FILE__, __LINE__, __func__, #a, #b, _a, _b); \
                        abort();                                                                \
                }                                                                               \
        } while (0)

#define check_streq(a, b)                                                                       \
        do {                                                                                    \
                const char *_a = (a), *_b = (b);                                                \
                if (!_a || !_b || strcmp(_a, _b) != 0) {                                        \
                        fprintf(stderr, "%s:%d: %s: check failed: %s == %s (\"%s\" != \"%s\")\n", \
                                __FILE__, __LINE__, __func__, #a, #b, _a ? _a : "(null)",       \
                                _b ? _b : "(null)");                                            \
                        abort();                                                                \
                }                                                                               \
        } while (0)

/* Exit code that tells meson the test was skipped (never use it for "passed"). */
#define EXIT_TEST_SKIP 77

/* Runs test functions, optionally only those named on the command line:
 *     int main(int argc, char **argv) { TEST_RUN(argc, argv, test_a); ...; return TEST_END(); }
 * A name prefixed with "bug_" runs only when named explicitly: those tests expose known bugs in
 * the code under test and are registered as their own meson test, so they fail on their own. */
static unsigned test_count_ __attribute__((unused));

static inline int test_selected_(int argc, char **argv, const char *name)
{
        if (argc < 2)
                return strncmp(name, "test_bug_", 9) != 0;
        for (int i = 1; i < argc; i++)
                if (strcmp(argv[i], name) == 0 || strcmp(argv[i], name + 5) == 0)
                        return 1;
        return 0;
}

#define TEST_RUN(argc, argv, fn)                                                                \
        do {                                                                                    \
                if (test_selected_(argc, argv, #fn)) {                                          \
                        fprintf(stderr, "%s ...\n", #fn);                                       \
                        fn();                                                                   \
                        test_count_++;                                                  \
                }                                                                               \
        } while (0)

#define TEST_END()                                                                              \
        (fprintf(stderr, "%u passed, 0 failed\n", test_count_), test_count_ ? 0 : 1)
