/* Status codes and thread-local error messages shared by all of libsanctum.
 *
 * Every fallible function returns sn_status (SN_OK == 0, failures negative)
 * and records a human-readable message with SN_FAIL; callers read it with
 * sn_errmsg(). Programmer errors use SN_ASSERT, which is always on. */
#ifndef SANCTUM_STATUS_H
#define SANCTUM_STATUS_H

#include <stdio.h>
#include <stdlib.h>

typedef enum {
    SN_OK = 0,
    SN_E_IO = -1,        /* open/read/mmap failed */
    SN_E_FORMAT = -2,    /* malformed file or message (bad JSON, bad header) */
    SN_E_SHAPE = -3,     /* tensor shape or dtype does not match what the model needs */
    SN_E_MISSING = -4,   /* a required tensor / field / file is absent */
    SN_E_UNSUPPORTED = -5, /* valid input we do not handle (model_type, dtype, bits) */
    SN_E_NOMEM = -6,
    SN_E_RANGE = -7,     /* value out of its allowed range (context full, bad id) */
    SN_E_INVALID = -8,   /* bad argument from a caller or a request */
    SN_E_VERIFY = -9,    /* hash or signature mismatch */
    SN_E_BACKEND = -10,  /* backend (CUDA) failure */
    SN_E_CANCELLED = -11,
} sn_status;

/* Record a formatted message for this thread; returns code so that
 * `return SN_FAIL(SN_E_IO, "...")` reads naturally. */
sn_status sn_fail_at(sn_status code, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define SN_FAIL(code, ...) sn_fail_at((code), __FILE__, __LINE__, __VA_ARGS__)

/* Message of the last failure on this thread ("" when none). The text never
 * contains the file:line prefix; sn_errloc() gives that for logs. */
const char *sn_errmsg(void);
const char *sn_errloc(void);
const char *sn_status_name(sn_status s);
void sn_clear_error(void);

#define SN_TRY(expr) do { sn_status _st = (expr); if (_st != SN_OK) return _st; } while (0)

#define SN_ASSERT(cond) do { if (!(cond)) { \
    fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #cond); abort(); } } while (0)

#endif
