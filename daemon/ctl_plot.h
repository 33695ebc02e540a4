/* `ddpctl plot`: a run's loss curves as an SVG or PNG picture, drawn by gnuplot. */
#ifndef DDPD_CTL_PLOT_H
#define DDPD_CTL_PLOT_H

#include <stddef.h>

/* ddpctl plot JOB [-o FILE.svg|FILE.png] [--log]. JOB is a job id (its run directory comes from
 * the daemon at socket_path: job.get), a run directory, or a metrics.jsonl. Draws training and
 * validation loss against step (--log: log-scale loss axis) over tokens/s, with a dashed line
 * where the generation changes, by writing a gnuplot script and its data into a temporary
 * directory and running `gnuplot` on them. Returns a ddpctl exit code (CTL_*). */
int ddpctl_plot(int argc, char **argv, const char *socket_path);

/* JOB as ddpctl plot and trace take it: an existing path is returned as it is (*is_file when it
 * is not a directory); a job id is asked of the daemon (job.get) for its run directory. title
 * gets a label ("job 7 (name)" or the path). Returns 0 or a ddpctl exit code, having printed
 * why. */
int ddpctl_run_dir(const char *job, const char *socket_path, char *path, size_t len,
                   int *is_file, char *title, size_t tlen);

#endif
