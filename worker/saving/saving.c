/* Checkpoints of a training run (see saving.h).
 *
 * Invariants:
 * - While `helper_running`, the helper thread owns the saver and reads the arenas; the training
 *   thread touches neither the saver nor the parameters/moments until ddp_saving_before_update
 *   has joined it (every path that could reach the saver joins first).
 * - A kernel context belongs to one thread (kernels.h): the saver's device copies go through
 *   `copy_k`, the trainer's context when the training thread saves and a context of the
 *   helper's own (its own stream, so the copy does not queue behind the next step's compute)
 *   while the helper saves; the training thread waits for its queued work before the helper
 *   starts, so the helper's stream reads the update's results.
 * - `pending` (striped writers only) is set and cleared at the same step on every rank: set when
 *   a save starts, cleared when the all-reduced votes say every writer reported, or in a
 *   blocking settle that every rank enters at the same point.
 */
#include "worker/saving/saving.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/file.h"
#include "common/log.h"
#include "proto/hf_config.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/saving/trainer_ext.h"
#include "worker/saving/mixture_json.h"

struct ddp_saving {
    ddp_saving_run_t run; /* the trainer's view, as of the last start/regroup */
    int have_found;
    ddp_ckpt_found_t found;
    ddp_ckpt_saver_t *saver; /* on writing ranks only */
    int writers;             /* min(checkpoint.writers, world) */
    int saver_rank;          /* the rank the saver was made for */
    ddp_ckpt_tensor_t *model_t, *optim_t;
    size_t n_model, n_optim;
    char *names;              /* storage of the optimizer tensor names */
    char *config;             /* config.json text, built once */
    char *genconf;            /* generation_config.json text, likewise */
    ddp_ckpt_text_t texts[3]; /* the further texts of every save: generation_config.json, and
                               * data.tokenizer's tokenizer.json and tokenizer_config.json */
    size_t n_texts;
    char *trainer; /* trainer.json of the save being snapshotted */
    ddp_ckpt_state_t state;
    pthread_t helper;
    int helper_running, helper_rc;
    long helper_step;
    double helper_ms;
    ddp_errinfo_t helper_ei;
    ddp_kernels_t *copy_k; /* the context of the saver's device copies (see the invariants) */
    int live;              /* a live save (CPU) may still read the arenas: freeze before updating */
    long last_saved;       /* step of the last save started; -1 */
    int pending, reported, report_rc;
    int commit_rc; /* first failed commit/save, for finish */
    /* the CRC32C the AdamW update of step crc_step computed of what it wrote (CPU backend; -1:
     * none valid), merged over the ranks after a ZeRO-1 update: a save of that step takes them
     * from here */
    ddp_adamw_crc_t *update_crc;
    long crc_step;
    ddp_saving_stats_t stats;
};

static double ms_since(int64_t t0) { return (double)(ddp_now_ns() - t0) / 1e6; }

/* Copy hooks for device arenas; on the CPU backend the arenas are host memory (NULL: memcpy,
 * which also keeps the helper thread away from the backend context). The saver's ctx is the
 * ddp_saving_t (its copy_k), a load's the trainer's context. */
static int copy_d2h(void *dst, const void *src, size_t n, void *ctx)
{
    ddp_kernels_t *k = ((struct ddp_saving *)ctx)->copy_k;
    int rc = ddp_k_memcpy_d2h(k, dst, src, n);
    return rc ? rc : ddp_k_sync(k);
}

static int copy_h2d(void *dst, const void *src, size_t n, void *ctx)
{
    ddp_kernels_t *k = ctx;
    int rc = ddp_k_memcpy_h2d(k, dst, src, n);
    return rc ? rc : ddp_k_sync(k);
}

/* Tensor lists over the arenas: model[n_tensors] and, when opt has moments, optim[2 n_tensors]
 * ("exp_avg.*" then "exp_avg_sq.*"). *names owns the optimizer names. */
static int build_lists(const ddp_saving_run_t *run, ddp_ckpt_tensor_t **model,
                       ddp_ckpt_tensor_t **optim, char **names)
{
    const ddp_model_t *m = run->model;
    const ddp_adamw_t *opt = run->opt;
    size_t n = (size_t)m->n_tensors;
    *model = ddp_calloc(n, sizeof **model);
    *optim = opt->m ? ddp_calloc(2 * n, sizeof **optim) : NULL;
    *names = opt->m ? ddp_malloc(2 * n * (DDP_MODEL_NAME_MAX + 16)) : NULL;
    if (!*model || (opt->m && (!*optim || !*names))) return DDP_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const ddp_param_desc_t *p = &m->params[i];
        ddp_ckpt_tensor_t d = {.name = p->name,
                               .dtype = DDP_ST_F32,
                               .ndim = p->ndim,
                               .shape = {p->shape[0], p->shape[1]},
                               .nbytes = p->numel * sizeof(float)};
        d.data = m->w + p->offset;
        (*model)[i] = d;
        if (!opt->m) continue;
        for (int mo = 0; mo < 2; mo++) {
            char *nm = *names + (mo * n + i) * (DDP_MODEL_NAME_MAX + 16);
            ddp_ckpt_optim_name(nm, DDP_MODEL_NAME_MAX + 16, mo ? "exp_avg_sq" : "exp_avg",
                                p->name);
            d.name = nm;
            d.data = (mo ? opt->v : opt->m) + p->offset;
            (*optim)[mo * n + i] = d;
        }
    }
    return 0;
}

