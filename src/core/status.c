#include "sanctum/status.h"

#include <stdarg.h>
#include <string.h>

static _Thread_local char g_msg[1024];
static _Thread_local char g_loc[256];

sn_status sn_fail_at(sn_status code, const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    const char *base = strrchr(file, '/');
    snprintf(g_loc, sizeof g_loc, "%s:%d", base ? base + 1 : file, line);
    return code;
}

const char *sn_errmsg(void) { return g_msg; }
const char *sn_errloc(void) { return g_loc; }
void sn_clear_error(void) { g_msg[0] = 0; g_loc[0] = 0; }

const char *sn_status_name(sn_status s)
{
    switch (s) {
    case SN_OK: return "ok";
    case SN_E_IO: return "io";
    case SN_E_FORMAT: return "format";
    case SN_E_SHAPE: return "shape";
    case SN_E_MISSING: return "missing";
    case SN_E_UNSUPPORTED: return "unsupported";
    case SN_E_NOMEM: return "nomem";
    case SN_E_RANGE: return "range";
    case SN_E_INVALID: return "invalid";
    case SN_E_VERIFY: return "verify";
    case SN_E_BACKEND: return "backend";
    case SN_E_CANCELLED: return "cancelled";
    }
    return "unknown";
}
