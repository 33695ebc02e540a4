/* The metrics record's codec (see metrics.h).
 *
 * Parsing is jansson's. Formatting is not, on purpose: jansson writes a real with %.17g (or
 * JSON_REAL_PRECISION(n)'s %.{n}g) and appends ".0" to an integral one, so it cannot reproduce
 * the %.6f, %.2f, %.6g and %g of the lines every earlier version wrote ("loss":3.281742,
 * "step_ms":0.00, "loss_scale":65536), and JSON has no raw-number value to hand it the text.
 * So the line is assembled here, field by field from the tables below: each number through
 * snprintf with its field's format, each string through jansson's own string encoder
 * (json_dumpb of a json_string), so escaping is never hand-made.
 */
#include "proto/metrics.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How a real is printed: the formats the line has always used. */
typedef enum real_fmt { R_NONE, R_F1, R_F2, R_F4, R_F6, R_G6, R_G } real_fmt_t;

typedef struct field {
    const char *key;         /* the JSON key: the member's name */
    ddp_metrics_type_t type;
    size_t off, size;        /* the member in ddp_metrics_rec_t */
    real_fmt_t fmt;          /* REAL: its format where the kind does not name another */
} field_t;

#define F(ID, member, type, fmt)                                                               \
    [DDP_MF_##ID] = {#member, DDP_METRICS_##type, offsetof(ddp_metrics_rec_t, member),          \
                     sizeof(((ddp_metrics_rec_t *)0)->member), fmt}
static const field_t FIELDS[DDP_MF_COUNT] = {
    F(STEP, step, INT, R_NONE),
    F(STEPS, steps, INT, R_NONE),
    F(LOSS, loss, REAL, R_F6),
    F(LR, lr, REAL, R_G6),
    F(GRAD_NORM, grad_norm, REAL, R_G6),
    F(TOKENS_PER_S, tokens_per_s, REAL, R_F1),
    F(STEP_MS, step_ms, REAL, R_F2),
    F(COMPUTE_MS, compute_ms, REAL, R_F2),
    F(COMM_MS, comm_ms, REAL, R_F2),
    F(EXPOSED_COMM_MS, exposed_comm_ms, REAL, R_F2),
    F(HIDDEN, hidden, REAL, R_F4),
    F(OPTIM_MS, optim_ms, REAL, R_F2),
    F(TOKENS, tokens, INT, R_NONE),
    F(WORLD, world, INT, R_NONE),
    F(GENERATION, generation, INT, R_NONE),
    F(STRAGGLER, straggler, INT, R_NONE),
    F(LOSS_SCALE, loss_scale, REAL, R_G),
    F(WALL_MS, wall_ms, REAL, R_F1),
    F(VAL_LOSS, val_loss, REAL, R_F6),
    F(CAUSE, cause, STR, R_NONE),
    F(RECONFIG_MS, reconfig_ms, REAL, R_F1),
    F(FORM_MS, form_ms, REAL, R_F1),
    F(ATTACH_MS, attach_ms, REAL, R_F1),
    F(STATE_MS, state_ms, REAL, R_F1),
    F(RECEIVERS, receivers, INT, R_NONE),
    F(SOURCE, source, INT, R_NONE),
    F(SHRUNK, shrunk, BOOL, R_NONE),
    F(MODE, mode, STR, R_NONE),
    F(MB, mb, REAL, R_F2),
    F(MS, ms, REAL, R_F1),
    F(MB_PER_S, mb_per_s, REAL, R_F1),
    F(FINAL_LOSS, final_loss, REAL, R_F6),
    F(MFU, mfu, REAL, R_F4),
    F(SKIPPED, skipped, STR, R_NONE),
    F(SKIPS, skips, INT, R_NONE),
    F(TASK, task, STR, R_NONE),
    F(EXAMPLES, examples, INT, R_NONE),
    F(ACC, acc, REAL, R_F6),
    F(ACC_NORM, acc_norm, REAL, R_F6),
    F(ACC_TOK, acc_tok, REAL, R_F6),
    F(EVAL_MS, eval_ms, REAL, R_F1),
};
#undef F
_Static_assert(DDP_MF_COUNT <= 64, "the presence bits fit a uint64_t");
/* a named value's worst case: its key escaped (6 bytes a byte) and quoted, a comma and a colon,
 * %.6f of DBL_MAX (316 bytes) */
