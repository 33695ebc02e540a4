/* libFuzzer harness: the byte-level BPE (worker/tokenizer.h). An input that starts with 0xff
 * is a tokenizer.json for the loader (it must load or fail cleanly); any other input is text
 * for a fixed tokenizer (every byte, a few merges, an added token): valid UTF-8 must encode
 * and decode back to itself, and invalid UTF-8 must be reported at the first offset where the
 * prefix stops being valid.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "worker/data/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The fixed tokenizer: ids 0..255 the bytes in GPT-2's alphabet, merges "t h", "th e",
 * "Ġ t", "e e", and the added token "<|eot|>" (id 300). */
static ddp_tok_t *fixed(void)
{
    static ddp_tok_t *t;
    if (t) return t;
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", fuzz_scratch());
    FILE *f = fopen(path, "w");
    if (!f) abort();
    fputs("{\"added_tokens\": [{\"id\": 300, \"content\": \"<|eot|>\", \"normalized\": false}],"
          " \"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", "
          "\"add_prefix_space\": false, \"use_regex\": true}, \"model\": {\"type\": \"BPE\", "
          "\"vocab\": {",
          f);
    int next = 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        int cp = printable ? b : next++;
        if (cp == '"' || cp == '\\')
            fprintf(f, "\"\\%c\": %d, ", cp, b);
        else if (cp < 0x80)
            fprintf(f, "\"%c\": %d, ", cp, b);
        else
            fprintf(f, "\"%c%c\": %d, ", 0xc0 | (cp >> 6), 0x80 | (cp & 0x3f), b);
    }
    fputs("\"th\": 256, \"the\": 257, \"\xc4\xa0t\": 258, \"ee\": 259}, \"merges\": "
          "[\"t h\", \"th e\", \"\xc4\xa0 t\", [\"e\", \"e\"]]}}",
          f);
    if (fclose(f)) abort();
    ddp_errinfo_t ei;
    if (ddp_tok_load(path, &t, &ei)) {
        fprintf(stderr, "fuzz_tokenizer: the fixed tokenizer: %s\n", ei.msg);
        abort();
    }
    return t;
}

/* libFuzzer's entry point: one input, any bytes; returns 0 (a bug aborts). One thread. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size && data[0] == 0xff) {
        char path[64];
        int fd;
        if (fuzz_as_file(data + 1, size - 1, path, sizeof path, &fd) != 0) return 0;
        ddp_tok_t *t = NULL;
        ddp_errinfo_t ei;
        if (ddp_tok_load(path, &t, &ei) == 0) {
            ddp_tok_enc_t *e;
            ddp_tok_ids_t ids = {0};
            if (ddp_tok_enc_new(t, &e) == 0) {
                ddp_tok_encode(e, "the quick <|x|> 123 \xc3\xa9", 21, &ids);
                ddp_tok_enc_free(e);
            }
            free(ids.ids);
        }
        ddp_tok_free(t);
        close(fd);
        return 0;
    }
    size_t bad = ddp_tok_utf8_check(data, size);
    if (bad > size || (bad < size && ddp_tok_utf8_check(data, bad) != bad)) abort();
    if (bad < size) return 0;
    ddp_tok_t *t = fixed();
    ddp_tok_enc_t *e;
    if (ddp_tok_enc_new(t, &e)) return 0;
    ddp_tok_ids_t ids = {0};
    if (ddp_tok_encode(e, (const char *)data, size, &ids) == 0) {
        char *back;
        size_t len;
        if (ddp_tok_decode(t, ids.ids, ids.len, &back, &len) != 0) abort();
        if (len != size || memcmp(back, data, size) != 0) abort(); /* the round trip */
        free(back);
    }
    free(ids.ids);
    ddp_tok_enc_free(e);
    return 0;
}
