/* The peer protocol's parser (see peer_msg.h): one function per message kind reads its fields
 * through the typed getters below, so every refusal has the same shape ("<kind>: field '<name>':
 * <what is wrong>") and no handler reads a raw JSON field.
 * Invariant: on failure *m is empty (nothing to close); on success m->root holds the strings.
 */
#include "daemon/peer_msg.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "daemon/exec_rank.h"
#include "proto/spec.h"

static const char *const NAMES[] = {
    [DDPD_PMSG_ANY] = "message",    [DDPD_PMSG_HELLO] = "hello",
    [DDPD_PMSG_CHALLENGE] = "challenge", [DDPD_PMSG_PROOF] = "proof",
    [DDPD_PMSG_OK] = "ok",          [DDPD_PMSG_REFUSED] = "refused",
    [DDPD_PMSG_STATUS] = "status",  [DDPD_PMSG_START] = "start",
    [DDPD_PMSG_KILL] = "kill",      [DDPD_PMSG_SIGNAL] = "signal",
    [DDPD_PMSG_STARTED] = "started", [DDPD_PMSG_FAILED] = "failed",
    [DDPD_PMSG_ADOPTED] = "adopted", [DDPD_PMSG_EXIT] = "exit",
    [DDPD_PMSG_PING] = "ping",      [DDPD_PMSG_UNKNOWN] = "unknown",
};

const char *ddpd_pmsg_kind_name(ddpd_pmsg_kind_t k)
{
    return k >= DDPD_PMSG_ANY && k <= DDPD_PMSG_UNKNOWN ? NAMES[k] : "?";
}

/* What one parse reads from, and where its refusal goes. */
typedef struct {
    json_t *o;
    const char *kind; /* the message's name, first in every refusal */
    char *why;
    size_t why_len;
} ctx_t;

