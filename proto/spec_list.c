/* A list field of the job spec: a sequence of mappings (data.train's sources, data.val's sets,
 * eval's tasks), or where the list allows it a plain string that is one item (proto/spec_int.h,
 * ddp__slist_t).
 *
 * Each item is a mapping of the item table's keys, converted one by one like any field
 * (spec_value.c), on top of the list's item defaults. A required key must be given and not be
 * empty; a `name` must be a valid name and unlike the earlier items' names. Errors name the item
 * ("data.train[1].weight") at the key's or the value's line and column.
 *
 * Invariants: the count in the spec is reset before the list is read and set only once every
 * item is valid; at most the list's `max` items are read.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "proto/spec.h"
#include "proto/spec_int.h"
#include "proto/spec_tree.h"

typedef ddp__sfield_t field_t;
typedef ddp__spec_pstate_t pstate_t;

/* The keys of a list's items, for a message: "name, path, weight". */
static void item_keys(const ddp__slist_t *L, char *buf, size_t len)
{
    size_t k = 0;
    buf[0] = '\0';
    for (size_t j = 0; j < L->n_items && k < len; j++)
        k += (size_t)snprintf(buf + k, len - k, "%s%s", j ? ", " : "", L->items[j].path);
}

/* One item of a list: a mapping of its keys; required keys given and not empty, a name valid
 * and unlike the earlier items' (`k` of them, before it in `base`). */
static int set_item(pstate_t *ps, const ddp__slist_t *L, const char *path, char *base, int k,
                    const ddp__snode_t *n)
{
    char rb[96], keys[128], key_path[320];
    char *item = base + (size_t)k * L->item_size;
    item_keys(L, keys, sizeof keys);
    if (n->kind != DDP__SN_MAP)
        return ddp__spec_field_error(ps, path, n->line, n->column,
                                     "must be a mapping of %s, got %s", keys,
                                     ddp__spec_repr(n, rb, sizeof rb));
    memcpy(item, L->defaults, L->item_size);
    bool given[8] = {false};
    for (size_t e = 0; e < n->n; e++) {
        const ddp__sentry_t *en = &n->entries[e];
        snprintf(key_path, sizeof key_path, "%s.%.100s", path, en->key);
        size_t j = 0;
        while (j < L->n_items && strcmp(L->items[j].path, en->key)) j++;
        if (j == L->n_items)
            return ddp__spec_field_error(ps, key_path, en->key_line, en->key_column,
                                         "unknown key; allowed here: %s", keys);
        const field_t *f = &L->items[j];
        DDP_CHECK(ddp__spec_convert(ps, f, key_path, item + f->off, en->val));
        given[j] = true;
        if (f->type == DDP__FT_STR && f->required && !item[f->off])
            return ddp__spec_field_error(ps, key_path, en->val->line, en->val->column,
                                         "must not be empty");
        if (strcmp(f->path, "name")) continue;
        if (!ddp_spec_name_ok(item + f->off))
            return ddp__spec_field_error(
                ps, key_path, en->val->line, en->val->column,
                "must use only letters, digits, '-', '_' and '.', and not start "
                "with '-' or '.', got \"%s\"",
                item + f->off);
        for (int o = 0; o < k; o++)
            if (!strcmp(base + (size_t)o * L->item_size + f->off, item + f->off))
                return ddp__spec_field_error(ps, key_path, en->val->line, en->val->column,
                                             "\"%s\" is the name of entry %d too: names are unique",
                                             item + f->off, o);
    }
    for (size_t j = 0; j < L->n_items; j++)
        if (L->items[j].required && !given[j])
            return ddp__spec_field_error(ps, path, n->line, n->column,
                                         "needs `%s` (an entry is %s)", L->items[j].path, keys);
    return 0;
}

/* A list field: a sequence of items, or (where the list allows) a string that is one item. */
int ddp__spec_set_list(pstate_t *ps, const field_t *f, const char *path, char *dst,
                       const ddp__snode_t *n)
{
    const ddp__slist_t *L = f->list;
    int *count = (int *)((char *)ps->spec + L->count_off);
    char rb[96], keys[128], item_path[200];
    *count = 0;
    memset(dst, 0, f->size);
    item_keys(L, keys, sizeof keys);
    if (L->from_string && n->kind == DDP__SN_SCALAR) {
        const char *text;
        size_t j = 0;
        while (strcmp(L->items[j].path, L->from_string)) j++;
        if (!ddp__spec_to_text(n, &text))
            return ddp__spec_field_error(ps, path, n->line, n->column,
                                         "must be a string or a list of mappings (%s), got %s",
                                         keys, ddp__spec_repr(n, rb, sizeof rb));
        *(int *)((char *)ps->spec + L->listed_off) = 0;
        if (!text[0]) return 0; /* none */
        memcpy(dst, L->defaults, L->item_size);
        DDP_CHECK(ddp__spec_convert(ps, &L->items[j], path, dst + L->items[j].off, n));
        *count = 1;
        return 0;
    }
    if (n->kind == DDP__SN_SCALAR && n->stype == DDP__SC_NULL) return 0; /* `eval:` alone */
    if (n->kind != DDP__SN_SEQ)
        return ddp__spec_field_error(
            ps, path, n->line, n->column, "must be %sa list of mappings (%s), got %s",
            L->from_string ? "a string or " : "", keys, ddp__spec_repr(n, rb, sizeof rb));
    if (n->n > (size_t)L->max)
        return ddp__spec_field_error(ps, path, n->line, n->column,
                                     "must have at most %d entries, got %zu", L->max, n->n);
    if (L->from_string) *(int *)((char *)ps->spec + L->listed_off) = 1;
    for (size_t k = 0; k < n->n; k++) {
        snprintf(item_path, sizeof item_path, "%s[%zu]", path, k);
        DDP_CHECK(set_item(ps, L, item_path, dst, (int)k, n->entries[k].val));
    }
    *count = (int)n->n;
    return 0;
}