static long global_sequences(const ddp_saving_run_t *run)
{
    return (long)run->n_micro * run->spec->micro_batch;
}

/* trainer.json for the trainer's position pos (ddp_malloc'd). */
static char *trainer_json(const ddp_saving_t *c, const ddp_position_t *pos)
{
    const ddp_saving_run_t *run = &c->run;
    const ddp_spec_t *sp = run->spec;
    long step = pos->step;
    char rng[4][24];
    for (int i = 0; i < 4; i++) snprintf(rng[i], sizeof rng[i], "0x%016" PRIx64, pos->rng.s[i]);
    char *spec_text = ddp_spec_to_json(sp);
    json_t *spec = spec_text ? json_loads(spec_text, 0, NULL) : NULL;
    free(spec_text);
    long G = global_sequences(run);
    json_t *o = json_pack(
        "{s:s, s:I, s:I, s:o, s:{s:I}, s:[s,s,s,s], "
        "s:{s:I, s:I, s:I}, s:i, s:i, s:I, s:f, s:I, s:f, s:o*, s:o*}",
        "format", "ddpd-trainer-1", "step", (json_int_t)step, "tokens", (json_int_t)pos->tokens,
        "schedule", ddp__trainer_ext_schedule(sp, pos), /* trainer_ext.h */
        "adamw", "t", (json_int_t)run->opt->t, "rng", rng[0], rng[1], rng[2], rng[3], "data",
        "cursor", (json_int_t)((int64_t)step * G), "global_batch_sequences", (json_int_t)G, "seed",
        (json_int_t)sp->seed, "world_size", run->world->size, "accum", run->accum,
        "global_batch_tokens", (json_int_t)G * sp->seq_len, "loss_scale", (double)pos->loss_scale,
        "loss_scale_clean", (json_int_t)pos->loss_scale_clean, "last_loss", (double)pos->last_loss,
        "spec", spec, "spikes", ddp__trainer_ext_spikes(sp, pos));
    if (!o) return NULL;
    ddp__mixture_save(o, sp, pos); /* a data mixture's cursors (mixture_json.h) */
    char *text = json_dumps(o, JSON_INDENT(2));
    json_decref(o);
    char *out = text ? ddp_strdup(text) : NULL;
    free(text);
    return out;
}

static json_t *load_json_file(const char *dir, const char *name, ddp_errinfo_t *ei, int *rc)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = NULL;
    *rc = ddp_file_read(path, (size_t)1 << 30, &text, NULL);
    if (*rc) {
        ddp_errinfo_set(ei, *rc, "cannot read %s: %s", path, ddp_strerror(*rc));
        return NULL;
    }
    json_error_t jerr;
    json_t *o = json_loads(text, 0, &jerr);
    free(text);
    if (!o || !json_is_object(o)) {
        json_decref(o);
        *rc = ddp_errinfo_set(ei, DDP_EFORMAT, "%s: not a JSON object (%s)", path, jerr.text);
    }
    return o;
}

static json_int_t get_int(json_t *o, const char *key, json_int_t dflt)
{
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? json_integer_value(v) : dflt;
}

int ddp_saving_prepare(const ddp_spec_t *spec, const ddp_world_t *world, int no_resume,
                       long resume_step, ddp_saving_t **out, long *global_batch_tokens,
                       ddp_errinfo_t *ei)
{
    *out = NULL;
    *global_batch_tokens = 0;
    if (!spec->ckpt_dir[0]) return 0;
    struct ddp_saving *c = ddp_calloc(1, sizeof *c);
    if (!c) return DDP_ENOMEM;
    *out = c;
    c->last_saved = -1;
    if (no_resume) {
        if (world->rank == 0) DDP_INFO("checkpoint: not resuming (--no-resume)");
        return 0;
    }
    ddp_errinfo_t fei;
    ddp_errinfo_clear(&fei);
    int named = resume_step > 0;
    int rc = ddp_ckpt_find(spec->ckpt_dir, named ? resume_step : -1, &c->found, &fei);
    if (rc && !named && (rc == DDP_ENOTFOUND || rc == -ENOENT)) {
        if (world->rank == 0)
            DDP_INFO("checkpoint: nothing to resume under %s (%s); starting at step 0",
                     spec->ckpt_dir, fei.msg[0] ? fei.msg : ddp_strerror(rc));
        return 0;
    }
    if (rc) {
        if (ei) *ei = fei;
        if (ei && !ei->msg[0])
            ddp_errinfo_set(ei, rc, "checkpoint: cannot resume from %s: %s", spec->ckpt_dir,
                            ddp_strerror(rc));
        return rc;
    }
    c->have_found = 1;
    json_t *tj = load_json_file(c->found.path, "trainer.json", ei, &rc);
    if (!tj) return rc;
    json_int_t gbt = get_int(tj, "global_batch_tokens", 0);
    if (spec->global_batch_tokens == 0 && gbt > 0) {
        *global_batch_tokens = (long)gbt;
        if (world->rank == 0 && get_int(tj, "world_size", 0) != world->size)
            DDP_INFO("checkpoint: keeping the checkpoint's global batch of %lld tokens "
                     "(saved by %lld rank(s), now %d)",
                     (long long)gbt, (long long)get_int(tj, "world_size", 0), world->size);
    }
    json_decref(tj);
    return 0;
}

