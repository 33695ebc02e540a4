/* Reading YAML and JSON documents into the spec tree (proto/spec_tree.h).
 *
 * Why not libcyaml's schema loader: libcyaml 1.3.1 (Debian 12) silently truncates integers
 * ("12abc" and "1.5" load as 12 and 1 for an INT field), and it reports where an error is only
 * as text in its log backtrace (and for an unknown key, the position of the enclosing mapping).
 * libyaml, the parser under libcyaml, gives a mark on every node, so we read its output into one
 * small tree that JSON (jansson) also fills, and validate both with one table in spec.c: same
 * struct, same errors, exact line and column, strict numbers.
 *
 * Why libyaml's event API and not its document loader: the loader builds the whole document
 * before we can look at it, and a spec comes from a request line in the root daemon's event loop.
 * libyaml 0.2.5 spends time growing with the square of the flow nesting depth, so 300,000 nested
 * '[' (600 KB) held the loop for 6 min 49 s; and the loader resolves anchors into a DAG, a
 * "billion laughs" that only a node cap stopped. Reading events, every limit holds while parsing:
 * depth (refused at the 18th level's start event), node count, scalar length; anchors and aliases
 * are refused where they appear (a spec has no use for them); and duplicate keys are found with a
 * hash set, not by comparing each key with every one before it. A hostile document is refused
 * after as many events as it takes to break a limit, in time linear in what was read. The
 * entries of an open mapping or sequence wait in one scratch array (a stack: an inner collection's
 * entries follow its parent's) and move into the arena at its end event, so memory stays linear
 * in the input.
 *
 * All memory of the tree comes from a bump arena in the tree (ddp_malloc'ed blocks), freed at
 * once.
 */
#include "proto/spec_tree.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "common/alloc.h"

#define MAX_DEPTH 16     /* the root is at depth 0 */
#define MAX_NODES 100000 /* keys count as nodes */
#define MAX_SCALAR 65536 /* bytes: specs hold names, paths and numbers */
#define BLOCK_BYTES 16384
#define NO_ANCHORS "anchors and aliases are not allowed in a job spec"

