/* Text samples from the trained model (train.sample_tokens; see trainer.h), decoded through
 * data.tokenizer when the run has one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/alloc.h"
#include "worker/trainer.h"

#define SAMPLE_ROWS 64 /* the context's padding granularity (see ddp_trainer_sample) */

/* Token a sample starts from: data.tokenizer's BOS when it names one; else newline for
 * byte-level models, <|endoftext|> for GPT-2's BPE. */
static int32_t start_token(const ddp_model_cfg_t *cfg, const ddp_run_tokenizer_t *tok)
{
    if (tok && tok->ids.bos >= 0 && tok->ids.bos < cfg->vocab_size) return (int32_t)tok->ids.bos;
    return cfg->vocab_size == 256 ? '\n' : cfg->vocab_size - 1;
}

/* Writes token id as the sample shows it: its bytes through the tokenizer ("[id]" past its
 * vocabulary), else a byte (vocab 256), else the number. Byte-level BPE decodes each id to its
 * own bytes, so a text decoded token by token is the text decoded whole. */
static int put_token(const ddp_run_tokenizer_t *tok, int V, int32_t id, FILE *out)
{
    if (!tok) {
        if (V == 256) fputc(id, out);
        else fprintf(out, "%d ", id);
        return 0;
    }
    uint32_t u = (uint32_t)id;
    char *text = NULL;
    size_t len = 0;
    int rc = ddp_tok_decode(tok->tok, &u, 1, &text, &len);
    if (rc == DDP_EINVAL) {
        fprintf(out, "[%d]", id);
        return 0;
    }
    if (rc == 0) fwrite(text, 1, len, out);
    free(text);
    return rc;
}

/* Draws a token from the softmax of logits[V] with the trainer's rng. */
static int32_t draw(ddp_rng_t *rng, const float *logits, int V)
{
    float max = logits[0];
    for (int i = 1; i < V; i++) max = logits[i] > max ? logits[i] : max;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)(logits[i] - max));
    double u = ddp_rng_uniform(rng) * sum, c = 0;
    for (int i = 0; i < V; i++) {
        c += exp((double)(logits[i] - max));
        if (u < c) return i;
    }
    return V - 1;
}

int ddp_trainer_sample(ddp_trainer_t *t, int n, FILE *out)
{
    ddp_model_t *m = &t->model;
    int T = t->spec.seq_len, V = m->cfg.vocab_size;
    /* with a tokenizer, only the ids it decodes are drawn: a model's vocabulary may be larger
     * (SmolLM2's 49,152 over a tokenizer trained to 8,192), and the data never holds the rest */
    int drawable = V;
    if (t->data.tokenizer && (int)ddp_tok_vocab_size(t->data.tokenizer->tok) < V)
        drawable = (int)ddp_tok_vocab_size(t->data.tokenizer->tok);
    /* the context is padded (with token 0, ctx's zeros) to a multiple of SAMPLE_ROWS, or T:
     * T / SAMPLE_ROWS shapes per product in all, each seen again, instead of a new one per
     * token; the padding's rows are computed and ignored (ddp_model_next_logits) */
    int32_t *ctx = ddp_calloc((size_t)n + 1 + SAMPLE_ROWS, sizeof *ctx);
    float *row = ddp_malloc((size_t)V * sizeof *row);
    ddp_kprec_t prec = m->acts.prec;
    void *act_row = ddp_malloc((size_t)V * ddp_act_bytes(prec)); /* the logits as computed */
    int rc = (ctx && row && act_row) ? 0 : DDP_ENOMEM;
    if (rc == 0) ctx[0] = start_token(&m->cfg, t->data.tokenizer);
    for (int i = 1; rc == 0 && i <= n; i++) {
        int len = i < T ? i : T;
        int rows = (len + SAMPLE_ROWS - 1) / SAMPLE_ROWS * SAMPLE_ROWS;
        rc = ddp_model_next_logits(m, ctx + (i - len), 1, rows < T ? rows : T, len - 1);
        if (rc == 0)
            rc = ddp_k_memcpy_d2h(m->k, act_row, m->acts.logits, (size_t)V * ddp_act_bytes(prec));
        if (rc == 0) rc = ddp_k_sync(m->k);
        if (rc) break;
        ddp_act_to_f32(row, act_row, (size_t)V, prec);
        ctx[i] = draw(&t->pos.rng, row, drawable);
        rc = put_token(t->data.tokenizer, V, ctx[i], out);
    }
    fputc('\n', out);
    fflush(out);
    free(ctx);
    free(row);
    free(act_row);
    return rc;
}

