/* The tests' one assertion vocabulary, shared by the unit tests, the fuzz targets' replay, the
 * seccomp tests and (through harness.h) the integration and GPU tests:
 *
 *   CHECK(cond)            cond holds
 *   CHECKF(cond, fmt, ...) cond holds; the failure says what fmt says
 *   CHECK_EQ(a, b)         two integers are equal (both printed on failure)
 *   CHECK_STREQ(a, b)      two C strings are equal (NULL never is)
 *
 * Checks cannot be compiled out (NDEBUG does not touch them). A failed check calls CHECK_FAIL(file,
 * line, fmt, ...), which must not return: by default it prints where and why and aborts, so the
 * test runner sees a failure; the integration harness defines CHECK_FAIL as h_fail before including
 * this header (it also prints the brokers' logs and reports from child processes). */
#pragma once

#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CHECK_FAIL
#define CHECK_FAIL check_abort_
__attribute__((format(printf, 3, 4), unused)) _Noreturn static void check_abort_(const char *file, int line,
                                                                                 const char *fmt, ...)
{
        va_list ap;

        fprintf(stderr, "%s:%d: ", file, line);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
        abort();
}
#endif

#define CHECK(cond)                                                                                         \
        do {                                                                                                \
                if (!(cond))                                                                                \
                        CHECK_FAIL(__FILE__, __LINE__, "check failed: %s", #cond);                          \
        } while (0)

#define CHECKF(cond, ...)                                                                                   \
        do {                                                                                                \
                if (!(cond))                                                                                \
                        CHECK_FAIL(__FILE__, __LINE__, __VA_ARGS__);                                        \
        } while (0)

#define CHECK_EQ(a, b)                                                                                      \
        do {                                                                                                \
                uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);                                            \
                if (a_ != b_)                                                                               \
                        CHECK_FAIL(__FILE__, __LINE__, "check failed: %s == %s (%" PRIu64 " != %" PRIu64 ")", \
                                   #a, #b, a_, b_);                                                         \
        } while (0)

#define CHECK_STREQ(a, b)                                                                                   \
        do {                                                                                                \
                const char *a_ = (a), *b_ = (b);                                                            \
                if (!a_ || !b_ || strcmp(a_, b_) != 0)                                                      \
                        CHECK_FAIL(__FILE__, __LINE__, "check failed: %s == %s (\"%s\" != \"%s\")", #a, #b, \
                                   a_ ? a_ : "(null)", b_ ? b_ : "(null)");                                 \
        } while (0)

/* Exit code that tells meson the test was skipped (never use it for "passed"). */
#define EXIT_TEST_SKIP 77

/* Runs test functions in this process, optionally only those named on the command line (the
 * integration tests fork one process per case instead: harness.h's h_main):
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
                        test_count_++;                                                          \
                }                                                                               \
        } while (0)

#define TEST_END()                                                                              \
        (fprintf(stderr, "%u passed, 0 failed\n", test_count_), test_count_ ? 0 : 1)