/* Checks the checkpoint's config.json against the model this run builds. */
static int check_config(const ddp_saving_t *c, const ddp_model_cfg_t *m, ddp_errinfo_t *ei)
{
    ddp_model_cfg_t saved;
    char what[160];
    DDP_CHECK(ddp_hf_config_read(c->found.path, &saved, ei));
    if (ddp_hf_config_diff(&saved, m, what, sizeof what))
        return ddp_errinfo_set(ei, DDP_ESPEC,
                               "checkpoint %s/config.json is another model than "
                               "this run's (%s: the checkpoint's first): resume with the same "
                               "model, or --no-resume",
                               c->found.path, what);
    return 0;
}

/* Reads the position and AdamW's t from trainer.json text into *pos and run->opt. */
static int read_position(const ddp_saving_t *c, const ddp_saving_run_t *run, const char *text,
                         ddp_position_t *pos, ddp_errinfo_t *ei)
{
    const char *path = c->found.path;
    json_error_t jerr;
    json_t *o = json_loads(text ? text : "", 0, &jerr);
    json_t *rng = o ? json_object_get(o, "rng") : NULL;
    json_t *adamw = o ? json_object_get(o, "adamw") : NULL;
    int rc = 0;
    if (!o || !json_is_array(rng) || json_array_size(rng) != 4 || !adamw ||
        get_int(o, "step", -1) < 0 || get_int(adamw, "t", -1) < 0) {
        rc =
            ddp_errinfo_set(ei, DDP_EFORMAT, "%s/trainer.json: missing step, adamw.t or rng", path);
        goto out;
    }
    for (int i = 0; i < 4; i++) {
        const char *s = json_string_value(json_array_get(rng, (size_t)i));
        char *end = NULL;
        errno = 0;
        unsigned long long v = s ? strtoull(s, &end, 16) : 0;
        if (!s || errno || end == s || *end) {
            rc = ddp_errinfo_set(ei, DDP_EFORMAT, "%s/trainer.json: rng[%d] is not a hex word",
                                 path, i);
            goto out;
        }
        pos->rng.s[i] = (uint64_t)v;
    }
    pos->step = (long)get_int(o, "step", 0);
    pos->tokens = (uint64_t)get_int(o, "tokens", 0);
    run->opt->t = (long)get_int(adamw, "t", 0);
    /* fp16's scale goes on (optim/loss_scale.h's init decides: a checkpoint of another
     * precision has 1, an old one none) */
    pos->loss_scale = (float)json_number_value(json_object_get(o, "loss_scale"));
    pos->loss_scale_clean = (long)get_int(o, "loss_scale_clean", 0);
    /* the last step's loss: what a run that resumes with nothing left to train reports */
    json_t *ll = json_object_get(o, "last_loss");
    pos->last_loss = json_is_number(ll) ? (float)json_number_value(ll) : NAN;
    /* the schedule's resume rule and spike skipping's windows (trainer_ext.h) */
    rc = ddp__trainer_ext_read(run->spec, o, path, run->world->rank == 0, pos, ei);
    if (rc) goto out;
    json_t *data = json_object_get(o, "data");
    long G = global_sequences(run);
    json_int_t saved_G = get_int(data, "global_batch_sequences", G);
    if (saved_G != G)
        DDP_WARN("checkpoint %s: the global batch changed from %lld to %ld sequences; the data "
                 "continues at sample %lld, not at the saved cursor %lld",
                 path, (long long)saved_G, G, (long long)pos->step * G,
                 (long long)get_int(data, "cursor", 0));
    rc = ddp__mixture_read(run->spec, data, G, path, run->world->rank, pos, ei);
    if (rc) goto out;
    if (run->world->rank == 0)
        DDP_INFO("resumed from %s: step %ld, %llu tokens, AdamW t %ld, data cursor %lld "
                 "(saved by %lld rank(s) x %lld micro-step(s); now %d x %d)",
                 path, pos->step, (unsigned long long)pos->tokens, run->opt->t,
                 (long long)get_int(data, "cursor", 0), (long long)get_int(o, "world_size", 0),
                 (long long)get_int(o, "accum", 0), run->world->size, run->accum);
out:
    json_decref(o);
    return rc;
}

/* The saver of a writing rank (ranks < min(checkpoint.writers, world)); a rank that keeps its
 * place keeps its saver across generations. */