/* Writes "<kind>: field '<field>': <fmt...>" to c->why; returns DDP_EPROTO. */
static int fail(ctx_t *c, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(ctx_t *c, const char *field, const char *fmt, ...)
{
    if (!c->why || !c->why_len) return DDP_EPROTO;
    int n = snprintf(c->why, c->why_len, "%s: field '%s': ", c->kind, field);
    if (n >= 0 && (size_t)n < c->why_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->why + n, c->why_len - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return DDP_EPROTO;
}

/* The field's value, or NULL with the refusal written. */
static json_t *field(ctx_t *c, const char *k, int *rc)
{
    json_t *v = json_object_get(c->o, k);
    if (!v) *rc = fail(c, k, "missing");
    return v;
}

static int get_str(ctx_t *c, const char *k, size_t min, size_t max, const char **out)
{
    int rc = 0;
    json_t *v = field(c, k, &rc);
    if (!v) return rc;
    if (!json_is_string(v)) return fail(c, k, "not a string");
    size_t n = json_string_length(v);
    const char *s = json_string_value(v);
    if (strlen(s) != n) return fail(c, k, "holds a NUL character");
    if (n < min) return fail(c, k, "empty");
    if (n > max) return fail(c, k, "%zu bytes long, more than %zu", n, max);
    *out = s;
    return 0;
}

/* An integer in [lo, hi] (JSON reals are refused: every sender writes integers). */
static int check_int(ctx_t *c, const char *k, json_t *v, int64_t lo, int64_t hi, int64_t *out)
{
    if (!json_is_integer(v)) return fail(c, k, "not an integer");
    int64_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return fail(c, k, "%lld is out of range [%lld, %lld]", (long long)x, (long long)lo,
                    (long long)hi);
    *out = x;
    return 0;
}

static int get_i64(ctx_t *c, const char *k, int64_t lo, int64_t hi, int64_t *out)
{
    int rc = 0;
    json_t *v = field(c, k, &rc);
    return v ? check_int(c, k, v, lo, hi, out) : rc;
}

static int get_int(ctx_t *c, const char *k, int lo, int hi, int *out)
{
    int64_t x = 0;
    int rc = get_i64(c, k, lo, hi, &x);
    if (rc == 0) *out = (int)x;
    return rc;
}

static int get_bool(ctx_t *c, const char *k, int *out)
{
    int rc = 0;
    json_t *v = field(c, k, &rc);
    if (!v) return rc;
    if (!json_is_boolean(v)) return fail(c, k, "not true or false");
    *out = json_is_true(v);
    return 0;
}

/* Exactly n bytes as 2n hex digits, decoded into out. */
static int get_hex(ctx_t *c, const char *k, unsigned char *out, size_t n)
{
    const char *s = NULL;
    DDP_CHECK(get_str(c, k, 0, SIZE_MAX, &s));
    if (strlen(s) != 2 * n || ddpd_auth_from_hex(out, n, s) != 0)
        return fail(c, k, "not %zu hex digits", 2 * n);
    return 0;
}

/* A MAC stays hex (auth.h verifies it in constant time) but must be well formed. */
static int get_mac(ctx_t *c, const char *k, const char **out)
{
    unsigned char scratch[DDPD_AUTH_MACBYTES];
    int rc = get_hex(c, k, scratch, sizeof scratch);
    if (rc == 0) *out = json_string_value(json_object_get(c->o, k));
    return rc;
}

/* An array of [min_n, max_n] integers (`noun` in the refusal), each in [lo, hi], copied to a
 * new array (NULL when empty) that the caller owns. */
static int get_ints(ctx_t *c, const char *k, const char *noun, size_t min_n, size_t max_n,
                    int lo, int hi, int **out, int *n_out)
{
    int rc = 0;
    json_t *v = field(c, k, &rc);
    if (!v) return rc;
    if (!json_is_array(v)) return fail(c, k, "not an array");
    size_t n = json_array_size(v);
    if (n < min_n) return fail(c, k, "empty");
    if (n > max_n) return fail(c, k, "%zu %s, more than %zu", n, noun, max_n);
    int *r = n ? ddp_malloc(n * sizeof *r) : NULL;
    if (n && !r) {
        snprintf(c->why, c->why_len, "%s: out of memory", c->kind);
        return DDP_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        char name[64];
        int64_t x = 0;
        snprintf(name, sizeof name, "%s[%zu]", k, i);
        rc = check_int(c, name, json_array_get(v, i), lo, hi, &x);
        if (rc != 0) {
            free(r);
            return rc;
        }
        r[i] = (int)x;
    }
    *out = r;
    *n_out = (int)n;
    return 0;
}

/* ---- one reader per kind: fields in the order the sender writes them ---- */

/* A node name: it becomes a directory name on this node and a word in its log. */
static int get_node(ctx_t *c, const char *k, const char **out)
{
    DDP_CHECK(get_str(c, k, 1, DDPD_PMSG_NODE_MAX, out));
    if (!ddp_spec_name_ok(*out))
        return fail(c, k, "not a node name (letters, digits, '-', '_' and '.', starting with a "
                          "letter or digit)");
    return 0;
}

/* The optional protocol version "v" (1 when absent: an older ddpd). */
static int get_version(ctx_t *c, int *v)
{
    *v = 1;
    return json_object_get(c->o, "v") ? get_int(c, "v", 1, 255, v) : 0;
}

/* A capability: a lowercase word of at most DDPD_PMSG_CAP_MAX bytes. */
static int cap_ok(const char *s)
{
    size_t n = strlen(s);
    if (!n || n > DDPD_PMSG_CAP_MAX) return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '-')) return 0;
    return 1;
}

