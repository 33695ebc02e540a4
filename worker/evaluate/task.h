/* A multiple-choice task: a JSONL file of rows, each a context, its choices and the index of the
 * right one, read as lm-evaluation-harness builds its requests.
 *
 * Two row shapes (fields beyond these are ignored):
 *   HellaSwag's own:  {"activity_label", "ctx_a", "ctx_b", "endings": [...], "label"}
 *                     context = preprocess(activity_label + ": " + ctx_a + " " +
 *                     capitalize(ctx_b)), choices = preprocess(ending) (the harness's
 *                     hellaswag/utils.py, ddp_mc_preprocess)
 *   generic:          {"context", "choices": [...], "label"}, taken as they are
 * label: an integer or a string of digits (HF's hellaswag), 0 <= label < the number of choices.
 * A row with "endings" is HellaSwag's; any other must have "context" and "choices". Blank lines
 * are skipped. Every refusal names the file, the line (ei->path, ei->line) and the field.
 *
 * Pure host code with no state: any thread.
 */
#ifndef DDP_WORKER_EVALUATE_TASK_H
#define DDP_WORKER_EVALUATE_TASK_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define DDP_MC_MAX_CHOICES 64
#define DDP_MC_MAX_DELIM 16 /* a target_delimiter's bytes, its NUL included */

/* One row. Strings are UTF-8, NUL-terminated, owned by the task. */
typedef struct ddp_mc_example {
    char *context;  /* the query, without the target delimiter */
    char **choices; /* [n_choices], each without the " " that precedes it in the continuation */
    int n_choices;  /* 1..DDP_MC_MAX_CHOICES */
    int label;      /* the right choice */
    long line;      /* 1-based line of the file */
} ddp_mc_example_t;

typedef struct ddp_mc_task {
    ddp_mc_example_t *ex; /* [n] */
    size_t n;
    char delim[DDP_MC_MAX_DELIM]; /* the harness's target_delimiter: before each choice */
} ddp_mc_task_t;

/* Reads the first `limit` rows of JSONL file `path` (limit 0: all) into t (zeroed first), to be
 * scored with delim before each choice (the harness's target_delimiter: " " by default; at most
 * DDP_MC_MAX_DELIM - 1 bytes, the caller checks). Returns 0; -errno (cannot read; ei names the file); DDP_EFORMAT for a bad row (ei: the file,
 * the line, the message naming the field: "label: 4 is out of range for 4 choices");
 * DDP_ENOMEM. Free with ddp_mc_task_close (also after an error). */
int ddp_mc_task_load(ddp_mc_task_t *t, const char *path, long limit, const char *delim,
                     ddp_errinfo_t *ei);
/* Bytes a loaded task of file `path` may hold (the memory budget's share): its rows' text twice
 * (the file read whole, and the strings kept) plus a row's bookkeeping per line; 0 when it
 * cannot be read (the load then fails with the reason). */
int64_t ddp_mc_task_bytes(const char *path);
/* Frees what t holds. NULL-safe. */
void ddp_mc_task_close(ddp_mc_task_t *t);

/* Parses one row text[0, len) (a JSON object) into ex (zeroed first; free it with
 * ddp_mc_example_free). Errors as ddp_mc_task_load's, naming `path` and `line`. */
int ddp_mc_parse_row(const char *text, size_t len, const char *path, long line,
                     ddp_mc_example_t *ex, ddp_errinfo_t *ei);
void ddp_mc_example_free(ddp_mc_example_t *ex); /* NULL-safe */

/* A row's error, for the scorer too: DDP_EFORMAT with the message, ei's path `path` and the
 * row's line (column 1). Returns DDP_EFORMAT; ei may be NULL. */
int ddp_mc_row_error(ddp_errinfo_t *ei, const char *path, long line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The harness's HellaSwag preprocess of a string, in a new buffer (NULL: out of memory): strip
 * (Python's whitespace), " [title]" -> ". ", every "[...]" without a line break inside removed
 * (the non-greedy r"\[.*?\]"), then "  " -> " " in one left-to-right pass. */
char *ddp_mc_preprocess(const char *s);
/* Python's str.capitalize in a new buffer (NULL: out of memory): the first code point in title
 * case, every other lowered (Unicode, via utf8proc). s must be valid UTF-8. */
char *ddp_mc_capitalize(const char *s);
/* Code points of UTF-8 text s: Python's len() of the string (acc_norm's divisor). */
size_t ddp_mc_codepoints(const char *s);
/* Bytes of Python's whitespace (str.isspace) at the end of s[0, len). */
size_t ddp_mc_trailing_space(const char *s, size_t len);

#endif