_Static_assert(DDP_METRICS_LINE_MAX >=
                   16384 + DDP_METRICS_MAX_NAMED *
                               (6 * sizeof(((ddp_metrics_rec_t *)0)->named[0].key) + 4 + 400),
               "DDP_METRICS_LINE_MAX holds every named value");

/* A field's place in a kind's line; fmt R_NONE: the field's own format. */
typedef struct slot {
    unsigned char field;
    real_fmt_t fmt;
} slot_t;

/* Each kind's line, key by key, as the fprintfs it replaces wrote it. */
static const slot_t STEP_LINE[] = {
    {DDP_MF_STEP, R_NONE},         {DDP_MF_STEPS, R_NONE},       {DDP_MF_LOSS, R_NONE},
    {DDP_MF_LR, R_NONE},           {DDP_MF_GRAD_NORM, R_NONE},   {DDP_MF_TOKENS_PER_S, R_NONE},
    {DDP_MF_STEP_MS, R_NONE},      {DDP_MF_COMPUTE_MS, R_NONE},  {DDP_MF_COMM_MS, R_NONE},
    {DDP_MF_EXPOSED_COMM_MS, R_NONE}, {DDP_MF_HIDDEN, R_NONE},   {DDP_MF_OPTIM_MS, R_NONE},
    {DDP_MF_TOKENS, R_NONE},       {DDP_MF_WORLD, R_NONE},       {DDP_MF_GENERATION, R_NONE},
    {DDP_MF_STRAGGLER, R_NONE},    {DDP_MF_LOSS_SCALE, R_NONE},  {DDP_MF_WALL_MS, R_NONE},
    {DDP_MF_MFU, R_NONE},
};
static const slot_t VAL_LINE[] = {{DDP_MF_STEP, R_NONE}, {DDP_MF_VAL_LOSS, R_NONE}};
static const slot_t GENERATION_LINE[] = {
    {DDP_MF_GENERATION, R_NONE}, {DDP_MF_WORLD, R_NONE},    {DDP_MF_STEP, R_NONE},
    {DDP_MF_CAUSE, R_NONE},      {DDP_MF_RECONFIG_MS, R_NONE}, {DDP_MF_FORM_MS, R_NONE},
    {DDP_MF_COMM_MS, R_F1}, /* a step line's comm_ms has two decimals, this one has one */
    {DDP_MF_ATTACH_MS, R_NONE},  {DDP_MF_STATE_MS, R_NONE}, {DDP_MF_RECEIVERS, R_NONE},
    {DDP_MF_SOURCE, R_NONE},     {DDP_MF_SHRUNK, R_NONE},
};
static const slot_t TRANSFER_LINE[] = {
    {DDP_MF_GENERATION, R_NONE}, {DDP_MF_STEP, R_NONE}, {DDP_MF_MODE, R_NONE},
    {DDP_MF_RECEIVERS, R_NONE},  {DDP_MF_SOURCE, R_NONE}, {DDP_MF_MB, R_NONE},
    {DDP_MF_MS, R_NONE},         {DDP_MF_MB_PER_S, R_NONE},
};
static const slot_t DONE_LINE[] = {{DDP_MF_STEP, R_NONE}, {DDP_MF_FINAL_LOSS, R_NONE}};
static const slot_t EVAL_LINE[] = {
    {DDP_MF_STEP, R_NONE},    {DDP_MF_TASK, R_NONE},     {DDP_MF_EXAMPLES, R_NONE},
    {DDP_MF_ACC, R_NONE},     {DDP_MF_ACC_NORM, R_NONE}, {DDP_MF_ACC_TOK, R_NONE},
    {DDP_MF_EVAL_MS, R_NONE}, {DDP_MF_TOKENS, R_NONE},
};

