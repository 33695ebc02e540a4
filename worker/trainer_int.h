/* The trainer's phases, internal to its files (worker/train_*.c): what one of them calls in
 * another. The public API is train.h.
 *
 *   train_setup.c       ddp_trainer_init / _close; what the checkpoints see of the trainer
 *   train_generation.c  joining and leaving a world (generation), the state transfer
 *   train_step.c        ddp_trainer_step, phase by phase, and the step's vote
 *   train_validate.c    ddp_trainer_validate
 *   train_embedding.c   the embedding-gradient slots of a step
 *
 * Training thread only.
 */
#ifndef DDP_WORKER_TRAIN_INT_H
#define DDP_WORKER_TRAIN_INT_H

#include "worker/trainer.h"

/* train_generation.c */
/* Forms the communicator of bs (none in a world of one) and takes this rank's place in it; bs is
 * freed. The last generation's communicator is shrunk into it when it can be. */
int ddp__trainer_open_comm(ddp_trainer_t *t, ddp_coll_bootstrap_t *bs, ddp_errinfo_t *ei);
/* Everything that depends on the world, once the communicator exists (undone by
 * ddp_trainer_leave_world). */
int ddp__trainer_attach_world(ddp_trainer_t *t, ddp_errinfo_t *ei);
/* The generation asks for a state transfer (t->gen.sync): plans it, and with ddp.state_transfer
 * pause carries it out at once; *receivers gets how many ranks receive. Collective. */
int ddp__trainer_plan_transfer(ddp_trainer_t *t, int *receivers, ddp_errinfo_t *ei);
/* Queues the transfer of the weights and both moments (an overlapped one: as its step begins). */
int ddp__trainer_start_transfer(ddp_trainer_t *t);
/* After the transfer's data arrived: checks the replicas, logs it and deals every rank its
 * micro-batches again. Collective. */
int ddp__trainer_finish_transfer(ddp_trainer_t *t, ddp_errinfo_t *ei);

/* train_setup.c */
/* What the checkpoints see of the trainer (train_checkpoint.h), at start and at each change of
 * the world. */
void ddp__trainer_checkpoint_view(ddp_trainer_t *t, ddp_saving_run_t *v);


#endif