static int open_saver(ddp_saving_t *c, ddp_errinfo_t *ei)
{
    int writers =
        c->run.spec->writers < c->run.world->size ? c->run.spec->writers : c->run.world->size;
    if (writers < 1) writers = 1;
    if (c->saver && c->saver_rank == c->run.world->rank && c->writers == writers) return 0;
    ddp_ckpt_saver_free(c->saver);
    c->saver = NULL;
    c->writers = writers;
    c->saver_rank = c->run.world->rank;
    if (c->run.world->rank >= c->writers) return 0;
    const ddp_spec_t *sp = c->run.spec;
    ddp_ckpt_opts_t o = {.dir = sp->ckpt_dir,
                         .shard_mb = sp->shard_mb,
                         .keep_last = sp->keep_last,
                         .writers = c->writers,
                         .rank = c->run.world->rank,
                         .copy = ddp_k_host_memory(c->run.k) ? NULL : copy_d2h,
                         .copy_ctx = c};
    DDP_CHECK(ddp_ckpt_saver_new(&o, &c->saver, ei));
    return ddp_ckpt_saver_reserve(
        c->saver, c->run.model->n_params * sizeof(float) * (c->optim_t ? 3 : 1), ei);
}

int ddp_saving_start(ddp_saving_t *c, const ddp_saving_run_t *run, ddp_position_t *pos,
                     int *resumed, ddp_errinfo_t *ei)
{
    const ddp_spec_t *sp = run->spec;
    *resumed = 0;
    if (!c && !sp->init_from[0]) return 0;
    ddp_ckpt_tensor_t *model = NULL, *optim = NULL;
    char *names = NULL;
    int rc = build_lists(run, &model, &optim, &names);
    size_t n = (size_t)run->model->n_tensors;
    ddp_ckpt_copy_fn h2d = ddp_k_host_memory(run->k) ? NULL : copy_h2d;
    if (rc == 0 && c && c->have_found) {
        int64_t t0 = ddp_now_ns();
        rc = check_config(c, &sp->model, ei);
        ddp_ckpt_load_t req = {.model = model,
                               .n_model = n,
                               .optim = optim,
                               .n_optim = optim ? 2 * n : 0,
                               .copy = h2d,
                               .copy_ctx = run->k};
        if (rc == 0) rc = ddp_ckpt_load(c->found.path, &req, ei);
        if (rc == 0) rc = read_position(c, run, req.trainer_json, pos, ei);
        if (rc == 0 && run->world->rank == 0)
            DDP_INFO("checkpoint: loaded %s in %.0f ms", c->found.path, ms_since(t0));
        free(req.config_json);
        free(req.trainer_json);
        if (rc == 0) *resumed = 1;
    } else if (rc == 0 && sp->init_from[0]) {
        rc = ddp_ckpt_init_from(sp->init_from, model, n, h2d, run->k, ei);
        if (rc == 0 && run->world->rank == 0)
            DDP_INFO("model weights from %s (model.init_from)", sp->init_from);
    }
    if (rc || !c) {
        free(model);
        free(optim);
        free(names);
        return rc;
    }
    c->run = *run;
    c->copy_k = run->k;
    c->model_t = model;
    c->optim_t = optim;
    c->n_model = n;
    c->n_optim = optim ? 2 * n : 0;
    c->names = names;
    c->config = ddp_hf_config_json_ids(&sp->model, run->ids);
    c->genconf = ddp_hf_generation_config_json(&sp->model, run->ids);
    if (!c->config || !c->genconf) return DDP_ENOMEM;
    c->texts[c->n_texts++] = (ddp_ckpt_text_t){"generation_config.json", c->genconf};
    if (run->tokenizer_json)
        c->texts[c->n_texts++] = (ddp_ckpt_text_t){"tokenizer.json", run->tokenizer_json};
    if (run->tokenizer_config_json)
        c->texts[c->n_texts++] =
            (ddp_ckpt_text_t){"tokenizer_config.json", run->tokenizer_config_json};
    c->crc_step = -1; /* every rank: a ZeRO-1 update's CRCs are merged over all of them */
    if (ddp_k_host_memory(run->k) && !(c->update_crc = ddp_calloc(n, sizeof *c->update_crc)))
        return DDP_ENOMEM;
    return open_saver(c, ei);
}

/* The helper thread: one save, its device copies on a kernel context of its own (opened and
 * closed here, once per save: a stream and a library handle, small beside a snapshot). */
static void *helper_main(void *arg)
{
    struct ddp_saving *c = arg;
    int64_t t0 = ddp_now_ns();
    ddp_errinfo_clear(&c->helper_ei);
    ddp_kernels_t own;
    int rc = ddp_kernels_open(&own, ddp_k_name(c->run.k), c->run.device, 1);
    if (rc) {
        c->helper_rc = ddp_errinfo_set(&c->helper_ei, rc,
                                       "checkpoint: the helper's %s context on device %d: %s",
                                       ddp_k_name(c->run.k), c->run.device, ddp_strerror(rc));
    } else {
        c->copy_k = &own;
        c->helper_rc = ddp_ckpt_save(c->saver, &c->state, &c->helper_ei);
        c->copy_k = c->run.k;
        ddp_kernels_close(&own);
    }
    c->helper_ms = ms_since(t0);
    return NULL;
}

