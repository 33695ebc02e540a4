/* st_compare: compares two F32 safetensors files tensor by tensor (the resume tests' oracle).
 *
 *   st_compare A B [RTOL]     RTOL 0 (default): bitwise; else max |a-b| / max |a| per tensor
 *
 * Exit 0 when both files hold the same names and shapes and every tensor is within RTOL;
 * 1 otherwise (the first difference is printed); 2 on a read error.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/checkpoint/safetensors.h"

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: st_compare A B [RTOL]\n");
        return 2;
    }
    double rtol = argc > 3 ? atof(argv[3]) : 0;
    ddp_st_file_t *a = NULL, *b = NULL;
    ddp_errinfo_t ei;
    char msg[1024];
    ddp_errinfo_clear(&ei);
    if (ddp_st_open(argv[1], &a, &ei) || ddp_st_open(argv[2], &b, &ei)) {
        fprintf(stderr, "st_compare: %s\n", ddp_errinfo_str(&ei, msg, sizeof msg));
        return 2;
    }
    int bad = ddp_st_count(a) != ddp_st_count(b);
    if (bad) printf("tensor counts differ: %zu vs %zu\n", ddp_st_count(a), ddp_st_count(b));
    double worst = 0;
    for (size_t i = 0; !bad && i < ddp_st_count(a); i++) {
        const ddp_st_tensor_t *x = ddp_st_get(a, i), *y = ddp_st_find(b, x->name);
        if (!y || y->nbytes != x->nbytes || x->dtype != DDP_ST_F32 || y->dtype != DDP_ST_F32) {
            printf("tensor %s: missing, not F32 or of another size in %s\n", x->name, argv[2]);
            bad = 1;
            break;
        }
        if (rtol == 0) {
            if (memcmp(x->data, y->data, x->nbytes)) {
                printf("tensor %s differs (bitwise)\n", x->name);
                bad = 1;
            }
            continue;
        }
        const float *p = x->data, *q = y->data;
        double maxa = 0, maxd = 0;
        for (size_t j = 0; j < x->nbytes / 4; j++) {
            maxa = fmax(maxa, fabs((double)p[j]));
            maxd = fmax(maxd, fabs((double)p[j] - (double)q[j]));
        }
        double rel = maxa > 0 ? maxd / maxa : maxd;
        if (rel > worst) worst = rel;
        if (!(rel <= rtol)) {
            printf("tensor %s: relative difference %.3g > %.3g\n", x->name, rel, rtol);
            bad = 1;
        }
    }
    if (!bad) printf("same (%s, worst relative difference %.3g)\n", rtol ? "tolerance" : "bitwise",
                     worst);
    ddp_st_close(a);
    ddp_st_close(b);
    return bad;
}