static int read_hello(ctx_t *c, ddpd_pmsg_t *m)
{
    DDP_CHECK(get_node(c, "hello", &m->u.hello.node));
    DDP_CHECK(get_hex(c, "nonce", m->u.hello.nonce, sizeof m->u.hello.nonce));
    DDP_CHECK(get_version(c, &m->u.hello.v));
    json_t *caps = json_object_get(c->o, "caps");
    if (!caps) return 0;
    if (!json_is_array(caps) || json_array_size(caps) > DDPD_PMSG_CAPS_MAX)
        return fail(c, "caps", "not an array of at most %d capabilities", DDPD_PMSG_CAPS_MAX);
    size_t i, len = 0;
    json_t *v;
    json_array_foreach(caps, i, v) {
        const char *w = json_string_value(v);
        if (!w || !cap_ok(w)) return fail(c, "caps", "entry %zu is not a capability", i);
        len += (size_t)snprintf(m->u.hello.caps + len, sizeof m->u.hello.caps - len, "%s%s",
                                i ? "," : "", w);
    }
    return 0;
}

static int read_challenge(ctx_t *c, ddpd_pmsg_t *m)
{
    DDP_CHECK(get_node(c, "node", &m->u.challenge.node));
    DDP_CHECK(get_hex(c, "nonce", m->u.challenge.nonce, sizeof m->u.challenge.nonce));
    DDP_CHECK(get_mac(c, "mac", &m->u.challenge.mac));
    DDP_CHECK(get_version(c, &m->u.challenge.v));
    m->u.challenge.chosen = "";
    if (!json_object_get(c->o, "chosen")) return 0;
    DDP_CHECK(get_str(c, "chosen", 1, DDPD_PMSG_CAP_MAX, &m->u.challenge.chosen));
    return cap_ok(m->u.challenge.chosen) ? 0 : fail(c, "chosen", "not a capability");
}

static int read_proof(ctx_t *c, ddpd_pmsg_t *m) { return get_mac(c, "mac", &m->u.proof.mac); }

static int read_ok(ctx_t *c, ddpd_pmsg_t *m)
{
    int ok = 0;
    DDP_CHECK(get_bool(c, "ok", &ok));
    if (!ok) return fail(c, "ok", "false");
    return get_node(c, "node", &m->u.ok.node);
}

static int read_status(ctx_t *c, ddpd_pmsg_t *m)
{
    DDP_CHECK(get_node(c, "node", &m->u.status.node));
    DDP_CHECK(get_int(c, "slots", 0, DDPD_PMSG_MAX_SLOTS, &m->u.status.slots));
    return get_int(c, "free", 0, m->u.status.slots, &m->u.status.free);
}

static int read_start(ctx_t *c, ddpd_pmsg_t *m)
{
    ddpd_pmsg_start_t *s = &m->u.start;
    int64_t uid = 0, gid = 0;
    DDP_CHECK(get_i64(c, "job", 0, INT64_MAX, &s->job));
    DDP_CHECK(get_str(c, "name", 0, DDPD_PMSG_TEXT_MAX, &s->name));
    DDP_CHECK(get_int(c, "world", 1, DDPD_PMSG_MAX_WORLD, &s->world));
    DDP_CHECK(get_str(c, "rdzv", 1, DDPD_PMSG_ADDR_MAX, &s->rdzv));
    DDP_CHECK(get_str(c, "token", 1, DDPD_PMSG_TOKEN_MAX, &s->token));
    DDP_CHECK(get_str(c, "spec", 1, SIZE_MAX, &s->spec));
    DDP_CHECK(get_str(c, "cwd", 0, DDPD_PMSG_TEXT_MAX, &s->cwd));
    DDP_CHECK(get_i64(c, "uid", INT32_MIN, UINT32_MAX, &uid));
    DDP_CHECK(get_i64(c, "gid", INT32_MIN, UINT32_MAX, &gid));
    DDP_CHECK(get_int(c, "threads", 0, 4096, &s->threads));
    DDP_CHECK(get_bool(c, "elastic", &s->elastic));
    DDP_CHECK(get_int(c, "max_restarts", 0, 1000000, &s->max_restarts));
    s->uid = (uint32_t)uid;
    s->gid = (uint32_t)gid;
    size_t most = (size_t)s->world < DDPD_PMSG_MAX_RANKS ? (size_t)s->world : DDPD_PMSG_MAX_RANKS;
    DDP_CHECK(get_ints(c, "ranks", "ranks", 1, most, 0, s->world - 1, &s->ranks, &s->n_ranks));
    if (!json_object_get(c->o, "groups")) return 0; /* an older coordinator */
    int *g = NULL, n = 0;
    /* gids are below 2^32 - 1; get_ints reads ints, so those above INT_MAX arrive negative as
     * the uid does */
    DDP_CHECK(get_ints(c, "groups", "groups", 0, DDPD_MAX_GROUPS, INT32_MIN, INT32_MAX, &g, &n));
    s->groups = (uint32_t *)g; /* same size; each int's bits are the gid */
    s->n_groups = n;
    s->has_groups = 1;
    return 0;
}

