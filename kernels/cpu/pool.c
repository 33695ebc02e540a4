/* The CPU backend's thread pool: `threads` compute threads (the caller plus threads - 1
 * workers) that run the tasks of one parallel call, then sleep on a condition variable.
 *
 * Why hand-written rather than OpenMP or OpenBLAS's own threads: a worker process runs a
 * communication thread and a data-loader thread beside its compute threads on machines with
 * few cores. OpenMP runtimes and OpenBLAS's pthread server busy-wait for a while after each
 * parallel region, and two such pools (BLAS and the op loops) spin against each other and
 * against those threads. Here BLAS runs single-threaded inside our tasks, so one pool serves
 * matmuls and element loops alike, and an idle worker blocks in pthread_cond_wait: it never
 * spins.
 *
 * Invariants: tasks are claimed under the mutex, reading the current call's fn/arg at claim
 * time, so a worker that wakes late can never run a task of a finished call; the caller returns
 * only after every claimed task has finished (done == ntasks). Task order among threads is
 * dynamic, so results must depend only on the task index (see cpu.h).
 */
#include "kernels/cpu/cpu.h"

#include <errno.h>
#include <pthread.h>

#include "common/alloc.h"
#include "common/err.h"

/* This thread's index in the pool that started it (0: a thread that calls ddp__pool_run). */
static _Thread_local int self_index;

/* A worker's start: the pool and the index it takes. */
typedef struct {
    ddp__pool_t *pool;
    int index;
} worker_arg_t;

struct ddp__pool {
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* workers wait here for tasks */
    pthread_cond_t done_cv; /* the caller waits here for the last task */
    ddp__task_fn fn;
    void *arg;
    long ntasks; /* tasks of the current call */
    long next;   /* next unclaimed task */
    long done;   /* finished tasks */
    int stop;
    int threads;
    int nworkers; /* workers started */
    pthread_t *workers;
    worker_arg_t *args; /* one per worker */
};

/* Claims and runs tasks until none is left; called and returns with mu held. */
static void drain(ddp__pool_t *p)
{
    while (p->next < p->ntasks) {
        long task = p->next++;
        ddp__task_fn fn = p->fn;
        void *arg = p->arg;
        pthread_mutex_unlock(&p->mu);
        fn(arg, task);
        pthread_mutex_lock(&p->mu);
        if (++p->done == p->ntasks) pthread_cond_signal(&p->done_cv);
    }
}

static void *worker_main(void *varg)
{
    const worker_arg_t *arg = varg;
    ddp__pool_t *p = arg->pool;
    self_index = arg->index;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        drain(p);
        if (!p->stop) pthread_cond_wait(&p->work_cv, &p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int ddp__pool_new(ddp__pool_t **out, int threads)
{
    *out = NULL;
    if (threads < 1) return DDP_EINVAL;
    ddp__pool_t *p = ddp_calloc(1, sizeof(*p));
    if (!p) return DDP_ENOMEM;
    p->threads = threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    if (threads > 1) {
        p->workers = ddp_calloc((size_t)threads - 1, sizeof(pthread_t));
        p->args = ddp_calloc((size_t)threads - 1, sizeof(worker_arg_t));
        if (!p->workers || !p->args) {
            ddp__pool_free(p);
            return DDP_ENOMEM;
        }
    }
    for (int i = 0; i < threads - 1; i++) {
        p->args[i] = (worker_arg_t){.pool = p, .index = i + 1};
        int rc = pthread_create(&p->workers[i], NULL, worker_main, &p->args[i]);
        if (rc) {
            ddp__pool_free(p);
            return -rc;
        }
        p->nworkers++;
    }
    *out = p;
    return 0;
}

void ddp__pool_free(ddp__pool_t *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nworkers; i++) pthread_join(p->workers[i], NULL);
    pthread_cond_destroy(&p->done_cv);
    pthread_cond_destroy(&p->work_cv);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    free(p->args);
    free(p);
}

void ddp__pool_run(ddp__pool_t *p, long ntasks, ddp__task_fn fn, void *arg)
{
    if (ntasks <= 0) return;
    if (ntasks == 1 || p->nworkers == 0) {
        for (long i = 0; i < ntasks; i++) fn(arg, i);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->ntasks = ntasks;
    p->next = 0;
    p->done = 0;
    /* Wake only as many workers as there are tasks beyond the caller's first. */
    if (ntasks - 1 >= p->nworkers)
        pthread_cond_broadcast(&p->work_cv);
    else
        for (long i = 0; i < ntasks - 1; i++) pthread_cond_signal(&p->work_cv);
    drain(p);
    while (p->done < p->ntasks) pthread_cond_wait(&p->done_cv, &p->mu);
    p->ntasks = 0;
    p->next = 0;
    p->fn = NULL;
    p->arg = NULL;
    pthread_mutex_unlock(&p->mu);
}

int ddp__pool_threads(const ddp__pool_t *p) { return p->threads; }

int ddp__pool_self(void) { return self_index; }
