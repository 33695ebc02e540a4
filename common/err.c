/* ddp_strerror / ddp_err_name over the one error list, and ddp_errinfo_t helpers. */
#include "err.h"

#include <errno.h>
#include <string.h>

const char *ddp_strerror(int rc)
{
    switch (rc) {
    case 0: return "success";
#define DDP__ERR_MSG(name, value, msg) case value: return msg;
        DDP_ERROR_LIST(DDP__ERR_MSG)
#undef DDP__ERR_MSG
    default: break;
    }
    if (rc < 0 && rc > -4096) return strerror(-rc); /* glibc's strerror is thread-safe */
    return "unknown error";
}

const char *ddp_err_name(int rc)
{
    switch (rc) {
    case 0: return "OK";
#define DDP__ERR_NAME(name, value, msg) case value: return "DDP_" #name;
        DDP_ERROR_LIST(DDP__ERR_NAME)
#undef DDP__ERR_NAME
    default: break;
    }
    if (rc < 0 && rc > -4096) {
        const char *n = strerrorname_np(-rc);
        if (n) return n;
    }
    return "EUNKNOWN";
}

int ddp_errinfo_vset(ddp_errinfo_t *ei, int rc, const char *fmt, va_list ap)
{
    if (!ei) return rc;
    ddp_errinfo_clear(ei);
    vsnprintf(ei->msg, sizeof ei->msg, fmt, ap);
    return rc;
}

int ddp_errinfo_set(ddp_errinfo_t *ei, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    rc = ddp_errinfo_vset(ei, rc, fmt, ap);
    va_end(ap);
    return rc;
}

void ddp_errinfo_path(ddp_errinfo_t *ei, const char *fmt, ...)
{
    if (!ei) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ei->path, sizeof ei->path, fmt, ap);
    va_end(ap);
}

void ddp_errinfo_clear(ddp_errinfo_t *ei)
{
    if (!ei) return;
    memset(ei, 0, sizeof *ei);
    ei->offset = -1;
}

const char *ddp_errinfo_str(const ddp_errinfo_t *ei, char *buf, size_t len)
{
    if (!ei || !len) return "";
    int n = 0;
    if (ei->path[0]) {
        n = snprintf(buf, len, "%s", ei->path);
        if (ei->line > 0 && n >= 0 && (size_t)n < len)
            n += snprintf(buf + n, len - n, ":%d:%d", ei->line, ei->column);
        if (ei->offset >= 0 && n >= 0 && (size_t)n < len)
            n += snprintf(buf + n, len - n, " (offset %lld)", ei->offset);
        if (n >= 0 && (size_t)n < len) n += snprintf(buf + n, len - n, ": ");
    }
    if (n >= 0 && (size_t)n < len) snprintf(buf + n, len - n, "%s", ei->msg);
    return buf;
}