static int read_kill(ctx_t *c, ddpd_pmsg_t *m)
{
    DDP_CHECK(get_i64(c, "job", 0, INT64_MAX, &m->u.kill.job));
    DDP_CHECK(get_int(c, "pid", 0, INT32_MAX, &m->u.kill.pid));
    return get_str(c, "host_id", 0, DDPD_PMSG_HOST_ID_MAX, &m->u.kill.host_id);
}

static int read_signal(ctx_t *c, ddpd_pmsg_t *m)
{
    DDP_CHECK(get_i64(c, "job", 0, INT64_MAX, &m->u.signal.job));
    return get_int(c, "sig", 1, 64, &m->u.signal.sig);
}

static int read_started(ctx_t *c, ddpd_pmsg_t *m)
{
    DDP_CHECK(get_i64(c, "job", 0, INT64_MAX, &m->u.started.job));
    return get_int(c, "n", 1, DDPD_PMSG_MAX_RANKS, &m->u.started.n);
}

static int read_failed(ctx_t *c, ddpd_pmsg_t *m)
{
    DDP_CHECK(get_i64(c, "job", 0, INT64_MAX, &m->u.failed.job));
    return get_str(c, "why", 0, DDPD_PMSG_TEXT_MAX, &m->u.failed.why);
}

static int read_adopted(ctx_t *c, ddpd_pmsg_t *m)
{
    DDP_CHECK(get_i64(c, "job", 0, INT64_MAX, &m->u.adopted.job));
    return get_ints(c, "ranks", "ranks", 0, DDPD_PMSG_MAX_RANKS, 0, DDPD_PMSG_MAX_WORLD - 1,
                     &m->u.adopted.ranks, &m->u.adopted.n_ranks);
}

static int read_exit(ctx_t *c, ddpd_pmsg_t *m)
{
    DDP_CHECK(get_i64(c, "job", 0, INT64_MAX, &m->u.exit.job));
    DDP_CHECK(get_int(c, "rank", 0, DDPD_PMSG_MAX_WORLD - 1, &m->u.exit.rank));
    DDP_CHECK(get_int(c, "code", 0, 255, &m->u.exit.code));
    return get_int(c, "sig", 0, 64, &m->u.exit.sig);
}

static int read_refused(ctx_t *c, ddpd_pmsg_t *m)
{
    return get_str(c, "error", 0, DDPD_PMSG_TEXT_MAX, &m->u.refused.error);
}

static int read_ping(ctx_t *c, ddpd_pmsg_t *m)
{
    (void)c;
    (void)m;
    return 0;
}

static int read_unknown(ctx_t *c, ddpd_pmsg_t *m)
{
    (void)c;
    m->u.unknown.t = json_string_value(json_object_get(m->root, "t"));
    return 0;
}

typedef int (*reader_t)(ctx_t *c, ddpd_pmsg_t *m);

