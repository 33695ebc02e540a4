/* The trainer's files, internal to them: what one calls in another, always forward in the
 * order run -> setup -> generation -> step (tests/doors.py keeps it). The public API is
 * trainer.h.
 *
 *   setup.c       ddp_trainer_init / _close
 *   generation.c  joining and leaving a world, planning a state transfer, what the checkpoints
 *                 see of the trainer
 *   step.c        ddp_trainer_step, phase by phase; the deal of micro-batches, a state
 *                 transfer's start and finish, the replica check
 *
 * Training thread only.
 */
#ifndef DDP_WORKER_TRAINER_INT_H
#define DDP_WORKER_TRAINER_INT_H

#include "worker/trainer.h"

/* generation.c */
/* Forms the communicator of bs (none in a world of one) and takes this rank's place in it,
 * updating t->world; bs is freed. The last generation's communicator is shrunk into it when it
 * can be. */
int ddp__trainer_open_comm(ddp_trainer_t *t, ddp_coll_bootstrap_t *bs, ddp_errinfo_t *ei);
/* Everything that depends on the world, once the communicator exists (undone by
 * ddp_trainer_leave_world). */
int ddp__trainer_attach_world(ddp_trainer_t *t, ddp_errinfo_t *ei);
/* The generation asks for a state transfer (t->member.gen.sync): plans it, and with
 * ddp.state_transfer pause carries it out at once; *receivers gets how many ranks receive.
 * Collective. */
int ddp__trainer_plan_transfer(ddp_trainer_t *t, int *receivers, ddp_errinfo_t *ei);
/* After joining a generation (the first or a later one): rank 0 writes the line of a step that
 * committed without one (see generation.c). */
void ddp__trainer_log_missed_step(ddp_trainer_t *t);
/* What the checkpoints see of the trainer (saving/saving.h), at start and at each change of the
 * world. */
void ddp__trainer_checkpoint_view(ddp_trainer_t *t, ddp_saving_run_t *v);

/* step.c */
/* Which of a step's micro-batches this rank computes: those g with g mod world = rank (world:
 * the ranks that compute, all of them except in a step that carries a state transfer); restarts
 * the loader for them. world 0: none. */
int ddp__trainer_set_deal(ddp_trainer_t *t, int rank, int world);
/* Queues the transfer of the weights and both moments (an overlapped one: as its step begins). */
int ddp__trainer_start_transfer(ddp_trainer_t *t);
/* After the transfer's data arrived: checks the replicas, logs it and deals every rank its
 * micro-batches again. Collective. */
int ddp__trainer_finish_transfer(ddp_trainer_t *t, ddp_errinfo_t *ei);

#endif