#define N(a) (sizeof(a) / sizeof *(a))
static const struct kind {
    const char *name;  /* ddp_metrics_kind_name */
    const char *event; /* the "event" value, NULL: a line without one */
    const slot_t *slots;
    size_t n;
} KINDS[DDP_METRICS_KINDS] = {
    [DDP_METRICS_STEP] = {"step", NULL, STEP_LINE, N(STEP_LINE)},
    [DDP_METRICS_VAL] = {"validation", NULL, VAL_LINE, N(VAL_LINE)},
    [DDP_METRICS_GENERATION] = {"generation", "generation", GENERATION_LINE, N(GENERATION_LINE)},
    [DDP_METRICS_TRANSFER] = {"state_transfer", "state_transfer", TRANSFER_LINE,
                              N(TRANSFER_LINE)},
    [DDP_METRICS_DONE] = {"done", "done", DONE_LINE, N(DONE_LINE)},
    [DDP_METRICS_EVAL] = {"eval", "eval", EVAL_LINE, N(EVAL_LINE)},
    [DDP_METRICS_EVENT] = {"event", NULL, NULL, 0},
};

static int64_t *int_at(const ddp_metrics_rec_t *r, int f)
{
    return (int64_t *)((char *)r + FIELDS[f].off);
}
static double *real_at(const ddp_metrics_rec_t *r, int f)
{
    return (double *)((char *)r + FIELDS[f].off);
}
static bool *bool_at(const ddp_metrics_rec_t *r, int f)
{
    return (bool *)((char *)r + FIELDS[f].off);
}
static char *str_at(const ddp_metrics_rec_t *r, int f)
{
    return (char *)r + FIELDS[f].off;
}

int ddp_metrics_add_named(ddp_metrics_rec_t *r, const char *prefix, const char *name, double num,
                          bool integer)
{
    if (r->n_named >= DDP_METRICS_MAX_NAMED) return DDP_EINVAL;
    struct ddp_metrics_named *nv = &r->named[r->n_named++];
    snprintf(nv->key, sizeof nv->key, "%s/%s", prefix, name);
    nv->integer = integer;
    nv->num = num;
    return 0;
}

const char *ddp_metrics_kind_name(ddp_metrics_kind_t kind)
{
    return (unsigned)kind < DDP_METRICS_KINDS ? KINDS[kind].name : "?";
}

void ddp_metrics_init(ddp_metrics_rec_t *r, ddp_metrics_kind_t kind)
{
    memset(r, 0, sizeof *r);
    r->kind = kind;
    if ((unsigned)kind >= DDP_METRICS_KINDS) return;
    for (size_t i = 0; i < KINDS[kind].n; i++) r->has |= UINT64_C(1) << KINDS[kind].slots[i].field;
}

/* r's present fields in line order, each with the format it is printed in: the kind's fields
 * first, then any other present field (a validation's val_loss the daemon merged into its
 * step's record) in DDP_MF_* order. Returns the count. */
static int layout(const ddp_metrics_rec_t *r, slot_t out[DDP_MF_COUNT])
{
    uint64_t placed = 0;
    int n = 0;
    const struct kind *k = &KINDS[r->kind];
    for (size_t i = 0; i < k->n; i++) {
        uint64_t bit = UINT64_C(1) << k->slots[i].field;
        if (!(r->has & bit) || (placed & bit)) continue;
        placed |= bit;
        out[n] = k->slots[i];
        if (out[n].fmt == R_NONE) out[n].fmt = FIELDS[out[n].field].fmt;
        n++;
    }
    for (int f = 0; f < DDP_MF_COUNT; f++) {
        uint64_t bit = UINT64_C(1) << f;
        if ((r->has & bit) && !(placed & bit)) out[n++] = (slot_t){(unsigned char)f, FIELDS[f].fmt};
    }
    return n;
}

/* The text of a number or boolean field as the line holds it; returns snprintf's count. The
 * formats are literals (one per case) so the compiler checks them. */
