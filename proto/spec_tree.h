/* Internal to proto/: the document tree that the job-spec validator walks.
 *
 * YAML (libyaml's event API) and JSON (jansson) are both read into this one tree of mappings,
 * sequences and scalars, so the spec is validated by one piece of code and both formats give the
 * same struct and the same errors. Every node carries its 1-based line and column (0 = unknown).
 *
 * Invariants: all memory of a tree (nodes, entries, texts) lives in the tree's arena and goes
 * with ddp__stree_free; a tree is immutable once built; nesting depth, node count and (YAML)
 * scalar length are bounded, a YAML tree holds no anchors or aliases, and map keys are unique.
 */
#ifndef DDP_PROTO_SPEC_TREE_H
#define DDP_PROTO_SPEC_TREE_H

#include <stddef.h>

#include "common/err.h"

typedef enum { DDP__SN_MAP, DDP__SN_SEQ, DDP__SN_SCALAR } ddp__snode_kind_t;

/* What a scalar is. YAML plain scalars are untyped text that the validator interprets by the
 * field's type; quoted YAML scalars and JSON strings are strings; JSON numbers, booleans and null
 * keep the type JSON gave them. */
typedef enum {
    DDP__SC_PLAIN,
    DDP__SC_STRING,
    DDP__SC_INT,
    DDP__SC_REAL,
    DDP__SC_BOOL,
    DDP__SC_NULL,
} ddp__scalar_t;

typedef struct ddp__snode ddp__snode_t;

typedef struct ddp__sentry {
    const char *key; /* NULL in sequences */
    int key_line, key_column;
    ddp__snode_t *val;
} ddp__sentry_t;

struct ddp__snode {
    ddp__snode_kind_t kind;
    ddp__scalar_t stype; /* scalars only */
    const char *text;    /* scalars: the text (JSON numbers printed exactly, bools true/false) */
    long long ival;      /* DDP__SC_INT */
    double rval;         /* DDP__SC_REAL */
    int bval;            /* DDP__SC_BOOL */
    int line, column;    /* 1-based; 0 = unknown */
    size_t n;            /* entries of a map or sequence */
    ddp__sentry_t *entries;
};

typedef struct ddp__arena_block ddp__arena_block_t;

typedef struct ddp__stree {
    ddp__snode_t *root; /* NULL for an empty YAML document */
    ddp__arena_block_t *blocks;
    size_t nodes;
} ddp__stree_t;

/* Reads YAML text (one document) into t (t is initialised here); the limits are applied while
 * parsing, so a hostile document is refused in time linear in the part of it read. Returns 0,
 * DDP_ESPEC with ei (path = origin, line, column) for a syntax error, a second document, an
 * over-deep or over-large document, a scalar over 64 KiB or with a NUL, an anchor or alias, a
 * non-scalar or duplicate key; or DDP_ENOMEM. On error t holds nothing to free, but
 * ddp__stree_free is still safe. Any thread; ei may be NULL. */
int ddp__stree_yaml(ddp__stree_t *t, const char *text, size_t len, const char *origin,
                    ddp_errinfo_t *ei);
/* Reads a JSON object into t with jansson (duplicate keys rejected). Positions of values are not
 * known to jansson: they are 0 here (see ddp__stree_locate). Same returns as ddp__stree_yaml. */
int ddp__stree_json(ddp__stree_t *t, const char *text, size_t len, const char *origin,
                    ddp_errinfo_t *ei);
/* Frees everything t holds. NULL-safe; safe on a zeroed tree. */
void ddp__stree_free(ddp__stree_t *t);

/* Finds the node at a dotted path ("train.lr", with list entries indexed: "eval[1].path") under
 * root. Returns the entry (key and its mark, value node; a list entry has no key) or NULL. */
const ddp__sentry_t *ddp__stree_find(const ddp__snode_t *root, const char *path);

#endif
