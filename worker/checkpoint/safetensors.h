/* safetensors: the format codec (writer and validating reader), free of training logic.
 *
 * It conceptually belongs to proto/ (formats that cross a disk boundary) and may move there; it
 * depends only on common/, jansson and common/crc32c.h.
 *
 * The format (https://github.com/huggingface/safetensors, "Format"):
 *   8 bytes   N, unsigned little-endian: the header's length
 *   N bytes   JSON object: {"__metadata__": {str: str}?, "<name>": {"dtype": "F32", "shape": [..],
 *             "data_offsets": [begin, end]}, ...}; offsets are relative to the first byte after
 *             the header; this writer pads the header with spaces to a multiple of 8 (the
 *             checkpoint saver: so that the data starts at a multiple of 4096)
 *   data      the tensors, contiguous, row-major, little-endian, in header order; no gaps, no
 *             overlaps, no trailing bytes
 *
 * Reading maps the file (mmap, no MAP_POPULATE) and validates everything before a tensor is
 * handed out: header length against the file size, JSON (UTF-8, no duplicate names), dtype,
 * shape, offsets inside the data, contiguity, shape × dtype size == end − begin, and metadata
 * values being strings. Every error names the file, the tensor and the byte offset in the file.
 */
#ifndef DDP_WORKER_CHECKPOINT_SAFETENSORS_H
#define DDP_WORKER_CHECKPOINT_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define DDP_ST_MAX_DIMS 8
#define DDP_ST_MAX_HEADER (100u * 1000u * 1000u) /* the reference implementation's limit */

/* X(name, element size in bytes) */
#define DDP_ST_DTYPE_LIST(X)                                                                 \
    X(BOOL, 1)                                                                               \
    X(U8, 1)                                                                                 \
    X(I8, 1)                                                                                 \
    X(F8_E5M2, 1)                                                                            \
    X(F8_E4M3, 1)                                                                            \
    X(I16, 2)                                                                                \
    X(U16, 2)                                                                                \
    X(F16, 2)                                                                                \
    X(BF16, 2)                                                                               \
    X(I32, 4)                                                                                \
    X(U32, 4)                                                                                \
    X(F32, 4)                                                                                \
    X(F64, 8)                                                                                \
    X(I64, 8)                                                                                \
    X(U64, 8)

typedef enum {
    DDP_ST_INVALID = 0,
#define DDP__ST_DT_ENUM(name, size) DDP_ST_##name,
    DDP_ST_DTYPE_LIST(DDP__ST_DT_ENUM)
#undef DDP__ST_DT_ENUM
} ddp_st_dtype_t;

/* One tensor: a description plus where its bytes are. For writing, `data` is the source; a
 * reader's tensors point into the mapping (read-only, valid until ddp_st_close). */
typedef struct ddp_st_tensor {
    const char *name;
    ddp_st_dtype_t dtype;
    int ndim;
    int64_t shape[DDP_ST_MAX_DIMS];
    const void *data;
    uint64_t nbytes;
} ddp_st_tensor_t;

/* Name as written in files ("F32"), or NULL for an invalid value. Any thread. */
const char *ddp_st_dtype_name(ddp_st_dtype_t dt);
/* Parses a dtype name; DDP_ST_INVALID if unknown. Any thread. */
ddp_st_dtype_t ddp_st_dtype_parse(const char *s);
/* Bytes per element, 0 for an invalid value. Any thread. */
size_t ddp_st_dtype_size(ddp_st_dtype_t dt);
/* Elements × element size of a description, in *out. DDP_EINVAL on a negative dimension, too
 * many dimensions or overflow. Any thread. */
int ddp_st_tensor_bytes(ddp_st_dtype_t dt, int ndim, const int64_t *shape, uint64_t *out);

/* ---- writing ---- */

/* Builds the 8-byte length and the space-padded JSON header for tensors t[0..n) laid out in that
 * order (data_offsets are the running sum of their nbytes, which must equal shape × dtype size),
 * with `meta` (NULL, or nmeta key/value pairs: meta[2i] key, meta[2i+1] value) as __metadata__.
 * On success *out is a ddp_malloc'd buffer of *out_len bytes (8 + N) that the caller frees.
 * Returns 0, DDP_EINVAL (inconsistent description, duplicate or empty name), DDP_ENOMEM.
 * Any thread. */
