/* TensorBoard event files: scalars written as tensorflow.Event records to
 * RUN_DIR/tb/events.out.tfevents.<seconds>.<host>, the file name and format TensorBoard's
 * reader (tensorboard.backend.event_processing) loads.
 *
 * Invariants: the first record of a file is Event{wall_time, file_version "brain.Event:2"};
 * every later record is Event{wall_time, step, summary{value{tag, simple_value}...}}; each
 * record is framed as TFRecord (length, masked CRC32C of the length, payload, masked CRC32C of
 * the payload) and written with one write(2), so a reader never sees half a record unless the
 * process died inside that call; under a cap, a record that does not fit is not written at all.
 * One writer per file; not thread-safe.
 */
#ifndef DDP_WORKER_OBSERVE_TB_EVENTS_H
#define DDP_WORKER_OBSERVE_TB_EVENTS_H

#include <stddef.h>
#include <stdint.h>

typedef struct ddp_tb ddp_tb_t;

typedef struct ddp_tb_scalar {
    const char *tag; /* "loss/train"; at most 255 bytes */
    float value;
} ddp_tb_scalar_t;

/* Creates run_dir/tb/ (mode 0755) and a new event file in it, and writes the file_version
 * record. `cap` (limits.tensorboard_bytes; 0 = none) bounds the bytes of all the event files in
 * run_dir/tb/ together, those that earlier runs left there included: a record that would cross
 * it is not written, so every file holds whole records only. Returns 0 with *out set, -EFBIG
 * when the file_version record would already cross the cap (no file is created), or -errno /
 * DDP_ENOMEM (*out NULL). Caller frees with ddp_tb_close. Any one thread. */
int ddp_tb_open(const char *run_dir, uint64_t cap, ddp_tb_t **out);

/* Appends one Event at `step` whose summary holds the n values (n >= 1; wall_time: seconds
 * since the epoch). Returns 0, DDP_EINVAL (n < 1, a tag too long), -EFBIG when the record would
 * cross the cap (nothing written; so is every later one), -errno from write(2). */
int ddp_tb_scalars(ddp_tb_t *tb, int64_t step, double wall_time, const ddp_tb_scalar_t *v, int n);

/* The path of the event file (owned by tb). */
const char *ddp_tb_path(const ddp_tb_t *tb);

/* Closes the file and frees tb. NULL-safe. */
void ddp_tb_close(ddp_tb_t *tb);

/* The TFRecord mask of a CRC32C (TensorFlow's crc32c::Mask): rotate right by 15, add
 * 0xa282ead8. Pure. */
uint32_t ddp__tb_mask_crc(uint32_t crc);

#endif
