/* `ddpctl plot`: a run's loss curves as an SVG or PNG picture, drawn by gnuplot. */
#ifndef DDPD_CTL_PLOT_H
#define DDPD_CTL_PLOT_H

/* ddpctl plot JOB [-o FILE.svg|FILE.png] [--log]. JOB is a job id (its run directory comes from
 * the daemon at socket_path: job.get), a run directory, or a metrics.jsonl. Draws training and
 * validation loss against step (--log: log-scale loss axis) over tokens/s, with a dashed line
 * where the generation changes, by writing a gnuplot script and its data into a temporary
 * directory and running `gnuplot` on them. Returns a ddpctl exit code (CTL_*). */
int ddpctl_plot(int argc, char **argv, const char *socket_path);

#endif