int ddp_st_header_build(const ddp_st_tensor_t *t, size_t n, const char *const *meta, size_t nmeta,
                        char **out, size_t *out_len, ddp_errinfo_t *ei);

/* The same, padding the header with spaces so that the data starts at a multiple of `align`
 * bytes from the file's start (align: a multiple of 8; 4096 lets the data be written with
 * O_DIRECT straight from page-aligned memory). DDP_EINVAL for another align. Any thread. */
int ddp_st_header_build_aligned(const ddp_st_tensor_t *t, size_t n, const char *const *meta,
                                size_t nmeta, size_t align, char **out, size_t *out_len,
                                ddp_errinfo_t *ei);

/* Writes a complete safetensors file to `fd` at its current position: the header, then every
 * tensor's bytes from its `data`. When `crc` is not NULL it is extended (ddp_crc32c_update) over
 * every byte written, computed chunk by chunk just before each chunk is written. When
 * `hint_writeback` is true, writeback of each chunk is started as soon as it is written
 * (sync_file_range), so a final fsync has little left to do. `path` only names the file in
 * errors. Does not fsync or close. Returns 0 or a negative error (-errno of write, DDP_EINVAL,
 * DDP_ENOMEM). Any thread. */
int ddp_st_write_fd(int fd, const char *path, const ddp_st_tensor_t *t, size_t n,
                    const char *const *meta, size_t nmeta, bool hint_writeback, uint32_t *crc,
                    uint64_t *bytes_written, ddp_errinfo_t *ei);

/* Creates (or replaces) `path` and writes the file as ddp_st_write_fd does, then fsyncs and
 * closes it. Returns 0 or a negative error. Any thread. */
int ddp_st_write_file(const char *path, const ddp_st_tensor_t *t, size_t n,
                      const char *const *meta, size_t nmeta, ddp_errinfo_t *ei);

/* ---- reading ---- */

typedef struct ddp_st_file ddp_st_file_t;

/* Maps and validates `path`. On success *out owns the mapping; free with ddp_st_close. Returns
 * 0, -errno (open/stat/mmap), DDP_EFORMAT (ei names the file, tensor and offset), DDP_ENOMEM.
 * The file must not be modified while open. Any thread; a handle is used by one thread. */
int ddp_st_open(const char *path, ddp_st_file_t **out, ddp_errinfo_t *ei);

/* Validates a safetensors image held in memory (buf[0..len)); `name` labels errors. On success
 * *out refers to buf (not copied; buf must outlive it) and is freed with ddp_st_close. Same
 * returns as ddp_st_open. Any thread. */
int ddp_st_parse(const void *buf, size_t len, const char *name, ddp_st_file_t **out,
                 ddp_errinfo_t *ei);

/* Unmaps and frees. NULL-safe. */
void ddp_st_close(ddp_st_file_t *f);

/* Number of tensors (metadata excluded). */
size_t ddp_st_count(const ddp_st_file_t *f);
/* i-th tensor in data order (ascending offsets), i < ddp_st_count. Valid until ddp_st_close. */
const ddp_st_tensor_t *ddp_st_get(const ddp_st_file_t *f, size_t i);
/* Tensor by name, or NULL. */
const ddp_st_tensor_t *ddp_st_find(const ddp_st_file_t *f, const char *name);
/* __metadata__ value for `key`, or NULL. Valid until ddp_st_close. */
const char *ddp_st_metadata(const ddp_st_file_t *f, const char *key);
/* The file's path (or parse name). */
const char *ddp_st_path(const ddp_st_file_t *f);
/* Byte offset in the file of the first data byte (8 + N). */
uint64_t ddp_st_data_start(const ddp_st_file_t *f);

/* Tells the kernel that bytes [p, p+n) of a tensor's mapping will not be read again soon, so
 * its pages leave this process's resident set (MADV_DONTNEED on the whole pages inside the
 * range; the file's page cache is unaffected). A no-op for ddp_st_parse images. */
void ddp_st_release(const ddp_st_file_t *f, const void *p, size_t n);

#endif
