/* libFuzzer harness: multiple-choice task rows (worker/evaluate/task.h) on arbitrary JSONL. Each
 * line goes through ddp_mc_parse_row: a refusal must carry a message and the line, a row that
 * parses must have 1..64 non-empty choices and a label in range; and the line's text, when it is
 * valid UTF-8, through HellaSwag's preprocess (never longer) and Python's capitalize (as many code
 * points).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "worker/data/tokenizer.h"
#include "worker/evaluate/task.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void one_line(const char *p, size_t n, long line)
{
    ddp_mc_example_t ex;
    ddp_errinfo_t ei;
    int rc = ddp_mc_parse_row(p, n, "fuzz.jsonl", line, &ex, &ei);
    if (rc == DDP_EFORMAT) {
        if (!ei.msg[0] || ei.line != (int)line || strcmp(ei.path, "fuzz.jsonl")) abort();
    } else if (rc == 0) {
        if (ex.n_choices < 1 || ex.n_choices > DDP_MC_MAX_CHOICES) abort();
        if (ex.label < 0 || ex.label >= ex.n_choices || !ex.context) abort();
        for (int i = 0; i < ex.n_choices; i++)
            if (!ex.choices[i] || !ex.choices[i][0]) abort();
        ddp_mc_example_free(&ex);
    }
    if (ddp_tok_utf8_check((const unsigned char *)p, n) != n || memchr(p, 0, n)) return;
    char *s = malloc(n + 1);
    if (!s) return;
    memcpy(s, p, n);
    s[n] = 0;
    char *a = ddp_mc_preprocess(s), *b = ddp_mc_capitalize(s);
    if (a && strlen(a) > n) abort(); /* preprocessing never lengthens */
    if (b && ddp_mc_codepoints(b) != ddp_mc_codepoints(s))
        abort(); /* a simple case mapping: one code point for one */
    free(a);
    free(b);
    free(s);
}

/* libFuzzer's entry point: one input, any bytes; returns 0 (a bug aborts). One thread. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data;
    size_t n = size;
    long line = 1;
    while (n) {
        const char *nl = memchr(p, '\n', n);
        size_t take = nl ? (size_t)(nl - p) : n;
        one_line(p, take, line++);
        if (!nl) break;
        p += take + 1;
        n -= take + 1;
    }
    return 0;
}
