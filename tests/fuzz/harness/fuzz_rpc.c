/* libFuzzer harness: the control socket's request line reader. The input is split at '\n' as
 * api.c's read callback splits its stream; each line goes through ddpd_rpc_parse_request (the
 * envelope check api.c runs before dispatch) and, like log data, through ddpd_rpc_text (the
 * UTF-8 repair), whose result must serialise.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/rpc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* libFuzzer's entry point: one input, any bytes; returns 0 (a bug aborts). One thread. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data;
    size_t n = size;
    while (n) {
        const char *nl = memchr(p, '\n', n);
        size_t take = nl ? (size_t)(nl - p) : n;
        ddpd_rpc_req_t req;
        char *err = NULL;
        int rc = ddpd_rpc_parse_request(p, take, &req, &err);
        if (rc == 0) {
            if (!req.method) abort(); /* a valid request always has its method */
            char *line = ddpd_rpc_result(req.id, json_string(req.method));
            free(line);
            json_decref(req.root);
        } else if (rc < 0) {
            if (!err || !strchr(err, '\n')) abort(); /* an error line, newline-terminated */
            free(err);
        }
        size_t held = 0;
        json_t *t = ddpd_rpc_text(p, take, 1, &held);
        if (t) {
            char *s = json_dumps(t, JSON_ENCODE_ANY);
            if (!s) abort(); /* repaired text is valid UTF-8 and must serialise */
            free(s);
            json_decref(t);
        }
        if (held > take) abort();
        if (!nl) break;
        p += take + 1;
        n -= take + 1;
    }
    return 0;
}
