/* Host identity (see host.h). */
#include "common/host.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

void ddp_host_id(char *out, size_t len)
{
    char boot[64] = "noboot", hn[64] = "nohost", ns[64] = "nonet";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f) {
        if (fgets(boot, sizeof boot, f)) boot[strcspn(boot, "\n")] = 0;
        fclose(f);
    }
    gethostname(hn, sizeof hn - 1);
    hn[sizeof hn - 1] = 0;
    ssize_t n = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
    if (n > 0) ns[n] = 0;
    snprintf(out, len, "%s/%s/%s", boot, hn, ns);
}