/* Joins the helper; returns its result (logged here). */
static int join_helper(ddp_saving_t *c, double *waited_ms)
{
    *waited_ms = 0;
    if (!c || !c->helper_running) return 0;
    int64_t t0 = ddp_now_ns();
    pthread_join(c->helper, NULL);
    c->helper_running = 0;
    *waited_ms = ms_since(t0);
    c->stats.last_snapshot_ms = c->helper_ms;
    if (c->helper_rc) {
        char msg[1024];
        DDP_ERROR("checkpoint step %ld: snapshot failed, the save is dropped: %s", c->helper_step,
                  ddp_errinfo_str(&c->helper_ei, msg, sizeof msg));
        if (!c->commit_rc) c->commit_rc = c->helper_rc;
        if (c->pending && !c->reported) {
            c->reported = 1;
            c->report_rc = c->helper_rc;
        }
    }
    return c->helper_rc;
}

int ddp_saving_regroup(ddp_saving_t *c, const ddp_saving_run_t *run, ddp_errinfo_t *ei)
{
    if (!c || !c->model_t) return 0;
    c->run = *run;
    c->copy_k = run->k;
    double waited;
    join_helper(c, &waited);
    if (c->saver) {
        /* a save in flight completes from what this rank holds (its step's state: the failed
         * step changed nothing), before a state broadcast may overwrite the arenas */
        ddp_errinfo_t wei;
        ddp_errinfo_clear(&wei);
        char msg[1024];
        if (ddp_ckpt_wait(c->saver, &wei) != 0)
            DDP_ERROR("checkpoint step %ld: %s", c->last_saved,
                      ddp_errinfo_str(&wei, msg, sizeof msg));
        c->live = 0;
    }
    c->pending = 0; /* a striped save of the old generation is abandoned: the next one redoes it */
    return open_saver(c, ei);
}

/* The CRC array of the update that completes step `next` (ddp_saving_before_update), or NULL. */
static ddp_adamw_crc_t *update_crcs(ddp_saving_t *c, long next)
{
    if (!c || !c->update_crc || !ddp_saving_planned(c, next)) return NULL;
    /* a rank that writes nothing computes them only for the merge of a ZeRO-1 update */
    if (!c->saver && !(c->run.zero1 && c->run.world->size > 1)) return NULL;
    c->crc_step = -1; /* until ddp_saving_after_update */
    return c->update_crc;
}

/* The parameters are about to change: the snapshot of a save still being taken is completed. */
static int join_snapshot(ddp_saving_t *c, long next, ddp_errinfo_t *ei)
{
    if (c && c->live) {
        /* the writer has been reading the arenas beside this step's forward and backward;
         * what it has not read yet is copied now, before the update changes it */
        int64_t t0 = ddp_now_ns();
        uint64_t copied = 0;
        ddp_ckpt_freeze(c->saver, &copied, ei);
        c->live = 0;
        double waited = ms_since(t0);
        c->stats.wait_ms += waited;
        c->stats.last_wait_ms = waited;
        c->stats.last_snapshot_ms = waited;
        if (c->run.world->rank == 0)
            DDP_INFO("checkpoint step %ld: the writer read the arenas beside step %ld; the "
                     "update waited %.1f ms for it (%.1f MB left to copy)",
                     c->last_saved, next, waited, (double)copied / 1e6);
        return 0;
    }
    if (!c || !c->helper_running) return 0;
    double waited = 0;
    join_helper(c, &waited);
    c->stats.wait_ms += waited;
    c->stats.last_wait_ms = waited;
    if (c->run.world->rank == 0)
        DDP_INFO("checkpoint step %ld: snapshot copied in %.1f ms beside step %ld; the update "
                 "waited %.1f ms for it",
                 c->helper_step, c->helper_ms, next, waited);
    return 0;
}

int ddp_saving_before_update(ddp_saving_t *c, long next, ddp_saving_update_t *u, ddp_errinfo_t *ei)
{
    int rc = join_snapshot(c, next, ei);
    u->save_follows = ddp_saving_planned(c, next);
    u->crc = update_crcs(c, next);
    return rc;
}

/* Waits for this rank's striped checkpoint shards and records (and logs) how writing them went. */
static void collect_report(struct ddp_saving *c)
{
    ddp_errinfo_t wei;
    ddp_errinfo_clear(&wei);
    c->report_rc = ddp_ckpt_wait(c->saver, &wei);
    c->reported = 1;
    if (c->report_rc) {
        char msg[1024];
        DDP_ERROR("checkpoint step %ld: writing this rank's shards failed: %s", c->last_saved,
                  ddp_errinfo_str(&wei, msg, sizeof msg));
    }
}

void ddp_saving_vote(ddp_saving_t *c, float vals[2])
{
    vals[0] = vals[1] = 0;
    if (!c || !c->pending || !c->saver) return;
    if (!c->reported && !c->helper_running && !ddp_ckpt_busy(c->saver)) {
        collect_report(c);
    }
    vals[0] = c->reported ? 1.0f : 0.0f;
    vals[1] = c->reported && c->report_rc ? 1.0f : 0.0f;
}