static const reader_t READERS[] = {
    [DDPD_PMSG_HELLO] = read_hello,     [DDPD_PMSG_CHALLENGE] = read_challenge,
    [DDPD_PMSG_PROOF] = read_proof,     [DDPD_PMSG_OK] = read_ok,
    [DDPD_PMSG_REFUSED] = read_refused, [DDPD_PMSG_STATUS] = read_status,
    [DDPD_PMSG_START] = read_start,     [DDPD_PMSG_KILL] = read_kill,
    [DDPD_PMSG_SIGNAL] = read_signal,   [DDPD_PMSG_STARTED] = read_started,
    [DDPD_PMSG_FAILED] = read_failed,   [DDPD_PMSG_ADOPTED] = read_adopted,
    [DDPD_PMSG_EXIT] = read_exit,       [DDPD_PMSG_PING] = read_ping,
    [DDPD_PMSG_UNKNOWN] = read_unknown,
};

/* Which kind o is, given what the link expects. */
static int kind_of(ctx_t *c, ddpd_pmsg_kind_t expect, ddpd_pmsg_kind_t *kind)
{
    if (expect != DDPD_PMSG_ANY) {
        /* a listener's refusal can arrive in place of any handshake message */
        *kind = json_object_get(c->o, "error") ? DDPD_PMSG_REFUSED : expect;
        return 0;
    }
    const char *t;
    DDP_CHECK(get_str(c, "t", 1, 64, &t));
    *kind = DDPD_PMSG_UNKNOWN;
    for (int k = DDPD_PMSG_STATUS; k < DDPD_PMSG_UNKNOWN; k++)
        if (!strcmp(t, NAMES[k])) *kind = (ddpd_pmsg_kind_t)k;
    return 0;
}

int ddpd_pmsg_from_json(json_t *o, ddpd_pmsg_kind_t expect, ddpd_pmsg_t *m, char *why,
                        size_t why_len)
{
    memset(m, 0, sizeof *m);
    if (why && why_len) why[0] = '\0';
    if (expect < DDPD_PMSG_ANY || expect > DDPD_PMSG_OK) {
        json_decref(o);
        if (why && why_len) snprintf(why, why_len, "no such handshake message");
        return DDP_EINVAL;
    }
    ctx_t c = {.o = o, .kind = NAMES[expect], .why = why, .why_len = why_len};
    if (!json_is_object(o)) {
        json_decref(o);
        if (why && why_len) snprintf(why, why_len, "%s: not a JSON object", c.kind);
        return DDP_EPROTO;
    }
    ddpd_pmsg_kind_t kind;
    int rc = kind_of(&c, expect, &kind);
    if (rc == 0) {
        m->kind = kind;
        m->root = o;
        c.kind = NAMES[kind];
        rc = READERS[kind](&c, m);
    }
    if (rc != 0) {
        if (!m->root) json_decref(o);
        ddpd_pmsg_close(m); /* and the root, once it is m's */
    }
    return rc;
}

int ddpd_pmsg_parse(const char *line, size_t len, ddpd_pmsg_kind_t expect, ddpd_pmsg_t *m,
                    char *why, size_t why_len)
{
    json_error_t err;
    /* no JSON_DISABLE_EOF_CHECK: bytes after the object (but blanks) are refused */
    json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES, &err);
    if (!o) {
        memset(m, 0, sizeof *m);
        if (why && why_len)
            snprintf(why, why_len, "%s: not JSON (column %d: %s)",
                     ddpd_pmsg_kind_name(expect), err.column, err.text);
        return DDP_EPROTO;
    }
    return ddpd_pmsg_from_json(o, expect, m, why, why_len);
}

void ddpd_pmsg_close(ddpd_pmsg_t *m)
{
    if (!m) return;
    if (m->kind == DDPD_PMSG_START) {
        free(m->u.start.ranks);
        free(m->u.start.groups);
    }
    if (m->kind == DDPD_PMSG_ADOPTED) free(m->u.adopted.ranks);
    json_decref(m->root);
    memset(m, 0, sizeof *m);
}
