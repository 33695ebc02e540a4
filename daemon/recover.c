/* Recovery at start-up (see recover.h). */
#include "recover.h"

#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "daemon/job.h"
#include "daemon/spawn.h"

int ddpd_kill_by_token(const char *token, int sig)
{
    if (!token || strlen(token) < 16) return 0;
    char needle[128];
    snprintf(needle, sizeof needle, "DDP_JOB_TOKEN=%s", token);
    DIR *dir = opendir("/proc");
    if (!dir) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        int pid = atoi(e->d_name);
        if (pid <= 1 || pid == getpid()) continue;
        if (ddpd_proc_has_env(pid, needle) && kill(pid, sig) == 0) n++;
    }
    closedir(dir);
    return n;
}

int ddpd_recover(ddpd_t *d)
{
    json_t *live = NULL, *queued = NULL;
    int rc = ddpd_store_unfinished(d->store, &live, &queued);
    size_t i;
    json_t *o;
    json_array_foreach(live, i, o)
    {
        long long id = (long long)json_integer_value(json_object_get(o, "id"));
        char why[400];
        if (ddpd_job_adopt(d, o, why, sizeof why) == 0) continue;
        char reason[512];
        snprintf(reason, sizeof reason, "the daemon stopped while the job was running, and the "
                 "next one could not adopt it: %s", why);
        const char *token = json_string_value(json_object_get(o, "token"));
        int k = ddpd_kill_by_token(token, SIGKILL);
        if (ddpd_store_job_transition(d->store, id, json_string_value(json_object_get(o, "state")),
                                      "failed", reason, ddp_wall_ms()) != 0)
            d->n_store_errors++; /* the store logged why; the job stays "running" there */
        DDP_WARN("job %lld: %s; marked failed%s", id, reason,
                 k ? "; its leftover workers were killed" : "");
    }
    json_array_foreach(queued, i, o)
    {
        if (ddpd_job_requeue(d, o) == 0)
            DDP_INFO("job %lld re-queued", (long long)json_integer_value(json_object_get(o, "id")));
    }
    json_decref(live);
    json_decref(queued);
    return rc;
}
