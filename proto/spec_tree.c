/* Reading YAML and JSON documents into the spec tree (proto/spec_tree.h).
 *
 * Why not libcyaml's schema loader: libcyaml 1.3.1 (Debian 12) silently truncates integers
 * ("12abc" and "1.5" load as 12 and 1 for an INT field), and it reports where an error is only
 * as text in its log backtrace (and for an unknown key, the position of the enclosing mapping).
 * libyaml, the parser under libcyaml, gives a document tree with a mark on every node, so we
 * read that into one small tree that JSON (jansson) also fills, and validate both with one
 * table in spec.c: same struct, same errors, exact line and column, strict numbers.
 *
 * All memory comes from a bump arena in the tree (ddp_malloc'ed blocks), freed at once.
 */
#include "proto/spec_tree.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <yaml.h>

#include "common/alloc.h"

#define MAX_DEPTH 16
#define MAX_NODES 100000
#define BLOCK_BYTES 16384

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

typedef struct yaml_ctx {
    ddp__stree_t *t;
    yaml_document_t *doc;
    int err_rc;
    int err_line, err_col;
    char err_msg[256];
} yaml_ctx_t;

static ddp__snode_t *from_yaml(yaml_ctx_t *c, yaml_node_t *y, int depth);

static ddp__snode_t *yaml_fail(yaml_ctx_t *c, const yaml_node_t *y, int rc, const char *msg)
{
    if (!c->err_rc) {
        c->err_rc = rc;
        c->err_line = y ? (int)y->start_mark.line + 1 : 0;
        c->err_col = y ? (int)y->start_mark.column + 1 : 0;
        snprintf(c->err_msg, sizeof c->err_msg, "%s", msg);
    }
    return NULL;
}

static ddp__snode_t *yaml_scalar(yaml_ctx_t *c, yaml_node_t *y)
{
    ddp__snode_t *n = new_node(c->t, DDP__SN_SCALAR, (int)y->start_mark.line + 1,
                               (int)y->start_mark.column + 1);
    if (!n) {
        if (c->t->nodes >= MAX_NODES)
            return yaml_fail(c, y, DDP_ESPEC, "document too large (more than 100000 nodes)");
        return yaml_fail(c, y, DDP_ENOMEM, "out of memory");
    }
    const char *v = (const char *)y->data.scalar.value;
    size_t len = y->data.scalar.length;
    if (strlen(v) != len) return yaml_fail(c, y, DDP_ESPEC, "NUL byte in a scalar");
    n->text = arena_strndup(c->t, v, len);
    if (!n->text) return yaml_fail(c, y, DDP_ENOMEM, "out of memory");
    int plain = y->data.scalar.style == YAML_PLAIN_SCALAR_STYLE ||
                y->data.scalar.style == YAML_ANY_SCALAR_STYLE;
    n->stype = plain ? DDP__SC_PLAIN : DDP__SC_STRING;
    /* YAML 1.1 null: empty, ~, null (plain only). */
    if (plain && (len == 0 || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") ||
                  !strcmp(v, "NULL")))
        n->stype = DDP__SC_NULL;
    return n;
}

static ddp__snode_t *from_yaml(yaml_ctx_t *c, yaml_node_t *y, int depth)
{
    if (depth > MAX_DEPTH) return yaml_fail(c, y, DDP_ESPEC, "document nested too deeply");
    if (y->type == YAML_SCALAR_NODE) return yaml_scalar(c, y);
    int line = (int)y->start_mark.line + 1, col = (int)y->start_mark.column + 1;
    int is_map = y->type == YAML_MAPPING_NODE;
    ddp__snode_t *n = new_node(c->t, is_map ? DDP__SN_MAP : DDP__SN_SEQ, line, col);
    if (!n) {
        if (c->t->nodes >= MAX_NODES)
            return yaml_fail(c, y, DDP_ESPEC, "document too large (more than 100000 nodes)");
        return yaml_fail(c, y, DDP_ENOMEM, "out of memory");
    }
    size_t count = is_map ? (size_t)(y->data.mapping.pairs.top - y->data.mapping.pairs.start)
                          : (size_t)(y->data.sequence.items.top - y->data.sequence.items.start);
    if (count) {
        n->entries = arena_alloc(c->t, count * sizeof *n->entries);
        if (!n->entries) return yaml_fail(c, y, DDP_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < count; i++) {
        ddp__sentry_t *e = &n->entries[i];
        yaml_node_t *vy;
        if (is_map) {
            yaml_node_pair_t *p = &y->data.mapping.pairs.start[i];
            yaml_node_t *ky = yaml_document_get_node(c->doc, p->key);
            vy = yaml_document_get_node(c->doc, p->value);
            if (!ky || ky->type != YAML_SCALAR_NODE)
                return yaml_fail(c, ky ? ky : y, DDP_ESPEC, "mapping keys must be scalars");
            ddp__snode_t *k = yaml_scalar(c, ky);
            if (!k) return NULL;
            e->key = k->text;
            e->key_line = k->line;
            e->key_column = k->column;
            for (size_t j = 0; j < i; j++) {
                if (!strcmp(n->entries[j].key, e->key)) {
                    char msg[200];
                    snprintf(msg, sizeof msg, "duplicate key '%.100s'", e->key);
                    return yaml_fail(c, ky, DDP_ESPEC, msg);
                }
            }
        } else {
            vy = yaml_document_get_node(c->doc, y->data.sequence.items.start[i]);
        }
        if (!vy) return yaml_fail(c, y, DDP_ESPEC, "dangling node");
        e->val = from_yaml(c, vy, depth + 1);
        if (!e->val) return NULL;
    }
    n->n = count;
    return n;
}

int ddp__stree_yaml(ddp__stree_t *t, const char *text, size_t len, const char *origin,
                    ddp_errinfo_t *ei)
{
    memset(t, 0, sizeof *t);
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) return doc_error(t, ei, origin, 0, 0, DDP_ENOMEM, "");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        char msg[400];
        int line = (int)parser.problem_mark.line + 1, col = (int)parser.problem_mark.column + 1;
        if (parser.error == YAML_MEMORY_ERROR) {
            yaml_parser_delete(&parser);
            return doc_error(t, ei, origin, 0, 0, DDP_ENOMEM, "");
        }
        snprintf(msg, sizeof msg, "invalid YAML: %s%s%s",
                 parser.problem ? parser.problem : "syntax error",
                 parser.context ? " " : "", parser.context ? parser.context : "");
        yaml_parser_delete(&parser);
        return doc_error(t, ei, origin, line, col, DDP_ESPEC, msg);
    }
    yaml_ctx_t c = {.t = t, .doc = &doc};
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root) {
        t->root = from_yaml(&c, root, 0);
        if (!t->root && !c.err_rc) c.err_rc = DDP_ENOMEM;
    }
    yaml_document_delete(&doc);
    /* A second document would be silently ignored: say so instead. */
    if (!c.err_rc && yaml_parser_load(&parser, &doc)) {
        yaml_node_t *second = yaml_document_get_root_node(&doc);
        if (second) {
            c.err_rc = DDP_ESPEC;
            c.err_line = (int)second->start_mark.line + 1;
            c.err_col = (int)second->start_mark.column + 1;
            snprintf(c.err_msg, sizeof c.err_msg, "a spec is one YAML document; found a second");
        }
        yaml_document_delete(&doc);
    }
    yaml_parser_delete(&parser);
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
        const char *dot = strchr(path, '.');
        size_t len = dot ? (size_t)(dot - path) : strlen(path);
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
        path += len + (dot ? 1 : 0);
        if (!dot) break;
    }
    return found;
}
