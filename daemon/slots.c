/* The node's slot count and its one writer (see slots.h). */
#include "daemon/slots.h"

#include "common/log.h"

void ddpd_slots_take(ddpd_t *d, int n, const char *who)
{
    d->slots__used += n;
    if (d->slots__used > d->cfg.slots)
        DDP_WARN("%s took %d slot(s): %d of %d slots in use; no new rank starts here until "
                 "enough end", who, n, d->slots__used, d->cfg.slots);
}

void ddpd_slots_give(ddpd_t *d, int n, const char *who)
{
    d->slots__used -= n;
    if (d->slots__used < 0) {
        /* a rank gave back a slot it never took: a bug, but a negative count would admit
         * ranks beyond the configured slots, so the count stops at zero */
        DDP_ERROR("%s gave back %d slot(s): %d used; counting 0", who, n, d->slots__used);
        d->slots__used = 0;
    }
}

int ddpd_slots_used(const ddpd_t *d) { return d->slots__used; }

int ddpd_slots_free(const ddpd_t *d)
{
    int f = d->cfg.slots - d->slots__used;
    return f < 0 ? 0 : f;
}
