/* Command-line values: sizes, numbers and kinds, parsed strictly (base 10, no sign where none is
 * allowed, nothing trailing); each refusal names the option and the value it got. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"

/* For tables only (--json gives the exact byte count): one decimal tells sizes apart at a glance;
 * below 1 KiB the count is exact ("512 B"). */
void ctl_human_size(uint64_t n, char *buf, size_t cap)
{
        static const char *units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
        unsigned u = 0;
        double v = (double)n;

        while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
                v /= 1024;
                u++;
        }
        snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

/* The binary shift of a unit letter, or -1. */
static int unit_shift(char c)
{
        switch (c) {
        case 'K': case 'k': return 10;
        case 'M': case 'm': return 20;
        case 'G': case 'g': return 30;
        case 'T': case 't': return 40;
        }
        return -1;
}

/* NUMBER, NUMBER "B", or NUMBER UNIT ["i"] ["B"] with UNIT one of K M G T (either case). */
int ctl_parse_size(Ctl *ctl, const char *opt, const char *s, uint64_t *ret)
{
        unsigned long long v;
        const char *end;
        char *num_end;
        int shift = 0;

        /* strtoull would take " 12", "+12" and even "-12" (as a huge number): a digit first
         * refuses all three. */
        if (!isdigit((unsigned char)s[0]))
                goto bad;
        errno = 0;
        v = strtoull(s, &num_end, 10);
        end = num_end;
        if (errno == ERANGE)
                return ctl_usage(ctl, "%s '%s': too large", opt, s);
        if (*end && unit_shift(*end) >= 0) {
                shift = unit_shift(*end++);
                if (*end == 'i')
                        end++;
        }
        /* "i" and "B" add nothing: K, KB and KiB are all 1024, as --size's help says, so a unit
         * written either way means what a person expects of a memory size. */
        if (*end == 'B')
                end++;
        if (*end)
                goto bad;
        if (v == 0)
                return ctl_usage(ctl, "%s '%s': a buffer needs at least 1 byte", opt, s);
        /* Checked before the shift, which would silently drop the high bits. */
        if (v > (UINT64_MAX >> shift))
                return ctl_usage(ctl, "%s '%s': too large", opt, s);
        *ret = (uint64_t)v << shift;
        return 0;
bad:
        return ctl_usage(ctl, "%s '%s': not a size; give bytes, or a number with K, M, G or T (powers of 1024): "
                         "4096, 64K, 2MiB, 1G", opt, s);
}

int ctl_parse_int(Ctl *ctl, const char *opt, const char *s, long min, long max, long *ret)
{
        char *end;
        long v;

        /* Reset first: strtol leaves errno alone on success, so a stale ERANGE would refuse a
         * good value. */
        errno = 0;
        v = strtol(s, &end, 10);
        /* strtol skips leading blanks and takes a '+': neither belongs in a value. */
        if (errno || end == s || *end || isspace((unsigned char)s[0]) || s[0] == '+' || v < min || v > max)
                return ctl_usage(ctl, "%s '%s': must be a whole number from %ld to %ld", opt, s, min, max);
        *ret = v;
        return 0;
}

int ctl_parse_kind(Ctl *ctl, const char *opt, const char *s, gpuipc_kind_t *ret)
{
        if (gpuipc_kind_from_name(s, ret) < 0)
                return ctl_usage(ctl, "%s '%s': not a buffer kind; use memfd, cuda-vmm or cuda-legacy", opt, s);
        return 0;
}
