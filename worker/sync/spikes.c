/* Spike skipping's detector (see spikes.h). */
#include "worker/sync/spikes.h"

#include <math.h>

double ddp_spike_push(ddp_spike_window_t *w, int size, double x)
{
    if (!isfinite(x)) return NAN;
    if (size < 2) size = 2;
    if (size > DDP_SPEC_MAX_SKIP_WINDOW) size = DDP_SPEC_MAX_SKIP_WINDOW;
    if (w->count > size || w->index < 0 || w->index >= size) w->count = w->index = 0; /* resized */
    if (w->count < size) {
        w->values[w->count++] = x; /* filling: no z yet */
        return NAN;
    }
    w->values[w->index] = x; /* the new value replaces the oldest before z is computed */
    w->index = (w->index + 1) % size;
    double sum = 0;
    for (int i = 0; i < size; i++) sum += w->values[i];
    double mean = sum / size, ss = 0;
    for (int i = 0; i < size; i++) ss += (w->values[i] - mean) * (w->values[i] - mean);
    double sd = sqrt(ss / size); /* population variance */
    return sd > 0 ? (x - mean) / sd : 0.0;
}

ddp_skip_t ddp_spikes_step(ddp_spikes_t *s, const ddp_spec_t *spec, double loss, double norm,
                           double *z_loss, double *z_norm)
{
    double zl = NAN, zn = NAN;
    ddp_skip_t why = DDP_SKIP_NONE;
    if (isfinite(loss) && isfinite(norm)) {
        zl = ddp_spike_push(&s->loss, spec->skip_window, loss);
        zn = ddp_spike_push(&s->norm, spec->skip_window, norm);
        if (spec->skip_loss_z > 0 && zl > spec->skip_loss_z) { /* NaN compares false */
            why = DDP_SKIP_LOSS;
            s->skipped_loss++;
        } else if (spec->skip_norm_z > 0 && zn > spec->skip_norm_z) {
            why = DDP_SKIP_NORM;
            s->skipped_norm++;
        }
    }
    if (z_loss) *z_loss = zl;
    if (z_norm) *z_norm = zn;
    return why;
}

const char *ddp_skip_name(ddp_skip_t why)
{
    switch (why) {
    case DDP_SKIP_NONFINITE: return "nonfinite";
    case DDP_SKIP_LOSS: return "loss";
    case DDP_SKIP_NORM: return "norm";
    case DDP_SKIP_NONE: break;
    }
    return NULL;
}
