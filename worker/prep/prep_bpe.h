/* ddp-prep's BPE path: a file streamed through a tokenizer on all cores, ids handed on in order.
 *
 * A file is read in pieces and cut into chunks of about 256 KiB, each ending at a line start (a
 * '\n' followed by a printable ASCII character other than space). With GPT-2's, Llama 3's and
 * Qwen2's pre-tokenizer patterns no piece spans such a cut (a piece holding a line break ends
 * with it, or is all whitespace, and the next character is neither), so the ids of the chunks
 * put together equal those of the whole file, whatever the number of threads; the comparison
 * against `tokenizers` on a whole corpus checks it. The chunks of a batch are encoded in
 * parallel and handed to the sink in file order.
 */
#ifndef DDP_WORKER_PREP_PREP_BPE_H
#define DDP_WORKER_PREP_PREP_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "worker/data/tokenizer.h"

/* Receives the ids of one chunk, in file order: val = 0 for the training split, 1 for the
 * validation split. Returns 0 or a negative error (which stops the file). */
typedef int (*ddp__prep_sink_fn)(void *ctx, int val, const uint32_t *ids, size_t n);

typedef struct ddp__prep_bpe ddp__prep_bpe_t;

/* A pipeline of `threads` encoders over t (t outlives it); bos/eos: ids added before and after
 * each file, or UINT32_MAX for none. Returns 0 or DDP_ENOMEM. */
int ddp__prep_bpe_new(const ddp_tok_t *t, int threads, uint32_t bos, uint32_t eos,
                      ddp__prep_bpe_t **out);
void ddp__prep_bpe_free(ddp__prep_bpe_t *p); /* NULL-safe */

/* Tokenizes the file at path. Bytes from offset val_from on belong to the validation split:
 * the split begins at the first line start at or after it (SIZE_MAX: none of the file; 0: all
 * of it). Returns 0, or a negative error with a message printed to stderr naming the file
 * (invalid UTF-8: the file and the byte offset). *bytes gets the bytes read. */
int ddp__prep_bpe_file(ddp__prep_bpe_t *p, const char *path, size_t val_from,
                       ddp__prep_sink_fn sink, void *ctx, size_t *bytes);

#endif
