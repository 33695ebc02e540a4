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

static int environ_has(int pid, const char *needle, size_t nl)
{
    char path[64], buf[65536];
    snprintf(path, sizeof path, "/proc/%d/environ", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    for (ssize_t i = 0; n > 0 && i < n;) {
        size_t l = strnlen(buf + i, (size_t)(n - i));
        if (l == nl && !memcmp(buf + i, needle, nl)) return 1;
        i += (ssize_t)l + 1;
    }
    return 0;
}

int ddpd_kill_by_token(const char *token, int sig)
{
    if (!token || strlen(token) < 16) return 0;
    char needle[128];
    int nl = snprintf(needle, sizeof needle, "DDP_JOB_TOKEN=%s", token);
    DIR *dir = opendir("/proc");
    if (!dir) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        int pid = atoi(e->d_name);
        if (pid <= 1 || pid == getpid()) continue;
        if (environ_has(pid, needle, (size_t)nl) && kill(pid, sig) == 0) n++;
    }
    closedir(dir);
    return n;
}

int ddpd_recover(ddpd_t *d)
{
    json_t *orphans = NULL, *queued = NULL;
    int rc = ddpd_store_recover(d->store, "the daemon stopped while the job was running",
                                ddp_wall_ms(), &orphans, &queued);
    size_t i;
    json_t *o;
    json_array_foreach(orphans, i, o)
    {
        const char *token = json_string_value(json_object_get(o, "token"));
        int k = ddpd_kill_by_token(token, SIGKILL);
        DDP_WARN("job %lld was %s when the daemon stopped: marked failed%s",
                 (long long)json_integer_value(json_object_get(o, "id")),
                 json_string_value(json_object_get(o, "state")),
                 k ? "; its leftover workers were killed" : "");
    }
    json_array_foreach(queued, i, o)
    {
        if (ddpd_job_requeue(d, o) == 0)
            DDP_INFO("job %lld re-queued", (long long)json_integer_value(json_object_get(o, "id")));
    }
    json_decref(orphans);
    json_decref(queued);
    return rc;
}