int ddp_saving_tally(ddp_saving_t *c, const float sums[2], ddp_errinfo_t *ei)
{
    if (!c || !c->pending || sums[0] < (float)c->writers - 0.5f) return 0;
    c->pending = 0;
    if (sums[1] > 0) {
        if (c->run.world->rank == 0)
            DDP_WARN("checkpoint step %ld: %.0f writer(s) failed; it is not committed",
                     c->last_saved, (double)sums[1]);
        if (!c->commit_rc) c->commit_rc = DDP_EIO;
        return 0;
    }
    if (c->run.world->rank != 0) return 0;
    int rc = ddp_ckpt_commit(c->saver, ei);
    if (rc) {
        char msg[1024];
        DDP_ERROR("checkpoint step %ld: commit failed: %s", c->last_saved,
                  ddp_errinfo_str(ei, msg, sizeof msg));
        if (!c->commit_rc) c->commit_rc = rc;
    }
    return 0;
}

/* Blocks until the pending striped save is settled on every rank (all ranks call it at the
 * same point). */
static int settle_blocking(ddp_saving_t *c, long step, ddp_errinfo_t *ei)
{
    if (!c->pending) return 0;
    int64_t t0 = ddp_now_ns();
    double waited;
    join_helper(c, &waited);
    if (c->saver && !c->reported) {
        if (ddp_ckpt_busy(c->saver))
            DDP_INFO("checkpoint step %ld is still being written; step %ld waits for it",
                     c->last_saved, step);
        collect_report(c);
    }
    float vals[2];
    ddp_saving_vote(c, vals);
    DDP_CHECK(ddp_world_allreduce(c->run.world, vals, 2, DDP_OP_SUM, ei));
    int rc = ddp_saving_tally(c, vals, ei);
    c->stats.settle_ms += ms_since(t0);
    return rc;
}

/* After a ZeRO-1 update each rank has the CRCs of its own parts (zeros elsewhere): every rank's
 * values go into its own slots of one table, which is summed over the ranks (each slot has one
 * non-zero contributor and holds 16 bits, so the float sum is exact), and are merged. */
static int merge_rank_crcs(ddp_saving_t *c, ddp_errinfo_t *ei)
{
    enum { PER = 8 }; /* 3 CRCs and `owned` as two 16-bit halves each */
    size_t n = c->n_model, world = (size_t)c->run.world->size;
    float *v = ddp_calloc(world * n * PER, sizeof *v);
    if (!v) return ddp_errinfo_set(ei, DDP_ENOMEM, "checkpoint: out of memory");
    for (size_t i = 0; i < n; i++) {
        const ddp_adamw_crc_t *u = &c->update_crc[i];
        uint32_t w[4] = {u->crc[0], u->crc[1], u->crc[2],
                         u->owned < UINT32_MAX ? (uint32_t)u->owned : UINT32_MAX};
        float *slot = v + ((size_t)c->run.world->rank * n + i) * PER;
        for (int k = 0; k < 4; k++) {
            slot[2 * k] = (float)(w[k] & 0xffff);
            slot[2 * k + 1] = (float)(w[k] >> 16);
        }
    }
    int rc = ddp_world_allreduce(c->run.world, v, world * n * PER, DDP_OP_SUM, ei);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        for (size_t r = 0; r < world; r++) {
            const float *slot = v + (r * n + i) * PER;
            uint32_t w[4];
            for (int k = 0; k < 4; k++)
                w[k] = (uint32_t)slot[2 * k] | (uint32_t)slot[2 * k + 1] << 16;
            ddp_adamw_crc_t x = {
                {w[0], w[1], w[2]}, w[3] == UINT32_MAX ? DDP_ADAMW_CRC_BROKEN : w[3], 0};
            if (r == 0)
                c->update_crc[i] = x;
            else
                ddp_adamw_crc_merge(&c->update_crc[i], &x, c->run.model->params[i].numel);
        }
    }
    free(v);
    return rc;
}

int ddp_saving_after_update(ddp_saving_t *c, long next, const ddp_saving_update_t *u,
                            ddp_errinfo_t *ei)
{
    if (!c || !u->crc) return 0;
    if (c->run.zero1 && c->run.world->size > 1) DDP_CHECK(merge_rank_crcs(c, ei));
    c->crc_step = next;
    return 0;
}

/* Gives the save's tensors the CRC32C that this step's update computed, where it computed them
 * whole (not after a skipped update, nor for a tensor whose pieces came out of order). */
static void take_update_crcs(ddp_saving_t *c, long step)
{
    int valid = c->update_crc && c->crc_step == step;
    for (size_t i = 0; i < c->n_model; i++) {
        const ddp_adamw_crc_t *u = valid ? &c->update_crc[i] : NULL;
        bool whole = u && u->owned == c->run.model->params[i].numel;
        ddp_ckpt_tensor_t *d[3] = {&c->model_t[i], c->optim_t ? &c->optim_t[i] : NULL,
                                   c->optim_t ? &c->optim_t[c->n_model + i] : NULL};
        for (int a = 0; a < 3; a++) {
            if (!d[a]) continue;
            d[a]->crc_known = whole;
            d[a]->crc32c = whole ? u->crc[a] : 0;
        }
    }
}

/* c->state: the step of pos, the arenas' tensors and pos's trainer.json (c->trainer, made
 * again). Returns 0 or DDP_ENOMEM. */
