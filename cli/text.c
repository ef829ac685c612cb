/* Text from other peers, made safe to print: UTF-8 checked, control characters replaced. */
#include "text.h"

#include <stdint.h>
#include <string.h>

/* The same acceptance as the broker's proto_utf8_valid (RFC 3629), so what the broker let through
 * as text prints here unchanged; it is restated rather than linked because gpuipcctl may use only
 * libgpuipc's public API (tests/cli checks that). 0xc0, 0xc1 and 0xf5 and above never start a
 * sequence. */
size_t utf8_sequence(const unsigned char *s, size_t len)
{
        size_t n;
        uint32_t cp;

        if (s[0] < 0x80)
                return 1;
        if (s[0] >= 0xc2 && s[0] <= 0xdf)
                n = 2, cp = s[0] & 0x1f;
        else if (s[0] >= 0xe0 && s[0] <= 0xef)
                n = 3, cp = s[0] & 0x0f;
        else if (s[0] >= 0xf0 && s[0] <= 0xf4)
                n = 4, cp = s[0] & 0x07;
        else
                return 0;
        if (n > len)
                return 0;
        for (size_t i = 1; i < n; i++) {
                if ((s[i] & 0xc0) != 0x80)
                        return 0;
                cp = cp << 6 | (s[i] & 0x3f);
        }
        /* Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8. */
        if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
                return 0;
        return n;
}

void text_safe(FILE *f, const char *s)
{
        const unsigned char *p = (const unsigned char *)s;
        size_t len = strlen(s);

        for (size_t i = 0; i < len;) {
                size_t n = utf8_sequence(p + i, len - i);

                /* One '?' per invalid byte or control character: the cell keeps its width as
                 * table.c counts it (one character per such byte). The C1 controls U+0080-U+009F
                 * (C2 80-C2 9F) count too: terminals that take them read U+009B alone as CSI. */
                if (n == 0 || p[i] < 0x20 || p[i] == 0x7f || (n == 2 && p[i] == 0xc2 && p[i + 1] < 0xa0)) {
                        fputc('?', f);
                        i += n ? n : 1;
                } else {
                        fwrite(p + i, 1, n, f);
                        i += n;
                }
        }
}

/* Never cut to fit: a name cut short could read as another buffer's name. */
void text_cell(FILE *f, const char *s, int width)
{
        const unsigned char *p = (const unsigned char *)s;
        size_t len = strlen(s);
        int chars = 0;

        text_safe(f, s);
        /* Width in characters, as a terminal advances (wide CJK glyphs aside), not in bytes. */
        for (size_t i = 0; i < len; chars++) {
                size_t n = utf8_sequence(p + i, len - i);
                i += n ? n : 1;
        }
        for (; chars < width; chars++)
                fputc(' ', f);
}
