/* The job spec written out: one spec as JSON (trainer.json, the daemon), and the reference of
 * every field (docs/spec.md, `ddp-worker --spec-reference`). Both walk the field table
 * (proto/spec_int.h), so neither can disagree with the validator in spec.c.
 *
 * The reference is Markdown: an introduction and an example, one table per section (field,
 * type, default, allowed values, meaning), the presets, the rules that tie fields together, and
 * how scalars are read. Types, ranges and choices come from the table; a default comes from
 * ddp_spec_defaults unless the table gives it in words; the meaning is the table's doc string.
 * Its bytes depend on the table only, never on the machine, so a test can compare it with the
 * committed docs/spec.md.
 */
#include <ctype.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "proto/spec.h"
#include "proto/spec_int.h"

typedef ddp__sfield_t field_t;

/* ---- JSON output --------------------------------------------------------------------------- */

static json_t *value_json(const field_t *f, const char *p, const ddp_spec_t *s);

/* A list: a string where it was given as one (or is empty), else an array of objects. */
static json_t *list_json(const field_t *f, const char *p, const ddp_spec_t *s)
{
    const ddp__slist_t *L = f->list;
    int n = *(const int *)((const char *)s + L->count_off);
    if (L->from_string && !*(const int *)((const char *)s + L->listed_off)) {
        for (size_t j = 0; j < L->n_items; j++)
            if (!strcmp(L->items[j].path, L->from_string))
                return json_string(n ? p + L->items[j].off : "");
    }
    json_t *a = json_array();
    for (int k = 0; a && k < n; k++) {
        const char *item = p + (size_t)k * L->item_size;
        json_t *o = json_object();
        for (size_t j = 0; o && j < L->n_items; j++) {
            const field_t *it = &L->items[j];
            if (it->quiet && !memcmp(item + it->off, (const char *)L->defaults + it->off, it->size))
                continue; /* at its default: left out, as a quiet field (spec_int.h) */
            if (json_object_set_new(o, it->path, value_json(it, item + it->off, s))) {
                json_decref(o);
                o = NULL;
            }
        }
        if (!o || json_array_append_new(a, o)) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

static json_t *value_json(const field_t *f, const char *p, const ddp_spec_t *s)
{
    switch (f->type) {
    case DDP__FT_INT:
        return json_integer(f->size == sizeof(int) ? *(const int *)p : *(const long *)p);
    case DDP__FT_SEED: return json_integer((json_int_t) * (const uint64_t *)p);
    case DDP__FT_BYTES: return json_integer((json_int_t) * (const int64_t *)p);
    case DDP__FT_NUM: return json_real(*(const double *)p);
    case DDP__FT_BOOL: return json_boolean(*(const int *)p);
    case DDP__FT_ENUM: {
        int v = *(const int *)p, n = 0;
        while (f->choices[n]) n++;
        return json_string(v >= 0 && v < n ? f->choices[v] : "?");
    }
    case DDP__FT_STR:
    case DDP__FT_CHOICE:
    case DDP__FT_PRESET: return json_string(p);
    case DDP__FT_LIST: return list_json(f, p, s);
    case DDP__FT_PAIR: break;
    }
    return NULL;
}

static json_t *field_json(const ddp_spec_t *s, const field_t *f)
{
    return value_json(f, (const char *)s + f->off, s);
}

char *ddp_spec_to_json(const ddp_spec_t *s)
{
    json_t *root = json_object();
    char *out = NULL;
    ddp_spec_t *d = ddp_calloc(1, sizeof *d); /* the defaults, for the quiet fields */
    if (!root || !d) goto out;
    ddp_spec_defaults(d);
    for (size_t i = 0; i < ddp__spec_n_fields; i++) {
        const field_t *f = &ddp__spec_fields[i];
        if (f->type == DDP__FT_PAIR) continue; /* written as beta1/beta2 */
        bool model = !strncmp(f->path, "model.", 6);
        if (model && !strcmp(f->path, "model.init_from") && !s->init_from[0]) continue;
        if (model && !strcmp(f->path, "model.preset") && !s->preset[0]) continue;
        if (model && s->preset[0] && f->type == DDP__FT_INT) continue; /* dims come from preset */
        if (model && !strcmp(f->path, "model.config") && !s->config[0]) continue;
        /* dims only for a GPT-2 given by them: otherwise the files give the model again */
        if (model && f->type == DDP__FT_INT &&
            (!s->model.n_layer || s->config[0] || s->model.arch != DDP_ARCH_GPT2))
            continue;
        if (!strcmp(f->path, "train.seq_len") && !s->seq_len) continue;  /* block_size, later */
        /* min_lr at the default it would be derived as (spec_rules.c): left out, so that --set of
         * train.lr or train.schedule moves it as the default does */
        if (!strcmp(f->path, "train.min_lr") &&
            s->min_lr == (s->schedule == DDP_SCHED_WSD ? 0 : s->lr / 10))
            continue;
        /* quiet fields at their default and an empty list are left out (spec_int.h) */
        if (f->quiet && !memcmp((const char *)s + f->off, (const char *)d + f->off, f->size))
            continue;
        if (f->type == DDP__FT_LIST && !*(const int *)((const char *)s + f->list->count_off))
            continue;
        const char *dot = strchr(f->path, '.');
        json_t *obj = root;
        if (dot) {
            char sec[32];
            snprintf(sec, sizeof sec, "%.*s", (int)(dot - f->path), f->path);
            obj = json_object_get(root, sec);
            if (!obj) {
                obj = json_object();
                if (json_object_set_new(root, sec, obj)) goto out;
            }
        }
        json_t *v = field_json(s, f);
        if (!v || json_object_set_new(obj, dot ? dot + 1 : f->path, v)) goto out;
    }
    out = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
out:
    json_decref(root);
    free(d);
    return out;
}

/* ---- the reference ------------------------------------------------------------------------- */

static const char INTRO[] =
    "# Job spec reference\n"
    "\n"
    "<!-- Generated by `ddp-worker --spec-reference` from the field table in proto/spec.c; do\n"
    "     not edit. After changing the table: build/worker/ddp-worker --spec-reference >\n"
    "     docs/spec.md (the unit test spec_reference fails until this file matches). -->\n"
    "\n"
    "A job spec is a YAML file, or the same as JSON (a document whose first non-space character\n"
    "is `{`). It is validated before anything starts, by `ddp-worker`, `ddpctl` and the daemon\n"
    "alike, and an error names the file, the line, the column and the field:\n"
    "`job.yaml:4:7: train.lr: must be a number > 0 and <= 10, got -1`. Unknown keys are errors.\n"
    "Every section but `data` may be left out, and a field left out takes its default.\n"
    "`ddp-worker JOB.yaml --set train.steps=20` overrides a field (repeatable; the value is read\n"
    "as JSON when it parses, else as a string), and `ddp-worker JOB.yaml --print-spec` prints the\n"
    "spec as validated, defaults filled in, as JSON.\n"
    "\n"
    "```yaml\n"
    "name: shakespeare-mini\n"
    "model: {preset: gpt2-mini}            # or n_layer/n_head/n_embd/vocab_size/block_size\n"
    "data: {train: \"data/shakespeare/train_*.bin\", val: \"data/shakespeare/val_*.bin\"}\n"
    "train: {steps: 2000, micro_batch: 8, seq_len: 128, global_batch_tokens: 16384, lr: 1.0e-3,\n"
    "        warmup: 100, schedule: cosine, weight_decay: 0.1, clip: 1.0, seed: 1337}\n"
    "ddp: {workers: 2, bucket_mb: 25, backend: auto, overlap: true}\n"
    "checkpoint: {dir: runs/shakespeare/checkpoints, every: 200, keep_last: 3, writers: 1}\n"
    "```\n";

/* What ddp__spec_finish in spec_rules.c checks, in words (keep the two in step). */
static const char RULES[] =
    "## Rules between fields\n"
    "\n"
    "- The model is a preset, or all five of `n_layer`, `n_head`, `n_embd`, `vocab_size` and\n"
    "  `block_size` (a GPT-2), or `config` (any family), one of them; `n_embd` is divisible by\n"
    "  `n_head`. `init_from` alone takes the model from its `config.json`, and checks any other\n"
    "  source against it.\n"
    "- `train.seq_len` <= `model.block_size`; `train.global_batch_tokens` is 0 or a multiple of\n"
    "  `micro_batch` x `seq_len` (and the worker checks that it divides by the world).\n"
    "- `train.betas` or `beta1`/`beta2`, not both; `train.min_lr` <= `train.lr`;\n"
    "  `train.warmup` < `train.steps` when it is not 0.\n"
    "- `train.decay_steps`, `decay_frac` and `decay_shape` only with `schedule: wsd`, and not\n"
    "  both `decay_steps` and `decay_frac`; the decay is 1 to `steps` - `warmup` steps long.\n"
    "- `train.skip_loss_z` and `skip_norm_z` are 0 or below sqrt(`skip_window` - 1), the\n"
    "  largest z-score a window of that size can give.\n"
    "- The entries of `data.train`, `data.val` and `eval` have unique names.\n"
    "- `ddp.min_workers` <= `ddp.workers` <= `ddp.max_workers`; `ddp.first_bucket_mb` <=\n"
    "  `ddp.bucket_mb`.\n"
    "- `checkpoint.every` > 0 needs `checkpoint.dir`; `checkpoint.writers` <=\n"
    "  `ddp.max_workers`.\n";

static const char VALUES[] =
    "## How values are read\n"
    "\n"
    "Scalars are strict: `\"12abc\"` or `1.5` is not an integer (`1e6` is); booleans are\n"
    "`true`/`false`/`yes`/`no`/`on`/`off`; a quoted `\"100\"` is a string, not a number, in YAML\n"
    "as in JSON. A size (`train.memory_limit`, `limits.*`) is an integer number of bytes or a\n"
    "number with a unit: `B`, `kB`/`KB` (10^3), `KiB`/`k`/`K`, `MB`, `MiB`/`M`, `GB`, `GiB`/`G`,\n"
    "`TB`, `TiB`/`T` (`\"8GiB\"`, `\"1.5 GB\"`).\n";

/* Writes text with '|' escaped, for a Markdown table cell. */
static void cell(FILE *out, const char *text)
{
    for (const char *c = text; *c; c++) {
        if (*c == '|') fputc('\\', out);
        fputc(*c, out);
    }
}

static const char *type_name(const field_t *f)
{
    switch (f->type) {
    case DDP__FT_INT:
    case DDP__FT_SEED: return "integer";
    case DDP__FT_NUM: return "number";
    case DDP__FT_BOOL: return "boolean";
    case DDP__FT_STR:
    case DDP__FT_PRESET: return "string";
    case DDP__FT_ENUM:
    case DDP__FT_CHOICE: return "choice";
    case DDP__FT_PAIR: return "[number, number]";
    case DDP__FT_BYTES: return "size";
    case DDP__FT_LIST: return f->list->from_string ? "string or list" : "list";
    }
    return "?";
}

/* `a`, `b`, `c` */
static void list_names(char *buf, size_t len, const char *const *names, size_t n)
{
    size_t k = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && names[i] && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, "%s`%s`", i ? ", " : "", names[i]);
}

/* What the validator accepts, from the field's type and range (spec_value.c's in_range). */
static void allowed(const field_t *f, char *buf, size_t len)
{
    char lo[32], hi[32];
    snprintf(lo, sizeof lo, "%.15g", f->lo);
    snprintf(hi, sizeof hi, "%.15g", f->hi);
    const char *lo_op = f->lo_open ? ">" : ">=", *hi_op = f->hi_open ? "<" : "<=";
    switch (f->type) {
    case DDP__FT_INT:
    case DDP__FT_NUM:
        if (f->hi >= DDP__SPEC_NO_MAX)
            snprintf(buf, len, "%s %s", lo_op, lo);
        else
            snprintf(buf, len, "%s %s, %s %s", lo_op, lo, hi_op, hi);
        return;
    case DDP__FT_PAIR: snprintf(buf, len, "each %s %s, %s %s", lo_op, lo, hi_op, hi); return;
    case DDP__FT_SEED: snprintf(buf, len, ">= 0"); return;
    case DDP__FT_BOOL: snprintf(buf, len, "`true`, `false`"); return;
    case DDP__FT_STR: snprintf(buf, len, "text of at most %zu bytes", f->size - 1); return;
    case DDP__FT_ENUM:
    case DDP__FT_CHOICE: list_names(buf, len, f->choices, (size_t)-1); return;
    case DDP__FT_PRESET: {
        const char *names[16] = {NULL};
        for (size_t i = 0; i < ddp__spec_n_presets && i < 16; i++)
            names[i] = ddp__spec_presets[i].name;
        list_names(buf, len, names, 16);
        return;
    }
    case DDP__FT_BYTES: snprintf(buf, len, ">= 0, in bytes or with a unit (`\"8GiB\"`)"); return;
    case DDP__FT_LIST: snprintf(buf, len, "at most %d entries", f->list->max); return;
    }
    buf[0] = '\0';
}

/* The default: the table's words where it depends on other fields, else the value at p (from
 * ddp_spec_defaults, or a list's item defaults). */
static void default_text(const field_t *f, const char *p, char *buf, size_t len)
{
    if (f->dflt) {
        snprintf(buf, len, "%s", f->dflt);
        return;
    }
    switch (f->type) {
    case DDP__FT_INT:
        snprintf(buf, len, "`%ld`",
                 f->size == sizeof(int) ? (long)*(const int *)p : *(const long *)p);
        return;
    case DDP__FT_SEED: snprintf(buf, len, "`%" PRIu64 "`", *(const uint64_t *)p); return;
    case DDP__FT_BYTES: snprintf(buf, len, "`%" PRId64 "`", *(const int64_t *)p); return;
    case DDP__FT_NUM: snprintf(buf, len, "`%g`", *(const double *)p); return;
    case DDP__FT_PAIR: {
        const double *v = (const double *)p;
        snprintf(buf, len, "`[%g, %g]`", v[0], v[1]);
        return;
    }
    case DDP__FT_BOOL: snprintf(buf, len, "`%s`", *(const int *)p ? "true" : "false"); return;
    case DDP__FT_ENUM: snprintf(buf, len, "`%s`", f->choices[*(const int *)p]); return;
    case DDP__FT_STR:
    case DDP__FT_CHOICE:
    case DDP__FT_PRESET: {
        size_t n = strlen(p); /* quoted where the text alone would not show: "" or " " */
        bool quote = n == 0 || isspace((unsigned char)p[0]) || isspace((unsigned char)p[n - 1]);
        snprintf(buf, len, quote ? "`\"%s\"`" : "`%s`", p);
        return;
    }
    case DDP__FT_LIST: snprintf(buf, len, "`[]`"); return;
    }
    buf[0] = '\0';
}

/* One row of the reference's table: `path` (a list's item keys: `list[].key`). */
static void row(FILE *out, const field_t *f, const char *path, const char *p)
{
    char text[512];
    fprintf(out, "| `%s` | %s | ", path, type_name(f));
    if (f->required)
        snprintf(text, sizeof text, "required");
    else
        default_text(f, p, text, sizeof text);
    cell(out, text);
    fputs(" | ", out);
    allowed(f, text, sizeof text);
    cell(out, text);
    fputs(" | ", out);
    cell(out, f->doc);
    fputs(" |\n", out);
}

static void write_presets(FILE *out)
{
    fputs("## Presets\n\n"
          "GPT-2 (LayerNorm, learned positions, GELU MLP of 4 C, biases, tied LM head) and the "
          "Llama\nfamily (RMSNorm, RoPE, SwiGLU MLP of width I, grouped-query attention with "
          "KV key/value heads,\nno biases but Qwen2's q/k/v), in the published models' shapes "
          "(random initial weights;\n`model.init_from` loads published ones). Parameters: GPT-2 "
          "V C + T C + L (12 C^2 + 13 C) + 2 C;\nLlama V C (twice untied) + C + L (2 C^2 + 2 C K "
          "+ 3 C I + 2 C), K = KV C / n_head (+ C + 2 K\nwith q/k/v biases).\n\n"
          "| preset | family | n_layer | n_head | KV | n_embd | MLP | vocab_size | block_size | "
          "tied | parameters |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|\n",
          out);
    for (size_t i = 0; i < ddp__spec_n_presets; i++) {
        const ddp_model_cfg_t *c = &ddp__spec_presets[i].cfg;
        double C = c->n_embd, V = c->vocab_size, n;
        int llama = c->arch == DDP_ARCH_LLAMA;
        if (llama) {
            double K = (double)c->n_kv_head * C / c->n_head, I = c->intermediate_size;
            n = V * C * (c->tie_embeddings ? 1 : 2) + C +
                c->n_layer * (2 * C * C + 2 * C * K + 3 * C * I + 2 * C +
                              (c->attention_bias ? C + 2 * K : 0));
        } else {
            n = V * C + (double)c->block_size * C + c->n_layer * (12 * C * C + 13 * C) + 2 * C;
        }
        fprintf(out, "| `%s` | %s | %d | %d | %d | %d | %d | %d | %d | %s | ",
                ddp__spec_presets[i].name, llama ? (c->qwen2 ? "Qwen2" : "Llama") : "GPT-2",
                c->n_layer, c->n_head, llama ? c->n_kv_head : c->n_head, c->n_embd,
                llama ? c->intermediate_size : 4 * c->n_embd, c->vocab_size, c->block_size,
                llama && !c->tie_embeddings ? "no" : "yes");
        fprintf(out, n < 1e6 ? "%.2fM |\n" : n < 1e8 ? "%.1fM |\n" : "%.0fM |\n", n / 1e6);
    }
}

int ddp_spec_reference(FILE *out)
{
    for (size_t i = 0; i < ddp__spec_n_fields; i++)
        if (!ddp__spec_fields[i].doc || !ddp__spec_fields[i].doc[0]) return DDP_EINVAL;
    ddp_spec_t d;
    ddp_spec_defaults(&d);
    fputs(INTRO, out);
    fputs("\n## Fields\n", out);
    char section[32] = "";
    for (size_t i = 0; i < ddp__spec_n_fields; i++) {
        const field_t *f = &ddp__spec_fields[i];
        const char *dot = strchr(f->path, '.');
        char sec[32]; /* a top-level list is a section of its own */
        snprintf(sec, sizeof sec, "%.*s",
                 dot ? (int)(dot - f->path) : f->type == DDP__FT_LIST ? (int)strlen(f->path) : 0,
                 f->path);
        if (i == 0 || strcmp(sec, section)) {
            snprintf(section, sizeof section, "%s", sec);
            fprintf(out, "\n### %s\n\n", sec[0] ? sec : "Top level");
            fputs("| field | type | default | allowed | meaning |\n|---|---|---|---|---|\n", out);
        }
        row(out, f, f->path, (const char *)&d + f->off);
        for (size_t j = 0; f->type == DDP__FT_LIST && j < f->list->n_items; j++) {
            const field_t *it = &f->list->items[j];
            char path[96];
            snprintf(path, sizeof path, "%s[].%s", f->path, it->path);
            row(out, it, path, (const char *)f->list->defaults + it->off);
        }
    }
    fputc('\n', out);
    write_presets(out);
    fputc('\n', out);
    fputs(RULES, out);
    fputc('\n', out);
    fputs(VALUES, out);
    fflush(out);
    return ferror(out) ? DDP_EIO : 0;
}
