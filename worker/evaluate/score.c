/* Scoring multiple-choice examples with the model (score.h): the harness's tokens of each
 * (context, continuation) pair, one forward per example, the three argmaxes, the deal over the
 * ranks. */
#include "worker/evaluate/score.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

int ddp_mc_argmax(const double *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* The id of the special token a template item {"SpecialToken": {"id": ...}} names, or -1. */
static int template_bos(json_t *proc, const ddp_tok_t *tok, long *bos, ddp_errinfo_t *ei)
{
    const char *type = json_string_value(json_object_get(proc, "type"));
    if (type && strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(proc, "processors");
        for (size_t i = 0; i < json_array_size(list) && *bos < 0; i++)
            DDP_CHECK(template_bos(json_array_get(list, i), tok, bos, ei));
        return 0;
    }
    if (!type || strcmp(type, "TemplateProcessing") != 0) return 0;
    json_t *first = json_array_get(json_object_get(proc, "single"), 0);
    const char *name =
        json_string_value(json_object_get(json_object_get(first, "SpecialToken"), "id"));
    if (!name) return 0; /* the template starts with the text: no BOS */
    uint32_t id;
    if (ddp_tok_find(tok, name, &id))
        return ddp_errinfo_set(ei, DDP_EFORMAT,
                               "tokenizer.json: post_processor's special token '%s' is not in "
                               "the vocabulary",
                               name);
    *bos = (long)id;
    return 0;
}

int ddp_mc_tokenizer_bos(const char *tokenizer_json, const ddp_tok_t *tok, long *bos,
                         ddp_errinfo_t *ei)
{
    *bos = -1;
    if (!tokenizer_json || !tok) return 0;
    json_t *root = json_loads(tokenizer_json, 0, NULL);
    if (!root) return ddp_errinfo_set(ei, DDP_EFORMAT, "tokenizer.json: not JSON");
    int rc = template_bos(json_object_get(root, "post_processor"), tok, bos, ei);
    json_decref(root);
    return rc;
}

size_t ddp_mc_scorer_bytes(int B, int T)
{
    return (size_t)B * T * (2 * sizeof(int32_t) + sizeof(float)) +
           (size_t)DDP_MC_MAX_CHOICES * ((size_t)(T + 1) * sizeof(uint32_t) + 2 * sizeof(int));
}

int ddp_mc_scorer_init(ddp_mc_scorer_t *s, ddp_model_t *m, const ddp_tok_t *tok, long bos, int T,
                       ddp_errinfo_t *ei)
{
    memset(s, 0, sizeof *s);
    if (T < 1 || T > m->acts.T)
        return ddp_errinfo_set(ei, DDP_EINVAL, "eval: %d tokens do not fit the model's %d", T,
                               m->acts.T);
    if (!tok && m->cfg.vocab_size != 256)
        return ddp_errinfo_set(ei, DDP_EINVAL,
                               "eval: a model of %d tokens needs a tokenizer (data.tokenizer, or "
                               "tokenizer.json in the model's directory); bytes are tokens only "
                               "for a vocabulary of 256",
                               m->cfg.vocab_size);
    s->model = m;
    s->tok = tok;
    s->bos = bos;
    s->T = T;
    size_t BT = (size_t)m->acts.B * T;
    s->in = ddp_malloc(BT * sizeof *s->in);
    s->tg = ddp_malloc(BT * sizeof *s->tg);
    s->losses = ddp_malloc(BT * sizeof *s->losses);
    s->toks = ddp_calloc(DDP_MC_MAX_CHOICES, sizeof *s->toks);
    s->len = ddp_calloc(DDP_MC_MAX_CHOICES, sizeof *s->len);
    s->n_cont = ddp_calloc(DDP_MC_MAX_CHOICES, sizeof *s->n_cont);
    int rc = (s->in && s->tg && s->losses && s->toks && s->len && s->n_cont) ? 0 : DDP_ENOMEM;
    for (int i = 0; rc == 0 && i < DDP_MC_MAX_CHOICES; i++)
        if (!(s->toks[i] = ddp_malloc((size_t)(T + 1) * sizeof(uint32_t)))) rc = DDP_ENOMEM;
    if (rc == 0 && tok) rc = ddp_tok_enc_new(tok, &s->enc);
    if (rc) ddp_mc_scorer_close(s);
    return rc;
}

void ddp_mc_scorer_close(ddp_mc_scorer_t *s)
{
    if (!s) return;
    ddp_tok_enc_free(s->enc);
    free(s->in);
    free(s->tg);
    free(s->losses);
    for (int i = 0; s->toks && i < DDP_MC_MAX_CHOICES; i++) free(s->toks[i]);
    free(s->toks);
    free(s->len);
    free(s->n_cont);
    memset(s, 0, sizeof *s);
}

/* enc(text[0, len)): BOS first when the scorer has one, then the tokenizer's ids or the bytes. */
static int encode(ddp_mc_scorer_t *s, const char *text, size_t len, ddp_tok_ids_t *out)
{
    out->len = 0;
    size_t need = len + 1;
    if (out->cap < need) {
        uint32_t *ids = ddp_realloc(out->ids, need * sizeof *ids);
        if (!ids) return DDP_ENOMEM;
        out->ids = ids;
        out->cap = need;
    }
    if (s->bos >= 0) out->ids[out->len++] = (uint32_t)s->bos;
    if (s->enc) return ddp_tok_encode(s->enc, text, len, out);
    for (size_t i = 0; i < len; i++) out->ids[out->len++] = (unsigned char)text[i];
    return 0;
}

int ddp_mc_tokenize(ddp_mc_scorer_t *s, const ddp_mc_example_t *ex, int i, const char *delim,
                    const char *path, ddp_errinfo_t *ei)
{
    const char *c = ex->context, *choice = ex->choices[i];
    size_t cl = strlen(c), dl = strlen(delim), chl = strlen(choice);
    size_t ctx_len = cl - ddp_mc_trailing_space(c, cl); /* the rest rides in the continuation */
    char *whole = ddp_malloc(cl + dl + chl + 1);
    if (!whole) return DDP_ENOMEM;
    memcpy(whole, c, cl);
    memcpy(whole + cl, delim, dl);
    memcpy(whole + cl + dl, choice, chl + 1);
    ddp_tok_ids_t ctx = {0}, all = {0};
    int rc = encode(s, c, ctx_len, &ctx);
    if (rc == 0) rc = encode(s, whole, cl + dl + chl, &all);
    free(whole);
    if (rc) goto out;
    if (ctx.len == 0) {
        rc = ddp_mc_row_error(ei, path, ex->line, "context: empty (and no BOS to stand for it)");
        goto out;
    }
    /* the harness takes the tail of enc(whole) past len(ctx) without checking it is a prefix */
    long n_cont = (long)all.len - (long)ctx.len;
    if (n_cont <= 0) {
        rc = ddp_mc_row_error(ei, path, ex->line, "choices[%d]: the continuation has no tokens", i);
        goto out;
    }
    if (n_cont > s->T) {
        rc = ddp_mc_row_error(ei, path, ex->line,
                       "context: nothing left after truncation to seq_len %d (choices[%d]'s "
                       "continuation alone is %ld tokens)",
                       s->T, i, n_cont);
        goto out;
    }
    size_t total = ctx.len + (size_t)n_cont,
           keep = total < (size_t)s->T + 1 ? total : (size_t)s->T + 1;
    size_t skip = total - keep; /* dropped from the left, all of them context */
    size_t k = 0;
    for (size_t j = skip; j < ctx.len; j++) s->toks[i][k++] = ctx.ids[j];
    for (size_t j = ctx.len; j < all.len; j++) s->toks[i][k++] = all.ids[j];
    s->len[i] = (int)keep;
    s->n_cont[i] = (int)n_cont;
out:
    free(ctx.ids);
    free(all.ids);
    return rc;
}

int ddp_mc_score(ddp_mc_scorer_t *s, const ddp_mc_example_t *ex, const char *delim,
                 const char *path, ddp_mc_scores_t *out, long *tokens, ddp_errinfo_t *ei)
{
    int n = ex->n_choices, B = s->model->acts.B;
    for (int i = 0; i < n; i++) DDP_CHECK(ddp_mc_tokenize(s, ex, i, delim, path, ei));
    for (int r0 = 0; r0 < n; r0 += B) {
        int rows = n - r0 < B ? n - r0 : B, L = 1;
        for (int r = 0; r < rows; r++)
            if (s->len[r0 + r] - 1 > L) L = s->len[r0 + r] - 1;
        for (int r = 0; r < rows; r++) {
            const uint32_t *t = s->toks[r0 + r];
            int len = s->len[r0 + r] - 1; /* inputs; the targets are one further */
            for (int j = 0; j < L; j++) {
                s->in[r * L + j] = j < len ? (int32_t)t[j] : 0; /* padding: after, unseen */
                s->tg[r * L + j] = j < len ? (int32_t)t[j + 1] : 0;
            }
        }
        int rc = ddp_model_losses(s->model, s->in, s->tg, rows, L, s->losses);
        if (rc) return ddp_errinfo_set(ei, rc, "eval: the forward failed: %s", ddp_strerror(rc));
        *tokens += (long)rows * L;
        for (int r = 0; r < rows; r++) {
            int i = r0 + r, len = s->len[i] - 1;
            double ll = 0;
            for (int j = len - s->n_cont[i]; j < len; j++) ll -= (double)s->losses[r * L + j];
            out->ll[i] = ll;
            out->n_tok[i] = s->n_cont[i];
        }
    }
    double norm[DDP_MC_MAX_CHOICES], per_tok[DDP_MC_MAX_CHOICES];
    for (int i = 0; i < n; i++) {
        norm[i] = out->ll[i] / (double)ddp_mc_codepoints(ex->choices[i]);
        per_tok[i] = out->ll[i] / (double)out->n_tok[i];
    }
    out->acc = ddp_mc_argmax(out->ll, n);
    out->acc_norm = ddp_mc_argmax(norm, n);
    out->acc_tok = ddp_mc_argmax(per_tok, n);
    return 0;
}

int ddp_mc_evaluate(ddp_mc_scorer_t *s, const ddp_mc_task_t *task, const char *path,
                    const ddp_world_t *w, ddp_mc_result_t *out, ddp_errinfo_t *ei)
{
    int rank = w ? w->rank : 0, size = w ? w->size : 1;
    memset(out, 0, sizeof *out);
    /* examples, acc, acc_norm, acc_tok (exact below 2^24), the forwards' tokens */
    float counts[5] = {0, 0, 0, 0, 0};
    int rc = 0;
    for (size_t e = (size_t)rank; rc == 0 && e < task->n; e += (size_t)size) {
        const ddp_mc_example_t *ex = &task->ex[e];
        ddp_mc_scores_t sc;
        rc = ddp_mc_score(s, ex, task->delim, path, &sc, &out->tokens, ei);
        if (rc) break;
        if (s->details) {
            fprintf(s->details, "{\"line\":%ld,\"label\":%d,\"ll\":[", ex->line, ex->label);
            for (int i = 0; i < ex->n_choices; i++)
                fprintf(s->details, "%s%.17g", i ? "," : "", sc.ll[i]);
            fprintf(s->details, "],\"n_tok\":[");
            for (int i = 0; i < ex->n_choices; i++)
                fprintf(s->details, "%s%d", i ? "," : "", sc.n_tok[i]);
            fprintf(s->details, "],\"acc\":%d,\"acc_norm\":%d,\"acc_tok\":%d}\n", sc.acc,
                    sc.acc_norm, sc.acc_tok);
        }
        counts[0] += 1;
        counts[1] += sc.acc == ex->label;
        counts[2] += sc.acc_norm == ex->label;
        counts[3] += sc.acc_tok == ex->label;
    }
    /* a rank whose scoring failed still joins the sum, so the others do not wait for it: the
     * failure travels as a count of -1 examples */
    if (rc) counts[0] = -1e9f;
    counts[4] = (float)out->tokens;
    if (w && w->size > 1) {
        int crc = ddp_world_allreduce(w, counts, 5, DDP_OP_SUM, ei);
        if (crc) return crc;
    }
    if (rc) return rc;
    if (counts[0] < 0)
        return ddp_errinfo_set(ei, DDP_EINVAL, "eval: another rank could not score its examples");
    out->n = (long)counts[0];
    out->acc = (long)counts[1];
    out->acc_norm = (long)counts[2];
    out->acc_tok = (long)counts[3];
    out->tokens = (long)counts[4];
    return 0;
}
