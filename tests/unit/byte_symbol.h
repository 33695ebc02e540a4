/* GPT-2's byte-level alphabet for tests that write a tokenizer.json by hand (its vocabulary's
 * keys): the same mapping as worker/data/tokenizer.c's, written again here on purpose so that a
 * test does not take the code under test as its oracle. */
#ifndef DDP_TESTS_BYTE_SYMBOL_H
#define DDP_TESTS_BYTE_SYMBOL_H

#include <stdio.h>

/* Byte b's symbol in GPT-2's byte-level alphabet, UTF-8 and JSON-escaped, into out (8 bytes;
 * NUL-terminated). */
static inline void byte_symbol(int b, char *out)
{
    int cp = b, next = 256;
    for (int i = 0; i < 256; i++) {
        int printable = (i >= 0x21 && i <= 0x7e) || (i >= 0xa1 && i <= 0xac) || i >= 0xae;
        if (i == b) {
            cp = printable ? i : next;
            break;
        }
        if (!printable) next++;
    }
    if (cp == '"' || cp == '\\')
        snprintf(out, 8, "\\%c", cp);
    else if (cp < 0x80)
        snprintf(out, 8, "%c", cp);
    else
        snprintf(out, 8, "%c%c", 0xc0 | (cp >> 6), 0x80 | (cp & 0x3f));
}

#endif
