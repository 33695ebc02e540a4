/* Internal to proto/: the job spec's field table and presets, for the files that read them, and
 * the state of one document being validated, for the files that validate it.
 *
 * The table (ddp__spec_fields, defined in spec.c) lists every leaf field of a spec once: its
 * path, type, place in ddp_spec_t, allowed range or choices, and its documentation. spec.c
 * validates documents with it; spec_out.c writes JSON and the reference (docs/spec.md,
 * `ddp-worker --spec-reference`) from it, so the reference cannot disagree with the validator.
 *
 * Validation (the second half of this header): ddp_spec_parse (spec.c) reads the document into
 * the tree of spec_tree.h and walks it against the table; spec_value.c converts each value given
 * into the spec, and a list field's value goes to spec_list.c, which converts each item's keys
 * through spec_value.c again (an item's keys are never lists, so this recursion is one level
 * deep). After the walk, spec_rules.c applies the defaults that depend on other fields and checks
 * the rules that tie fields together. spec.c owns the parse state and formats every error.
 *
 * Invariants: the table and the presets are constant; every field has a doc string, and a
 * `dflt` text exactly where its default depends on other fields (else the reference prints the
 * value ddp_spec_defaults gives). The validating functions below (ddp__spec_field_index aside)
 * return 0 or DDP_ESPEC; on DDP_ESPEC they have filled ps->ei (when not NULL) with the field's
 * path, the line and column (0 where unknown) and the message, and the parse stops at that first
 * error. A parse runs on its caller's thread and keeps no state between parses.
 */
#ifndef DDP_PROTO_SPEC_INT_H
#define DDP_PROTO_SPEC_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "proto/spec.h"
#include "proto/spec_tree.h"

typedef enum {
    DDP__FT_INT,    /* int or long (by size), range [lo, hi] */
    DDP__FT_NUM,    /* double, range with optional open ends */
    DDP__FT_BOOL,   /* int 0/1 */
    DDP__FT_STR,    /* char[size], any text up to size-1 bytes */
    DDP__FT_ENUM,   /* int index into choices */
    DDP__FT_CHOICE, /* char[size], one of choices */
    DDP__FT_SEED,   /* uint64_t, 0..INT64_MAX */
    DDP__FT_PAIR,   /* two consecutive doubles given as a sequence [a, b], each in [lo, hi) */
    DDP__FT_PRESET, /* char[size], a preset name */
    DDP__FT_BYTES,  /* int64_t bytes >= 0: an integer, or a string with a unit ("8GiB", "512MB") */
    DDP__FT_LIST,   /* a sequence of mappings, each an item of `list` (or a string: one item) */
} ddp__ftype_t;

/* An upper bound at or above this means none. */
#define DDP__SPEC_NO_MAX 1e15

typedef struct ddp__slist ddp__slist_t;

typedef struct ddp__sfield {
    const char *path; /* "section.key"; in a list's item table, the item's key */
    ddp__ftype_t type;
    size_t off, size;
    double lo, hi; /* hi >= DDP__SPEC_NO_MAX means no upper bound */
    bool lo_open, hi_open;
    const char *const *choices;
    const char *dflt; /* the default in words where it depends on other fields; else NULL */
    const char *doc;  /* what the field means, for the reference (Markdown, no '|') */
    const ddp__slist_t *list; /* DDP__FT_LIST: what its items are */
    bool required;            /* a list item's key that every item must give */
    bool quiet; /* left out of the JSON at its default: an older build, which refuses unknown
                 * keys (a peer's during a rolling upgrade), still reads a spec that leaves the
                 * field alone */
} ddp__sfield_t;

/* A list field's items: structs of item_size bytes from the field's offset on, at most max, with
 * their count in an int of ddp_spec_t. A plain string is one item whose `from_string` key it
 * gives (the others at their defaults), and then `listed_off` (an int) stays 0 so the JSON
 * writes a string back; "" is no item. */
struct ddp__slist {
    const ddp__sfield_t *items; /* offsets within an item */
    size_t n_items, item_size;
    int max;
    size_t count_off;
    const char *from_string; /* NULL: only a list */
    size_t listed_off;
    const void *defaults;    /* an item's defaults */
};

extern const ddp__sfield_t ddp__spec_fields[];
extern const size_t ddp__spec_n_fields;

typedef struct ddp__spec_preset {
    const char *name;
    ddp_model_cfg_t cfg;
} ddp__spec_preset_t;

extern const ddp__spec_preset_t ddp__spec_presets[];
extern const size_t ddp__spec_n_presets;

/* ---- validating a document ------------------------------------------------------------------ */

/* At least the rows of the field table (spec.c checks it when it compiles). */
#define DDP__SPEC_MAX_FIELDS 128

/* A parse: the spec being filled (defaults first), where errors go (NULL: none), the document's
 * name for errors about the whole document, and which fields of the table (by index) were given
 * and where their values are. */
typedef struct ddp__spec_pstate {
    ddp_spec_t *spec;
    ddp_errinfo_t *ei;
    const char *origin;
    bool set[DDP__SPEC_MAX_FIELDS];
    int line[DDP__SPEC_MAX_FIELDS], column[DDP__SPEC_MAX_FIELDS]; /* value marks of the fields
                                                                   * that were given */
} ddp__spec_pstate_t;

/* ---- spec.c: the table and the errors ---- */

/* The index of the table's row for `path` ("train.lr"); asserts that there is one (the callers
 * name fields in code, never from the document). */
int ddp__spec_field_index(const char *path);

/* Fails the parse for the field `path` at line:column with the formatted message. Returns
 * DDP_ESPEC. */
int ddp__spec_field_error(ddp__spec_pstate_t *ps, const char *path, int line, int column,
                          const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* How a value is shown in a message: strings quoted, containers by kind ("a mapping"). Returns
 * buf or a constant string. */
const char *ddp__spec_repr(const ddp__snode_t *n, char *buf, size_t len);

/* Writes the NULL-terminated choices into buf as "a, b, c" (cut at len). */
void ddp__spec_list_choices(const char *const *ch, char *buf, size_t len);

/* ---- spec_value.c: one value ---- */

/* Converts the value n of field f (named `path` in errors, at the value's mark) into dst, a
 * member of ps->spec or of a list's item. A preset also sets ps->spec->model; a list field
 * goes to ddp__spec_set_list. Returns 0 or DDP_ESPEC. */
int ddp__spec_convert(ddp__spec_pstate_t *ps, const ddp__sfield_t *f, const char *path,
                      char *dst, const ddp__snode_t *n);

/* The text of a string field's value: any scalar but a boolean (YAML `name: 123` is the name
 * "123"); null is "". Returns false for anything else, leaving *out alone. */
bool ddp__spec_to_text(const ddp__snode_t *n, const char **out);

/* ---- spec_list.c: a list field ---- */

/* Converts the value n of the list field f (named `path`) into dst and its count (and whether it
 * was a list) into ps->spec: a sequence of mappings, or where the list allows, a string that is
 * one item. Returns 0 or DDP_ESPEC. */
int ddp__spec_set_list(ddp__spec_pstate_t *ps, const ddp__sfield_t *f, const char *path,
                       char *dst, const ddp__snode_t *n);

/* ---- spec_rules.c: after the walk ---- */

/* Applies the defaults that depend on other fields and checks the rules between fields, in
 * ps->spec as the walk of `root` left it. Returns 0 or DDP_ESPEC. */
int ddp__spec_finish(ddp__spec_pstate_t *ps, const ddp__snode_t *root);

#endif