static int number_text(const ddp_metrics_rec_t *r, slot_t s, char *buf, size_t len)
{
    switch (FIELDS[s.field].type) {
    case DDP_METRICS_INT:
        return snprintf(buf, len, "%" PRId64, *int_at(r, s.field));
    case DDP_METRICS_BOOL:
        return snprintf(buf, len, "%s", *bool_at(r, s.field) ? "true" : "false");
    case DDP_METRICS_REAL:
        break;
    case DDP_METRICS_STR:
        return snprintf(buf, len, "null"); /* not reached: strings go through jansson */
    }
    double v = *real_at(r, s.field);
    if (!isfinite(v)) return snprintf(buf, len, "null"); /* JSON has no NaN or Inf */
    /* %g writes -0.0 as "-0", which reads back as the integer 0 (jansson) and would then be
     * written "0": the %g formats write it as 0 (found by fuzz_metrics; %.6f's "-0.000000"
     * reads back as -0.0, as the hand-made lines before the codec wrote it) */
    if ((s.fmt == R_G6 || s.fmt == R_G) && v == 0.0) v = 0.0;
    switch (s.fmt) {
    case R_F1: return snprintf(buf, len, "%.1f", v);
    case R_F2: return snprintf(buf, len, "%.2f", v);
    case R_F4: return snprintf(buf, len, "%.4f", v);
    case R_F6: return snprintf(buf, len, "%.6f", v);
    case R_G6: return snprintf(buf, len, "%.6g", v);
    case R_G: return snprintf(buf, len, "%g", v);
    case R_NONE: break;
    }
    return snprintf(buf, len, "%.17g", v); /* not reached: every real has a format */
}

/* The length of the valid UTF-8 sequence at p (n bytes left), 0 if there is none: what
 * jansson accepts (no overlong forms, no surrogates, nothing above U+10FFFF). */
