/* The node's GPUs, counted for ddpd's slots (see gpus.c). */
#ifndef DDP_DAEMON_GPUS_H
#define DDP_DAEMON_GPUS_H

/* GPUs the CUDA driver sees here (CUDA_VISIBLE_DEVICES applies); 0 without a driver or device.
 * Any thread; loads and unloads the driver library. */
int ddpd_gpu_count(void);

#endif
