/* UTF-8 validation (RFC 3629): the broker refuses strings that are not valid UTF-8 at the door, so
 * that everything it echoes (labels, names, metadata) is valid text for every reader. */
#include "proto.h"

/* Length of the sequence that starts with b, or 0 if b cannot start one. The ranges of the second
 * byte exclude overlong forms, UTF-16 surrogates and code points above U+10FFFF. */
static unsigned sequence_length(uint8_t b, uint8_t *lo, uint8_t *hi)
{
        *lo = 0x80;
        *hi = 0xbf;
        if (b < 0x80)
                return 1;
        if (b >= 0xc2 && b <= 0xdf)
                return 2;
        if (b >= 0xe0 && b <= 0xef) {
                if (b == 0xe0)
                        *lo = 0xa0; /* overlong */
                else if (b == 0xed)
                        *hi = 0x9f; /* surrogates */
                return 3;
        }
        if (b >= 0xf0 && b <= 0xf4) {
                if (b == 0xf0)
                        *lo = 0x90; /* overlong */
                else if (b == 0xf4)
                        *hi = 0x8f; /* above U+10FFFF */
                return 4;
        }
        return 0;
}

bool proto_utf8_valid(const char *s, size_t len)
{
        const uint8_t *p = (const uint8_t *)s, *end = p + len;

        while (p < end) {
                uint8_t lo, hi;
                unsigned n = sequence_length(*p, &lo, &hi);

                if (n == 0 || (size_t)(end - p) < n)
                        return false;
                for (unsigned i = 1; i < n; i++) {
                        uint8_t c = p[i];

                        if (c < (i == 1 ? lo : 0x80) || c > (i == 1 ? hi : 0xbf))
                                return false;
                }
                p += n;
        }
        return true;
}

size_t proto_utf8_trim(const char *s, size_t len)
{
        size_t start = len;

        /* Back up to the start of the last sequence (at most 3 continuation bytes). */
        while (start > 0 && len - start < 4 && ((uint8_t)s[start - 1] & 0xc0) == 0x80)
                start--;
        if (start > 0 && !proto_utf8_valid(s + start - 1, len - start + 1))
                return start - 1;
        return len;
}