static size_t utf8_seq(const unsigned char *p, size_t n)
{
    unsigned c = p[0];
    size_t len;
    unsigned lo = 0x80, hi = 0xBF; /* the second byte's range */
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) len = 3;
    else if (c >= 0xF0 && c <= 0xF4) len = 4;
    else return 0;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
    if (n < len || p[1] < lo || p[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (p[i] < 0x80 || p[i] > 0xBF) return 0;
    return len;
}

/* The line being assembled; `over` once it did not fit. */
typedef struct out {
    char *buf;
    size_t cap, n;
    int over;
} out_t;

static void put(out_t *o, const char *s, size_t len)
{
    if (o->over || o->n + len >= o->cap) {
        o->over = 1;
        return;
    }
    memcpy(o->buf + o->n, s, len);
    o->n += len;
}

/* s (at most cap bytes, up to its NUL) as a JSON string, encoded by jansson; bytes that are not
 * UTF-8 become '?' first (jansson refuses them, and a reader could not load the line). */
static int put_string(out_t *o, const char *s, size_t cap)
{
    size_t len = strnlen(s, cap);
    char clean[256];
    if (len > sizeof clean) len = sizeof clean; /* every string member is at most this long */
    memcpy(clean, s, len);
    for (size_t i = 0; i < len;) {
        size_t k = utf8_seq((const unsigned char *)clean + i, len - i);
        if (k == 0) clean[i++] = '?';
        else i += k;
    }
    json_t *j = json_stringn(clean, len);
    if (!j) return DDP_ENOMEM; /* valid UTF-8 by now: only an allocation fails */
    if (!o->over) {
        size_t room = o->cap - o->n;
        size_t need = json_dumpb(j, o->buf + o->n, room, JSON_ENCODE_ANY);
        if (need == 0 || need >= room) o->over = 1;
        else o->n += need;
    }
    json_decref(j);
    return 0;
}

int ddp_metrics_format(const ddp_metrics_rec_t *r, char *buf, size_t cap, size_t *len)
{
    if (!r || !buf || cap == 0 || (unsigned)r->kind >= DDP_METRICS_KINDS) return DDP_EINVAL;
    out_t o = {buf, cap, 0, 0};
    put(&o, "{", 1);
    const char *ev = r->kind == DDP_METRICS_EVENT ? r->event : KINDS[r->kind].event;
    if (ev) {
        put(&o, "\"event\":", 8);
        if (put_string(&o, ev, r->kind == DDP_METRICS_EVENT ? sizeof r->event : strlen(ev))) {
            buf[0] = 0;
            return DDP_ENOMEM;
        }
    }
    slot_t slots[DDP_MF_COUNT];
    int n = layout(r, slots);
    for (int i = 0; i < n; i++) {
        const field_t *f = &FIELDS[slots[i].field];
        if (o.n > 1) put(&o, ",", 1);
        put(&o, "\"", 1);
        put(&o, f->key, strlen(f->key));
        put(&o, "\":", 2);
        if (f->type == DDP_METRICS_STR) {
            if (put_string(&o, str_at(r, slots[i].field), f->size)) {
                buf[0] = 0;
                return DDP_ENOMEM;
            }
            continue;
        }
        char num[400]; /* %.6f of DBL_MAX: 309 digits and 7 more */
        int k = number_text(r, slots[i], num, sizeof num);
        put(&o, num, k > 0 && (size_t)k < sizeof num ? (size_t)k : sizeof num);
    }
    for (int i = 0; i < r->n_named && i < DDP_METRICS_MAX_NAMED; i++) {
        const struct ddp_metrics_named *nv = &r->named[i];
        if (o.n > 1) put(&o, ",", 1);
        if (put_string(&o, nv->key, sizeof nv->key)) {
            buf[0] = 0;
            return DDP_ENOMEM;
        }
        put(&o, ":", 1);
        char num[400];
        int k = !isfinite(nv->num) ? snprintf(num, sizeof num, "null")
                : nv->integer      ? snprintf(num, sizeof num, "%" PRId64, (int64_t)nv->num)
                                   : snprintf(num, sizeof num, "%.6f", nv->num);
        put(&o, num, k > 0 && (size_t)k < sizeof num ? (size_t)k : sizeof num);
    }
    put(&o, "}", 1);
    if (o.over) {
        buf[0] = 0;
        return DDP_EINVAL;
    }
    buf[o.n] = 0;
    if (len) *len = o.n;
    return 0;
}

int ddp_metrics_values(const ddp_metrics_rec_t *r, ddp_metrics_value_t out[DDP_MF_COUNT])
{
    if ((unsigned)r->kind >= DDP_METRICS_KINDS) return 0;
    slot_t slots[DDP_MF_COUNT];
    int n = layout(r, slots);
    for (int i = 0; i < n; i++) {
        int f = slots[i].field;
        ddp_metrics_value_t *v = &out[i];
        *v = (ddp_metrics_value_t){FIELDS[f].key, f, FIELDS[f].type, NAN, NULL};
        switch (FIELDS[f].type) {
        case DDP_METRICS_INT: v->num = (double)*int_at(r, f); break;
        case DDP_METRICS_BOOL: v->num = *bool_at(r, f) ? 1.0 : 0.0; break;
        case DDP_METRICS_STR: v->str = str_at(r, f); break;
        case DDP_METRICS_REAL:
            if (isfinite(*real_at(r, f))) { /* what a reader of the line gets back */
                char num[400];
                number_text(r, slots[i], num, sizeof num);
                v->num = strtod(num, NULL);
            }
            break;
        }
    }
    return n;
}

json_t *ddp_metrics_to_json(const ddp_metrics_rec_t *r)
{
    /* the line's own bytes, loaded: the view then holds exactly what the file holds (an
     * integral %g real stays an integer, as a reader of the file sees it) */
    char *buf = malloc(DDP_METRICS_LINE_MAX);
    size_t n = 0;
    json_t *o = NULL;
    if (buf && ddp_metrics_format(r, buf, DDP_METRICS_LINE_MAX, &n) == 0)
        o = json_loadb(buf, n, 0, NULL);
    free(buf);
    return o;
}

/* ---- parsing ---- */

static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

static const char *wanted(ddp_metrics_type_t t)
{
    switch (t) {
    case DDP_METRICS_INT: return "an integer";
    case DDP_METRICS_REAL: return "a number or null";
    case DDP_METRICS_BOOL: return "true or false";
    case DDP_METRICS_STR: return "a string";
    }
    return "?";
}

/* Copies a JSON string into a member of `cap` bytes, cut at a character boundary. */
static void copy_str(char *dst, size_t cap, const json_t *s)
{
    const char *src = json_string_value(s);
    size_t n = json_string_length(s);
    if (n > cap - 1) {
        n = cap - 1;
        while (n > 0 && ((unsigned char)src[n] & 0xC0) == 0x80) n--; /* a continuation byte */
    }
    memcpy(dst, src, n);
    dst[n] = 0;
}

/* Stores v in field f of out; 0, or -1 when v's type is not the field's. */
static int store(ddp_metrics_rec_t *out, int f, const json_t *v)
{
    switch (FIELDS[f].type) {
    case DDP_METRICS_INT:
        if (!json_is_integer(v)) return -1;
        *int_at(out, f) = (int64_t)json_integer_value(v);
        return 0;
    case DDP_METRICS_REAL: /* %g and %.6g print integral values without a point */
        if (json_is_null(v)) *real_at(out, f) = NAN;
        else if (json_is_number(v)) *real_at(out, f) = json_number_value(v);
        else return -1;
        return 0;
    case DDP_METRICS_BOOL:
        if (!json_is_boolean(v)) return -1;
        *bool_at(out, f) = json_is_true(v);
        return 0;
    case DDP_METRICS_STR:
        if (!json_is_string(v)) return -1;
        copy_str(str_at(out, f), FIELDS[f].size, v);
        return 0;
    }
    return -1;
}

/* Zeroes *out, drops o, fills ei ("metrics line: ...", key as the path, col as the column when
 * known) and returns DDP_EFORMAT. */
static int fail(ddp_metrics_rec_t *out, json_t *o, ddp_errinfo_t *ei, const char *key, int col,
                const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static int fail(ddp_metrics_rec_t *out, json_t *o, ddp_errinfo_t *ei, const char *key, int col,
                const char *fmt, ...)
{
    memset(out, 0, sizeof *out);
    json_decref(o);
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ddp_errinfo_set(ei, DDP_EFORMAT, "metrics line: %s", msg);
    if (ei && key) ddp_errinfo_path(ei, "%s", key);
    if (ei && col > 0) ei->column = col;
    return DDP_EFORMAT;
}

int ddp_metrics_parse(const char *line, size_t len, ddp_metrics_rec_t *out, ddp_errinfo_t *ei)
{
    memset(out, 0, sizeof *out);
    if (!line) return fail(out, NULL, ei, NULL, 0, "no line");
    json_error_t je;
    json_t *o = json_loadb(line, len, JSON_DECODE_ANY, &je);
    if (!o) {
        if (json_error_code(&je) == json_error_out_of_memory) return DDP_ENOMEM;
        return fail(out, NULL, ei, NULL, je.column, "not JSON: %s", je.text);
    }
    if (!json_is_object(o))
        return fail(out, o, ei, NULL, 0, "%s where a JSON object belongs", type_name(o));
    json_t *ev = json_object_get(o, "event");
    if (ev) {
        if (!json_is_string(ev))
            return fail(out, o, ei, "event", 0, "\"event\" is %s, not a string",
                        type_name(ev));
        out->kind = DDP_METRICS_EVENT;
        for (int k = 0; k < DDP_METRICS_KINDS; k++)
            if (KINDS[k].event && !strcmp(json_string_value(ev), KINDS[k].event))
                out->kind = (ddp_metrics_kind_t)k;
        if (out->kind == DDP_METRICS_EVENT) copy_str(out->event, sizeof out->event, ev);
    }
    for (int f = 0; f < DDP_MF_COUNT; f++) {
        json_t *v = json_object_get(o, FIELDS[f].key);
        if (!v) continue;
        if (store(out, f, v) != 0)
            return fail(out, o, ei, FIELDS[f].key, 0, "\"%s\" is %s, not %s", FIELDS[f].key,
                        type_name(v), wanted(FIELDS[f].type));
        out->has |= UINT64_C(1) << f;
    }
    const char *key;
    json_t *v;
    /* named values: a key with a '/' holding a number */
    json_object_foreach(o, key, v) {
        if (!strchr(key, '/') || !(json_is_number(v) || json_is_null(v)) ||
            out->n_named >= DDP_METRICS_MAX_NAMED || strlen(key) >= sizeof out->named[0].key)
            continue;
        int seen = 0; /* a key cut at a "\u0000" may repeat another: the first one stays */
        for (int i = 0; i < out->n_named && !seen; i++) seen = !strcmp(out->named[i].key, key);
        if (seen) continue;
        struct ddp_metrics_named *nv = &out->named[out->n_named++];
        snprintf(nv->key, sizeof nv->key, "%s", key);
        nv->integer = json_is_integer(v);
        nv->num = json_is_null(v) ? NAN : json_number_value(v);
    }
    if (!ev) {
        if (!(out->has & DDP_MF(STEP)))
            return fail(out, o, ei, NULL, 0, "neither \"event\" nor \"step\"");
        out->kind = (out->has & DDP_MF(VAL_LOSS)) && !(out->has & DDP_MF(LOSS)) ? DDP_METRICS_VAL
                                                                               : DDP_METRICS_STEP;
    }
    json_decref(o);
    return 0;
}
