/* Internal to proto/: the job spec's field table and presets, for the files that read them.
 *
 * The table (ddp__spec_fields, defined in spec.c) lists every leaf field of a spec once: its
 * path, type, place in ddp_spec_t, allowed range or choices, and its documentation. spec.c
 * validates documents with it; spec_out.c writes JSON and the reference (docs/spec.md,
 * `ddp-worker --spec-reference`) from it, so the reference cannot disagree with the validator.
 *
 * Invariants: the table and the presets are constant; every field has a doc string, and a
 * `dflt` text exactly where its default depends on other fields (else the reference prints the
 * value ddp_spec_defaults gives).
 */
#ifndef DDP_PROTO_SPEC_INT_H
#define DDP_PROTO_SPEC_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "proto/spec.h"

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

#endif