static int set_state(ddp_saving_t *c, const ddp_position_t *pos, ddp_errinfo_t *ei)
{
    free(c->trainer);
    c->trainer = trainer_json(c, pos);
    if (!c->trainer) return ddp_errinfo_set(ei, DDP_ENOMEM, "checkpoint: out of memory");
    c->state = (ddp_ckpt_state_t){.step = pos->step,
                                  .model = c->model_t,
                                  .n_model = c->n_model,
                                  .optim = c->optim_t,
                                  .n_optim = c->n_optim,
                                  .config_json = c->config,
                                  .trainer_json = c->trainer,
                                  .texts = c->texts,
                                  .n_texts = c->n_texts};
    return 0;
}

/* Starts the save of the current step: on the helper thread (overlap) or here. */
static int start_save(ddp_saving_t *c, const ddp_position_t *pos, int overlap, ddp_errinfo_t *ei)
{
    long step = pos->step;
    int64_t t0 = ddp_now_ns();
    double waited;
    join_helper(c, &waited);
    if (c->writers > 1) DDP_CHECK(settle_blocking(c, step, ei));
    if (c->run.gather_moments) /* a ZeRO-1 step leaves the moments in slices */
        DDP_CHECK(c->run.gather_moments(c->run.gather_arg, ei));
    take_update_crcs(c, step);
    DDP_CHECK(set_state(c, pos, ei));
    c->last_saved = step;
    c->stats.saves++;
    if (c->writers > 1) {
        c->pending = 1;
        c->reported = 0;
        c->report_rc = 0;
    }
    int rc = 0;
    if (c->saver) {
        c->helper_step = step;
        if (ddp_k_host_memory(c->run.k)) {
            /* the arenas are host memory and change only in the update: the writer reads them
             * itself until ddp_saving_before_update freezes them (no copy at the boundary) */
            rc = ddp_ckpt_save_live(c->saver, &c->state, ei);
            c->live = rc == 0;
            if (rc && c->pending && !c->reported) {
                c->reported = 1;
                c->report_rc = rc;
            }
        } else if (overlap && (rc = ddp_k_sync(c->run.k)) == 0 &&
                   pthread_create(&c->helper, NULL, helper_main, c) == 0) {
            c->helper_running = 1; /* the sync: the update is complete for the helper's stream */
        } else {
            int64_t t1 = ddp_now_ns();
            rc = ddp_ckpt_save(c->saver, &c->state, ei);
            c->stats.last_snapshot_ms = ms_since(t1);
            if (rc && c->pending && !c->reported) {
                c->reported = 1;
                c->report_rc = rc;
            }
        }
    }
    c->stats.boundary_ms += ms_since(t0);
    return rc;
}

/* The newest step-N of dir whose MANIFEST.json exists (it is written last), or -1. */
static long newest_saved(const char *dir)
{
    long newest = -1, step;
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[1200];
    while (d && (e = readdir(d)) != NULL) {
        if (sscanf(e->d_name, "step-%ld", &step) != 1 || step <= newest) continue;
        snprintf(path, sizeof path, "%s/%.100s/MANIFEST.json", dir, e->d_name);
        if (access(path, F_OK) == 0) newest = step;
    }
    if (d) closedir(d);
    return newest;
}

