/* JSON-RPC line builders, the request envelope check, and the UTF-8 repair used for log data. */
#include "rpc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

static char *line_of(json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) return NULL;
    size_t n = strlen(s);
    char *l = realloc(s, n + 2);
    if (!l) {
        free(s);
        return NULL;
    }
    l[n] = '\n';
    l[n + 1] = 0;
    return l;
}

char *ddpd_rpc_result(json_t *id, json_t *result)
{
    json_t *o = json_object();
    json_object_set_new(o, "jsonrpc", json_string("2.0"));
    json_object_set(o, "id", id ? id : json_null());
    json_object_set_new(o, "result", result ? result : json_null());
    return line_of(o);
}

char *ddpd_rpc_error(json_t *id, int code, const char *message, json_t *data)
{
    json_t *e = json_pack("{si ss}", "code", code, "message", message);
    if (data) json_object_set_new(e, "data", data);
    json_t *o = json_object();
    json_object_set_new(o, "jsonrpc", json_string("2.0"));
    json_object_set(o, "id", id ? id : json_null());
    json_object_set_new(o, "error", e);
    return line_of(o);
}

char *ddpd_rpc_notify(const char *method, json_t *params)
{
    json_t *o = json_pack("{ss ss}", "jsonrpc", "2.0", "method", method);
    json_object_set_new(o, "params", params ? params : json_object());
    return line_of(o);
}

int ddpd_rpc_parse_request(const char *line, size_t len, ddpd_rpc_req_t *req, char **error_line)
{
    memset(req, 0, sizeof *req);
    *error_line = NULL;
    while (len && (line[len - 1] == '\r' || line[len - 1] == ' ' || line[len - 1] == '\t')) len--;
    size_t lead = 0;
    while (lead < len && (line[lead] == ' ' || line[lead] == '\t')) lead++;
    if (lead == len) return 1; /* blank lines are ignored */
    json_error_t je;
    json_t *r = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
    if (!r) {
        char msg[256];
        snprintf(msg, sizeof msg, "invalid JSON at column %d: %s", je.column, je.text);
        *error_line = ddpd_rpc_error(NULL, DDPD_RPC_PARSE, msg,
                                     json_pack("{si si}", "line", je.line, "column", je.column));
        return -1;
    }
    json_t *id = json_object_get(r, "id");
    json_t *ver = json_object_get(r, "jsonrpc");
    json_t *method = json_object_get(r, "method");
    json_t *params = json_object_get(r, "params");
    json_t *echo = id; /* the id an error response carries: null until the id itself is valid */
    int code = DDPD_RPC_INVALID;
    const char *path = NULL, *msg = NULL;
    if (!json_is_object(r)) {
        echo = NULL, msg = "a request must be a JSON object";
    } else if (id && !json_is_null(id) && !json_is_integer(id) && !json_is_string(id)) {
        echo = NULL, path = "id", msg = "id must be an integer, a string or null";
    } else if (!json_is_string(ver) || strcmp(json_string_value(ver), "2.0") != 0) {
        path = "jsonrpc", msg = "jsonrpc must be \"2.0\"";
    } else if (!json_is_string(method)) {
        path = "method", msg = "method must be a string";
    } else if (params && !json_is_object(params) && !json_is_null(params)) {
        code = DDPD_RPC_PARAMS, path = "params", msg = "params must be an object";
    }
    if (msg) {
        json_t *data = path ? json_pack("{ss}", "path", path) : NULL;
        *error_line = ddpd_rpc_error(echo, code, msg, data);
        json_decref(r);
        return -1;
    }
    req->root = r;
    req->id = id; /* a request without "id" is a notification: it runs but gets no response */
    req->method = json_string_value(method);
    req->params = json_is_object(params) ? params : NULL;
    return 0;
}

/* Length of the valid UTF-8 sequence at s (n bytes left): >0 valid, 0 invalid,
 * -1 a valid but incomplete prefix. */
static int seq_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    int len;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) len = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef) len = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, min = 0x10000;
    else return 0;
    unsigned cp = c & (0x3f >> (len - 1));
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return -1;
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

json_t *ddpd_rpc_text(const char *s, size_t n, int hold_tail, size_t *held)
{
    char *out = ddp_malloc(n * 3 + 1);
    if (!out) return NULL;
    size_t o = 0, i = 0;
    if (held) *held = 0;
    while (i < n) {
        int l = seq_len((const unsigned char *)s + i, n - i);
        if (l > 0) {
            memcpy(out + o, s + i, (size_t)l);
            o += (size_t)l;
            i += (size_t)l;
        } else if (l < 0 && hold_tail) {
            if (held) *held = n - i;
            break;
        } else {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    json_t *j = json_stringn(out, o);
    free(out);
    return j;
}
