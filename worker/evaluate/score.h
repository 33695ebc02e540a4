/* Scoring multiple-choice tasks (task.h) with the model, as lm-evaluation-harness does for a
 * causal LM (its loglikelihood requests), and llm.c's per-token figure beside it.
 *
 * For each example and choice i (the harness's TemplateLM._encode_pair):
 *   context c, continuation " " + choice; trailing whitespace of c moves to the continuation;
 *   whole = enc(c + cont), ctx = enc(c), cont = whole[len(ctx):]  (enc adds BOS when the
 *   tokenizer's post-processor does: harness >= 0.4.9.2); the input is
 *   (ctx ++ cont)[-(T+1):][:-1] (left truncation to T = seq_len tokens), and
 *   ll_i = sum over cont's tokens of log p(token | what precedes it).
 * Scores, the first maximum winning ties (numpy's argmax):
 *   acc      argmax_i ll_i
 *   acc_norm argmax_i ll_i / code points of choice i (Python's len; the " " not counted)
 *   acc_tok  argmax_i ll_i / tokens of cont_i (llm.c's: the lowest mean loss per token)
 *
 * One example is one forward of its choices as rows padded to its longest, in groups of at
 * most the model's B rows: the shape depends on the example and the model only, so the scores
 * are the same at any world size. ddp_mc_evaluate deals the examples over the ranks and sums
 * the counts with one small all-reduce (sync/world.h). Neither the gradient arena nor any RNG
 * is touched; the activations are overwritten (as validation's are).
 *
 * Training thread only (it drives the model's kernels).
 */
#ifndef DDP_WORKER_EVALUATE_SCORE_H
#define DDP_WORKER_EVALUATE_SCORE_H

#include <stdint.h>
#include <stdio.h>

#include "common/err.h"
#include "worker/data/tokenizer.h"
#include "worker/evaluate/task.h"
#include "worker/model/model.h"
#include "worker/sync/world.h"

/* How text becomes tokens: a tokenizer, or bytes (a 256-token vocabulary only). */
typedef struct ddp_mc_scorer {
    ddp_model_t *model;   /* borrowed; its activations are for B x T */
    const ddp_tok_t *tok; /* borrowed; NULL: each byte is a token */
    long bos;             /* prepended to every encoding; -1: none */
    int T;                /* the longest input (train.seq_len) */
    ddp_tok_enc_t *enc;   /* the scorer's encoder of tok */
    int32_t *in, *tg;     /* [B*T] host rows of one forward */
    float *losses;        /* [B*T] their losses */
    uint32_t **toks;      /* [DDP_MC_MAX_CHOICES] each choice's input ++ targets (T+1) */
    int *len, *n_cont;    /* [DDP_MC_MAX_CHOICES] tokens in toks[i]; of them, the continuation's */
    FILE *details;        /* set by the caller: ddp_mc_evaluate writes a JSON line per example
                           * {"line","ll":[..],"n_tok":[..],"acc","acc_norm","acc_tok"} */
} ddp_mc_scorer_t;

/* One example's figures. */
typedef struct ddp_mc_scores {
    double ll[DDP_MC_MAX_CHOICES]; /* summed log-likelihood of each continuation */
    int n_tok[DDP_MC_MAX_CHOICES]; /* its tokens */
    int acc, acc_norm, acc_tok;    /* the choices picked */
} ddp_mc_scores_t;

/* A task's result: examples scored and how many each score got right, and the forwards' tokens
 * (padding included; summed as floats, so exact below 2^24), all summed over the ranks. */
typedef struct ddp_mc_result {
    long n, acc, acc_norm, acc_tok;
    long tokens;
} ddp_mc_result_t;

/* The BOS that tokenizer_json's post-processor puts first (a TemplateProcessing whose "single"
 * template starts with a special token, alone or in a Sequence: Llama 3's, TinyLlama's), looked
 * up in tok; -1 when it adds none (GPT-2's ByteLevel, Qwen2's) or tokenizer_json is NULL.
 * Returns 0, DDP_EFORMAT (not JSON, or a special token tok lacks; ei says which). */
int ddp_mc_tokenizer_bos(const char *tokenizer_json, const ddp_tok_t *tok, long *bos,
                         ddp_errinfo_t *ei);

/* Prepares s to score with model m (borrowed) at most T tokens long, tokenizer tok (NULL:
 * bytes) and bos (-1: none). Returns 0, DDP_EINVAL (T larger than the model's activations, or no
 * tokenizer for a vocabulary other than 256: ei says so), DDP_ENOMEM. */
int ddp_mc_scorer_init(ddp_mc_scorer_t *s, ddp_model_t *m, const ddp_tok_t *tok, long bos, int T,
                       ddp_errinfo_t *ei);
void ddp_mc_scorer_close(ddp_mc_scorer_t *s); /* NULL-safe */
/* Host bytes ddp_mc_scorer_init allocates for B x T (the memory budget's share). */
size_t ddp_mc_scorer_bytes(int B, int T);

/* The harness's tokens of (context, delim + choice) (delim: its target_delimiter, " " by
 * default): ctx ++ cont, truncated from the left to the last T + 1, into s->toks[i], s->len[i],
 * s->n_cont[i]. Returns 0, DDP_EFORMAT (an empty context, an empty continuation, or one longer
 * than T so that nothing of the context is left: ei names path, ex->line and the field),
 * DDP_ENOMEM, or the tokenizer's error. */
int ddp_mc_tokenize(ddp_mc_scorer_t *s, const ddp_mc_example_t *ex, int i, const char *delim,
                    const char *path, ddp_errinfo_t *ei);

/* Scores one example into *out; *tokens += the forward's tokens. Returns 0, a tokenizing error
 * (ddp_mc_tokenize's), or the model's (DDP_EABORTED when interrupted). */
int ddp_mc_score(ddp_mc_scorer_t *s, const ddp_mc_example_t *ex, const char *delim,
                 const char *path, ddp_mc_scores_t *out, long *tokens, ddp_errinfo_t *ei);

/* Scores task's examples r, r + W, ... on rank r of world w (NULL: a world of one) and sums the
 * counts over the ranks. Collective. Returns 0, a scoring error, or the communicator's (ei names
 * it). */
int ddp_mc_evaluate(ddp_mc_scorer_t *s, const ddp_mc_task_t *task, const char *path,
                    const ddp_world_t *w, ddp_mc_result_t *out, ddp_errinfo_t *ei);

/* The first maximum of x[0, n) (numpy's argmax). */
int ddp_mc_argmax(const double *x, int n);

#endif