int ddp_saving_emergency_save(ddp_saving_t *c, const ddp_position_t *pos, int moments_whole,
                              ddp_errinfo_t *ei)
{
    long step = pos->step;
    if (!c || !c->model_t || step == 0) return 0;
    const ddp_spec_t *sp = c->run.spec;
    if (c->run.zero1 && !moments_whole)
        return ddp_errinfo_set(ei, DDP_ENOTSUP,
                               "checkpoint: step %ld is not saved: the optimizer state is sharded "
                               "over the ranks (ddp.shard_optimizer) and no survivor can read all "
                               "of it (ranks on other hosts, or an update cut short)",
                               step);
    int64_t t0 = ddp_now_ns();
    double waited;
    join_helper(c, &waited);
    if (c->saver) { /* this rank's own save in flight completes first */
        ddp_errinfo_t wei;
        ddp_errinfo_clear(&wei);
        ddp_ckpt_wait(c->saver, &wei);
        c->live = 0;
    }
    char path[1200];
    if (mkdir(sp->ckpt_dir, 0755) != 0 && errno != EEXIST)
        return ddp_errinfo_set(ei, -errno, "checkpoint: cannot create %s", sp->ckpt_dir);
    /* the survivors take turns; each writes only a step newer than every one saved (they can
     * differ by one: a failure that struck while the step's commit completed on some ranks) */
    snprintf(path, sizeof path, "%s/.emergency.lock", sp->ckpt_dir);
    int fd = open(path, O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (fd < 0) return ddp_errinfo_set(ei, -errno, "checkpoint: cannot open %s", path);
    if (flock(fd, LOCK_EX) != 0) {
        close(fd);
        return ddp_errinfo_set(ei, -errno, "checkpoint: cannot lock %s", path);
    }
    int rc = 0;
    ddp_ckpt_saver_t *sv = NULL;
    long newest = newest_saved(sp->ckpt_dir);
    if (newest >= step) {
        DDP_INFO("checkpoint: step %ld is saved already (the newest is %ld)", step, newest);
        goto out;
    }
    int host = ddp_k_host_memory(c->run.k);
    ddp_ckpt_opts_t o = {.dir = sp->ckpt_dir,
                         .shard_mb = sp->shard_mb,
                         .keep_last = sp->keep_last,
                         .writers = 1,
                         .rank = 0,
                         .copy = host ? NULL : copy_d2h,
                         .copy_ctx = c};
    DDP_CHECK_GOTO(ddp_ckpt_saver_new(&o, &sv, ei), rc, out);
    DDP_CHECK_GOTO(set_state(c, pos, ei), rc, out);
    if (host) { /* the writer reads the arenas themselves: nothing changes them now */
        rc = ddp_ckpt_save_live(sv, &c->state, ei);
    } else {
        rc = ddp_ckpt_saver_reserve(
            sv, c->run.model->n_params * sizeof(float) * (c->optim_t ? 3 : 1), ei);
        if (rc == 0) rc = ddp_ckpt_save(sv, &c->state, ei);
    }
    if (rc == 0) rc = ddp_ckpt_wait(sv, ei);
    if (rc == 0)
        DDP_WARN("checkpoint: step %ld saved from this survivor's memory in %.0f ms", step,
                 ms_since(t0));
out:
    ddp_ckpt_saver_free(sv);
    close(fd); /* releases the lock */
    return rc;
}

/* Whether the snapshot copy may run beside the next step: only when this host has a core the
 * compute threads leave idle. With every core busy (the default: threads = cores / local
 * ranks) a third thread only time-slices with them: measured on 2 cores with GPT-2 124M, the
 * 1.5 GB copy then took 3.4 s beside training against 0.3 s on its own, so copying at the
 * boundary is the smaller stall there. */
static int spare_core(const ddp_saving_t *c)
{
    long ranks = c->run.local_world > 0 ? c->run.local_world : 1;
    long cores = sysconf(_SC_NPROCESSORS_ONLN), threads = c->run.spec->threads;
    return threads > 0 && threads * ranks < cores;
}

int ddp_saving_planned(const ddp_saving_t *c, long step)
{
    if (!c || !c->run.spec) return 0;
    const ddp_spec_t *s = c->run.spec;
    return (s->ckpt_every > 0 && step % s->ckpt_every == 0) || step >= s->steps ||
           (c->run.stop_at_step > 0 && step >= c->run.stop_at_step);
}

int ddp_saving_after_step(ddp_saving_t *c, const ddp_position_t *pos, int any_stop,
                          ddp_errinfo_t *ei)
{
    if (!c) return 0;
    const ddp_spec_t *s = c->run.spec;
    long step = pos->step;
    if (s->ckpt_every <= 0 || step % s->ckpt_every != 0) return 0;
    if (step >= s->steps || any_stop || (c->run.stop_at_step > 0 && step >= c->run.stop_at_step))
        return 0; /* the last step: ddp_saving_finish saves it */
    int rc = start_save(c, pos, spare_core(c), ei);
    if (rc) {
        /* a save that cannot start does not stop training */
        char msg[1024];
        DDP_ERROR("checkpoint step %ld: %s", step, ddp_errinfo_str(ei, msg, sizeof msg));
        if (!c->commit_rc) c->commit_rc = rc;
        if (ei) ddp_errinfo_clear(ei);
    }
    return 0;
}

int ddp_saving_finish(ddp_saving_t *c, const ddp_position_t *pos, int any_stop, ddp_errinfo_t *ei)
{
    if (!c || !c->model_t) return 0;
    long step = pos->step;
    double waited;
    join_helper(c, &waited);
    int rc = 0;
    if (c->last_saved != step) {
        if (any_stop && c->run.world->rank == 0)
            DDP_INFO("stopping: saving a checkpoint of step %ld", step);
        rc = start_save(c, pos, 0, ei);
    }
    if (rc == 0 && c->writers > 1) rc = settle_blocking(c, step, ei);
    if (rc == 0 && c->writers == 1 && c->saver) rc = ddp_ckpt_wait(c->saver, ei);
    if (rc == 0 && c->commit_rc && c->last_saved == step && c->writers > 1) {
        rc = c->commit_rc;
        if (ei && !ei->msg[0])
            ddp_errinfo_set(ei, rc, "checkpoint step %ld was not committed", step);
    }
    if (c->run.world->rank == 0 && c->stats.saves > 0)
        DDP_INFO("checkpoint: %ld save(s); training thread paid %.1f ms at step boundaries and "
                 "%.1f ms waiting for snapshots (%.1f ms per save)%s",
                 c->stats.saves, c->stats.boundary_ms, c->stats.wait_ms,
                 (c->stats.boundary_ms + c->stats.wait_ms) / (double)c->stats.saves,
                 rc ? "; the last save FAILED" : "");
    return rc;
}

void ddp_saving_get_stats(const ddp_saving_t *c, ddp_saving_stats_t *out)
{
    memset(out, 0, sizeof *out);
    if (c) *out = c->stats;
}

void ddp_saving_free(ddp_saving_t *c)
{
    if (!c) return;
    double waited;
    join_helper(c, &waited);
    ddp_ckpt_saver_free(c->saver);
    free(c->model_t);
    free(c->optim_t);
    free(c->names);
    free(c->update_crc);
    free(c->config);
    free(c->genconf);
    free(c->trainer);
    free(c);
}
