/* The communication thread of the CPU backends: a FIFO of requests run one after another.
 *
 * Invariants: requests run in submission order; the caller's submit only links the request and
 * writes an eventfd (no allocation, no lock held across I/O); the thread sleeps in poll() on that
 * eventfd when the queue is empty, and backends poll it beside their own fds while an operation
 * runs, so abort and stop wake them. After the communicator has failed, queued requests complete
 * at once with its error.
 */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "collectives/coll_impl.h"
#include "collectives/flight.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

struct ddp__engine {
    ddp_coll_t *c;
    ddp__engine_run_fn run;
    pthread_t th;
    int efd;
    pthread_mutex_t qmu;
    ddp_coll_req_t *head, *tail;
    _Atomic int stop;
    int told_peers;
};

int ddp__engine_wakefd(ddp__engine_t *e) { return e->efd; }

void ddp__engine_wake(ddp__engine_t *e)
{
    uint64_t one = 1;
    ssize_t w = write(e->efd, &one, sizeof one);
    (void)w;
}

void ddp__engine_drain(ddp__engine_t *e)
{
    uint64_t v;
    ssize_t r = read(e->efd, &v, sizeof v);
    (void)r;
}

int ddp__engine_stopping(ddp__engine_t *e) { return atomic_load(&e->stop); }

static ddp_coll_req_t *pop(ddp__engine_t *e)
{
    pthread_mutex_lock(&e->qmu);
    ddp_coll_req_t *r = e->head;
    if (r) {
        e->head = r->qnext;
        if (!e->head) e->tail = NULL;
        r->qnext = NULL;
    }
    pthread_mutex_unlock(&e->qmu);
    return r;
}

static void *engine_main(void *arg)
{
    ddp__engine_t *e = arg;
    ddp_coll_t *c = e->c;
    for (;;) {
        int err = atomic_load(&c->err);
        if (err && !e->told_peers) {
            e->told_peers = 1;
            e->run(c, NULL);
        }
        ddp_coll_req_t *r = pop(e);
        if (r) {
            if (err) {
                ddp__coll_complete(c, r, err);
                continue;
            }
            atomic_store(&c->running_seq, r->seq);
            r->t_start = ddp_now_ns();
            ddp_flight_started(r->flight);
            int rc = e->run(c, r);
            r->t_end = ddp_now_ns();
            ddp_flight_finished(r->flight, rc < 0 ? rc : 0);
            if (rc == 0) ddp__coll_note_bw(c, r->bytes, r->t_end - r->t_start);
            atomic_store(&c->waiting_on, -1);
            ddp__coll_complete(c, r, rc < 0 ? rc : 0);
            continue;
        }
        if (atomic_load(&e->stop)) break;
        struct pollfd p = {.fd = e->efd, .events = POLLIN};
        int n = poll(&p, 1, -1);
        if (n > 0) ddp__engine_drain(e);
    }
    return NULL;
}

int ddp__engine_start(ddp__engine_t **out, ddp_coll_t *c, ddp__engine_run_fn run)
{
    ddp__engine_t *e = ddp_calloc(1, sizeof *e);
    if (!e) return DDP_ENOMEM;
    e->c = c;
    e->run = run;
    e->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (e->efd < 0) {
        int rc = -errno;
        free(e);
        return rc;
    }
    pthread_mutex_init(&e->qmu, NULL);
    int prc = pthread_create(&e->th, NULL, engine_main, e);
    if (prc) {
        close(e->efd);
        pthread_mutex_destroy(&e->qmu);
        free(e);
        return -prc;
    }
    *out = e;
    return 0;
}

void ddp__engine_submit(ddp__engine_t *e, ddp_coll_req_t *req)
{
    req->qnext = NULL;
    pthread_mutex_lock(&e->qmu);
    if (e->tail)
        e->tail->qnext = req;
    else
        e->head = req;
    e->tail = req;
    pthread_mutex_unlock(&e->qmu);
    ddp__engine_wake(e);
}

void ddp__engine_stop(ddp__engine_t *e)
{
    if (!e) return;
    atomic_store(&e->stop, 1);
    ddp__engine_wake(e);
    pthread_join(e->th, NULL);
    ddp_coll_req_t *r;
    while ((r = pop(e))) {
        int err = atomic_load(&e->c->err);
        ddp__coll_complete(e->c, r, err ? err : DDP_EABORTED);
    }
    close(e->efd);
    pthread_mutex_destroy(&e->qmu);
    free(e);
}

int ddp__engine_wait(ddp_coll_t *c, ddp_coll_req_t *req, int64_t deadline_ns)
{
    if (ddp__coll_sleep_until_done(c, req, deadline_ns)) return req->rc;
    char d[96];
    int who = atomic_load(&c->waiting_on);
    double waited = (double)(ddp_now_ns() - (req->t_start ? req->t_start : ddp_now_ns())) * 1e-9;
    if (who >= 0)
        ddp__coll_fail(c, DDP_ETIMEDOUT, "%s: rank %d did not arrive before the deadline (%.1f s "
                       "after the operation started)", ddp__req_desc(req, d, sizeof d), who,
                       waited);
    else
        ddp__coll_fail(c, DDP_ETIMEDOUT, "%s: not finished before the deadline (queued behind "
                       "earlier operations)", ddp__req_desc(req, d, sizeof d));
    ddp__coll_sleep_until_done(c, req, ddp_now_ns() + 2000000000LL);
    return atomic_load(&c->err);
}