struct ddp__arena_block {
    ddp__arena_block_t *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

static void *arena_alloc(ddp__stree_t *t, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    ddp__arena_block_t *b = t->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > BLOCK_BYTES ? n : BLOCK_BYTES;
        b = ddp_malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->next = t->blocks;
        b->used = 0;
        b->cap = cap;
        t->blocks = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

static char *arena_strndup(ddp__stree_t *t, const char *s, size_t n)
{
    char *p = arena_alloc(t, n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

static ddp__snode_t *new_node(ddp__stree_t *t, ddp__snode_kind_t kind, int line, int column)
{
    if (t->nodes >= MAX_NODES) return NULL;
    ddp__snode_t *n = arena_alloc(t, sizeof *n);
    if (!n) return NULL;
    t->nodes++;
    n->kind = kind;
    n->line = line;
    n->column = column;
    return n;
}

void ddp__stree_free(ddp__stree_t *t)
{
    if (!t) return;
    ddp__arena_block_t *b = t->blocks;
    while (b) {
        ddp__arena_block_t *next = b->next;
        free(b);
        b = next;
    }
    memset(t, 0, sizeof *t);
}

/* Error for the whole document: path = origin. */
static int doc_error(ddp__stree_t *t, ddp_errinfo_t *ei, const char *origin, int line, int col,
                     int rc, const char *msg)
{
    ddp__stree_free(t);
    if (rc == DDP_ENOMEM) return ddp_errinfo_set(ei, rc, "out of memory reading the spec");
    ddp_errinfo_set(ei, rc, "%s", msg);
    ddp_errinfo_path(ei, "%s", origin);
    if (ei) {
        ei->line = line;
        ei->column = col;
    }
    return rc;
}

/* ---- YAML ---------------------------------------------------------------------------------- */

/* A collection whose end event has not come: its entries so far are scratch[base, used). */
typedef struct open_coll {
    ddp__snode_t *node;
    size_t base;
} open_coll_t;

/* A mapping's key in the duplicate-key set; map == NULL marks a free slot. */
typedef struct key_slot {
    const ddp__snode_t *map;
    const char *key;
} key_slot_t;

typedef struct yaml_ctx {
    ddp__stree_t *t;
    open_coll_t open[MAX_DEPTH + 1]; /* the open collections, root first */
    int depth;                       /* how many are open = the depth of the next node */
    ddp__sentry_t *scratch;          /* entries of the open collections, innermost last */
    size_t used, cap;
    key_slot_t *keys; /* every key read so far, open addressing, at most half full */
    size_t nkeys, keys_cap;
    int err_rc;
    int err_line, err_col;
    char err_msg[400];
} yaml_ctx_t;

/* Keeps the first error; returns its code. */
static int yaml_fail(yaml_ctx_t *c, yaml_mark_t at, int rc, const char *msg)
{
    if (!c->err_rc) {
        c->err_rc = rc;
        c->err_line = (int)at.line + 1;
        c->err_col = (int)at.column + 1;
        snprintf(c->err_msg, sizeof c->err_msg, "%s", msg);
    }
    return c->err_rc;
}

static ddp__snode_t *yaml_node(yaml_ctx_t *c, ddp__snode_kind_t kind, yaml_mark_t at)
{
    ddp__snode_t *n = new_node(c->t, kind, (int)at.line + 1, (int)at.column + 1);
    if (!n && c->t->nodes >= MAX_NODES)
        yaml_fail(c, at, DDP_ESPEC, "document too large (more than 100000 nodes)");
    else if (!n)
        yaml_fail(c, at, DDP_ENOMEM, "out of memory");
    return n;
}

static ddp__snode_t *yaml_scalar(yaml_ctx_t *c, const yaml_event_t *ev)
{
    ddp__snode_t *n = yaml_node(c, DDP__SN_SCALAR, ev->start_mark);
    if (!n) return NULL;
    const char *v = (const char *)ev->data.scalar.value;
    size_t len = ev->data.scalar.length;
    if (len > MAX_SCALAR) {
        yaml_fail(c, ev->start_mark, DDP_ESPEC, "scalar longer than 65536 bytes");
        return NULL;
    }
    if (strlen(v) != len) {
        yaml_fail(c, ev->start_mark, DDP_ESPEC, "NUL byte in a scalar");
        return NULL;
    }
    if (!(n->text = arena_strndup(c->t, v, len))) {
        yaml_fail(c, ev->start_mark, DDP_ENOMEM, "out of memory");
        return NULL;
    }
    int plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE ||
                ev->data.scalar.style == YAML_ANY_SCALAR_STYLE;
    n->stype = plain ? DDP__SC_PLAIN : DDP__SC_STRING;
    /* YAML 1.1 null: empty, ~, null (plain only). */
    if (plain && (len == 0 || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") ||
                  !strcmp(v, "NULL")))
        n->stype = DDP__SC_NULL;
    return n;
}

/* The next entry of the innermost open collection, zeroed; NULL when out of memory. */
static ddp__sentry_t *scratch_push(yaml_ctx_t *c)
{
    if (c->used == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 64;
        ddp__sentry_t *s = ddp_realloc(c->scratch, cap * sizeof *s);
        if (!s) return NULL;
        c->scratch = s;
        c->cap = cap;
    }
    ddp__sentry_t *e = &c->scratch[c->used++];
    memset(e, 0, sizeof *e);
    return e;
}

static size_t key_hash(const ddp__snode_t *map, const char *key)
{
    uint64_t h = 14695981039346656037ULL ^ (uint64_t)(uintptr_t)map;
    for (const unsigned char *s = (const unsigned char *)key; *s; s++)
        h = (h ^ *s) * 1099511628211ULL;
    h ^= h >> 31; /* FNV-1a's low bits see few of the input's: mix the high ones in */
    h *= 0x9e3779b97f4a7c15ULL;
    return (size_t)(h ^ (h >> 29));
}

/* Adds map's key to the set: 0, 1 when map already has it, or DDP_ENOMEM. A hash set rather than
 * a comparison with every earlier key of the mapping: 49,000 keys in one mapping (480 KB) took
 * 12 s that way. */
static int key_add(yaml_ctx_t *c, const ddp__snode_t *map, const char *key)
{
    if (2 * (c->nkeys + 1) > c->keys_cap) {
        size_t cap = c->keys_cap ? 2 * c->keys_cap : 256;
        key_slot_t *k = ddp_calloc(cap, sizeof *k);
        if (!k) return DDP_ENOMEM;
        for (size_t i = 0; i < c->keys_cap; i++) {
            if (!c->keys[i].map) continue;
            size_t j = key_hash(c->keys[i].map, c->keys[i].key) & (cap - 1);
            while (k[j].map) j = (j + 1) & (cap - 1);
            k[j] = c->keys[i];
        }
        free(c->keys);
        c->keys = k;
        c->keys_cap = cap;
    }
    size_t j = key_hash(map, key) & (c->keys_cap - 1);
    for (; c->keys[j].map; j = (j + 1) & (c->keys_cap - 1))
        if (c->keys[j].map == map && !strcmp(c->keys[j].key, key)) return 1;
    c->keys[j] = (key_slot_t){map, key};
    c->nkeys++;
    return 0;
}

static const yaml_char_t *event_anchor(const yaml_event_t *ev)
{
    switch (ev->type) {
    case YAML_SCALAR_EVENT: return ev->data.scalar.anchor;
    case YAML_SEQUENCE_START_EVENT: return ev->data.sequence_start.anchor;
    case YAML_MAPPING_START_EVENT: return ev->data.mapping_start.anchor;
    default: return NULL;
    }
}

/* A mapping's key: a scalar, new in its mapping; its entry waits for the value. */
static int yaml_key(yaml_ctx_t *c, const ddp__snode_t *map, const yaml_event_t *ev)
{
    if (ev->type != YAML_SCALAR_EVENT && ev->type != YAML_ALIAS_EVENT)
        return yaml_fail(c, ev->start_mark, DDP_ESPEC, "mapping keys must be scalars");
    if (ev->type == YAML_ALIAS_EVENT || event_anchor(ev))
        return yaml_fail(c, ev->start_mark, DDP_ESPEC, NO_ANCHORS);
    ddp__snode_t *k = yaml_scalar(c, ev);
    if (!k) return c->err_rc;
    int rc = key_add(c, map, k->text);
    if (rc < 0) return yaml_fail(c, ev->start_mark, rc, "out of memory");
    if (rc) {
        char msg[200];
        snprintf(msg, sizeof msg, "duplicate key '%.100s'", k->text);
        return yaml_fail(c, ev->start_mark, DDP_ESPEC, msg);
    }
    ddp__sentry_t *e = scratch_push(c);
    if (!e) return yaml_fail(c, ev->start_mark, DDP_ENOMEM, "out of memory");
    e->key = k->text;
    e->key_line = k->line;
    e->key_column = k->column;
    return 0;
}

/* A node event (scalar, alias, sequence or mapping start): a key, or a value placed in the
 * innermost open collection (or the root), each limit checked before anything is kept. */
static int yaml_on_node(yaml_ctx_t *c, const yaml_event_t *ev)
{
    open_coll_t *top = c->depth ? &c->open[c->depth - 1] : NULL;
    if (top && top->node->kind == DDP__SN_MAP &&
        (c->used == top->base || c->scratch[c->used - 1].val))
        return yaml_key(c, top->node, ev);
    if (c->depth > MAX_DEPTH)
        return yaml_fail(c, ev->start_mark, DDP_ESPEC, "document nested too deeply");
    if (ev->type == YAML_ALIAS_EVENT || event_anchor(ev))
        return yaml_fail(c, ev->start_mark, DDP_ESPEC, NO_ANCHORS);
    ddp__snode_t *n;
    if (ev->type == YAML_SCALAR_EVENT)
        n = yaml_scalar(c, ev);
    else
        n = yaml_node(c, ev->type == YAML_MAPPING_START_EVENT ? DDP__SN_MAP : DDP__SN_SEQ,
                      ev->start_mark);
    if (!n) return c->err_rc;
    if (!top) {
        c->t->root = n;
    } else if (top->node->kind == DDP__SN_MAP) {
        c->scratch[c->used - 1].val = n;
    } else {
        ddp__sentry_t *e = scratch_push(c);
        if (!e) return yaml_fail(c, ev->start_mark, DDP_ENOMEM, "out of memory");
        e->val = n;
    }
    if (n->kind != DDP__SN_SCALAR) c->open[c->depth++] = (open_coll_t){n, c->used};
    return 0;
}

/* A sequence or mapping end: its entries move from the scratch into the arena. */
static int yaml_on_end(yaml_ctx_t *c, const yaml_event_t *ev)
{
    open_coll_t *o = &c->open[--c->depth];
    size_t count = c->used - o->base;
    if (count) {
        o->node->entries = arena_alloc(c->t, count * sizeof *o->node->entries);
        if (!o->node->entries) return yaml_fail(c, ev->start_mark, DDP_ENOMEM, "out of memory");
        memcpy(o->node->entries, &c->scratch[o->base], count * sizeof *o->node->entries);
    }
    o->node->n = count;
    c->used = o->base;
    return 0;
}

/* libyaml's error, with the mark of the problem. */
static int yaml_syntax_error(yaml_ctx_t *c, const yaml_parser_t *p)
{
    if (p->error == YAML_MEMORY_ERROR) return yaml_fail(c, p->problem_mark, DDP_ENOMEM, "");
    char msg[400];
    snprintf(msg, sizeof msg, "invalid YAML: %s%s%s", p->problem ? p->problem : "syntax error",
             p->context ? " " : "", p->context ? p->context : "");
    return yaml_fail(c, p->problem_mark, DDP_ESPEC, msg);
}

int ddp__stree_yaml(ddp__stree_t *t, const char *text, size_t len, const char *origin,
                    ddp_errinfo_t *ei)
{
    memset(t, 0, sizeof *t);
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) return doc_error(t, ei, origin, 0, 0, DDP_ENOMEM, "");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    yaml_ctx_t c = {.t = t};
    int docs = 0, done = 0;
    while (!done && !c.err_rc) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            yaml_syntax_error(&c, &parser);
            break;
        }
        switch (ev.type) {
        case YAML_DOCUMENT_START_EVENT:
            if (docs++) {
                /* A second document would be silently ignored: say so instead, where its root
                 * node starts (or its "---" when that node is not valid YAML). */
                yaml_event_t root;
                yaml_mark_t at = ev.start_mark;
                if (yaml_parser_parse(&parser, &root)) {
                    at = root.start_mark;
                    yaml_event_delete(&root);
                }
                yaml_fail(&c, at, DDP_ESPEC, "a spec is one YAML document; found a second");
            }
            break;
        case YAML_SCALAR_EVENT:
        case YAML_ALIAS_EVENT:
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT: yaml_on_node(&c, &ev); break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT: yaml_on_end(&c, &ev); break;
        case YAML_STREAM_END_EVENT: done = 1; break;
        default: break;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    free(c.scratch);
    free(c.keys);
    if (c.err_rc) return doc_error(t, ei, origin, c.err_line, c.err_col, c.err_rc, c.err_msg);
    return 0;
}

/* ---- JSON ---------------------------------------------------------------------------------- */

static ddp__snode_t *from_json(ddp__stree_t *t, json_t *j, int depth, int *rc)
{
    if (depth > MAX_DEPTH) {
        *rc = DDP_ESPEC;
        return NULL;
    }
    ddp__snode_t *n = NULL;
    char buf[64];
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        n = new_node(t, DDP__SN_MAP, 0, 0);
        if (!n) break;
        size_t count = json_object_size(j), i = 0;
        if (count && !(n->entries = arena_alloc(t, count * sizeof *n->entries))) return NULL;
        const char *key;
        json_t *v;
        json_object_foreach(j, key, v) {
            ddp__sentry_t *e = &n->entries[i++];
            if (!(e->key = arena_strndup(t, key, strlen(key)))) return NULL;
            if (!(e->val = from_json(t, v, depth + 1, rc))) return NULL;
        }
        n->n = count;
        return n;
    }
    case JSON_ARRAY: {
        n = new_node(t, DDP__SN_SEQ, 0, 0);
        if (!n) break;
        size_t count = json_array_size(j);
        if (count && !(n->entries = arena_alloc(t, count * sizeof *n->entries))) return NULL;
        for (size_t i = 0; i < count; i++)
            if (!(n->entries[i].val = from_json(t, json_array_get(j, i), depth + 1, rc)))
                return NULL;
        n->n = count;
        return n;
    }
    case JSON_STRING:
        if (!(n = new_node(t, DDP__SN_SCALAR, 0, 0))) break;
        n->stype = DDP__SC_STRING;
        if (strlen(json_string_value(j)) != json_string_length(j)) {
            *rc = DDP_ESPEC;
            return NULL;
        }
        n->text = arena_strndup(t, json_string_value(j), json_string_length(j));
        return n->text ? n : NULL;
    case JSON_INTEGER:
        if (!(n = new_node(t, DDP__SN_SCALAR, 0, 0))) break;
        n->stype = DDP__SC_INT;
        n->ival = json_integer_value(j);
        snprintf(buf, sizeof buf, "%lld", n->ival);
        n->text = arena_strndup(t, buf, strlen(buf));
        return n->text ? n : NULL;
    case JSON_REAL:
        if (!(n = new_node(t, DDP__SN_SCALAR, 0, 0))) break;
        n->stype = DDP__SC_REAL;
        n->rval = json_real_value(j);
        snprintf(buf, sizeof buf, "%.17g", n->rval);
        n->text = arena_strndup(t, buf, strlen(buf));
        return n->text ? n : NULL;
    case JSON_TRUE:
    case JSON_FALSE:
        if (!(n = new_node(t, DDP__SN_SCALAR, 0, 0))) break;
        n->stype = DDP__SC_BOOL;
        n->bval = json_is_true(j);
        n->text = n->bval ? "true" : "false";
        return n;
    case JSON_NULL:
        if (!(n = new_node(t, DDP__SN_SCALAR, 0, 0))) break;
        n->stype = DDP__SC_NULL;
        n->text = "null";
        return n;
    }
    if (t->nodes >= MAX_NODES) *rc = DDP_ESPEC;
    return NULL;
}

int ddp__stree_json(ddp__stree_t *t, const char *text, size_t len, const char *origin,
                    ddp_errinfo_t *ei)
{
    memset(t, 0, sizeof *t);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        char msg[300];
        snprintf(msg, sizeof msg, "invalid JSON: %s", jerr.text);
        return doc_error(t, ei, origin, jerr.line > 0 ? jerr.line : 0,
                         jerr.column > 0 ? jerr.column : 0, DDP_ESPEC, msg);
    }
    int rc = DDP_ENOMEM;
    t->root = from_json(t, root, 0, &rc);
    json_decref(root);
    if (!t->root) {
        return doc_error(t, ei, origin, 0, 0, rc,
                         "JSON document too deep or too large, or holds a NUL in a string");
    }
    return 0;
}

/* ---- lookup -------------------------------------------------------------------------------- */

const ddp__sentry_t *ddp__stree_find(const ddp__snode_t *root, const char *path)
{
    const ddp__snode_t *n = root;
    const ddp__sentry_t *found = NULL;
    while (n && *path) {
        size_t len = strcspn(path, ".[");
        if (n->kind != DDP__SN_MAP) return NULL;
        found = NULL;
        for (size_t i = 0; i < n->n; i++) {
            const char *k = n->entries[i].key;
            if (strlen(k) == len && !memcmp(k, path, len)) {
                found = &n->entries[i];
                break;
            }
        }
        if (!found) return NULL;
        n = found->val;
        path += len;
        while (*path == '[') { /* a list's entry: "eval[1]" */
            char *end;
            unsigned long k = strtoul(path + 1, &end, 10);
            if (*end != ']' || n->kind != DDP__SN_SEQ || k >= n->n) return NULL;
            found = &n->entries[k];
            n = found->val;
            path = end + 1;
        }
        if (*path != '.') break;
        path++;
    }
    return found;
}
