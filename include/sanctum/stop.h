/* Stop strings on decoded text.
 *
 * Text is pushed as it is decoded; the stopper hands back the part that is
 * safe to show and holds back the longest tail that could still be the start
 * of a stop string, so a stop string split across tokens (or across two SSE
 * flushes) is caught and no byte of it ever reaches the client. */
#ifndef SANCTUM_STOP_H
#define SANCTUM_STOP_H

#include <stdbool.h>
#include <stddef.h>

#include "sanctum/status.h"

#define SN_STOP_MAX 16          /* stop strings per request (OpenAI allows 4) */
#define SN_STOP_MAX_LEN 512     /* bytes per stop string */

typedef struct sn_stopper sn_stopper;

/* stops: n strings (n <= SN_STOP_MAX, each 1..SN_STOP_MAX_LEN bytes); n may be 0. */
sn_status sn_stop_new(const char *const *stops, size_t n, sn_stopper **out);
void sn_stop_free(sn_stopper *s);

/* Feed len bytes of newly decoded text. Appends the safe-to-emit bytes to
 * *out (grown with realloc; out_len and out_cap track it). When a stop string
 * completes, *stopped becomes true, the text before it is emitted and the
 * stop string and anything after it are dropped; later pushes emit nothing. */
sn_status sn_stop_push(sn_stopper *s, const char *text, size_t len,
                       char **out, size_t *out_len, size_t *out_cap, bool *stopped);
/* End of generation without a stop: release the held-back tail. */
sn_status sn_stop_flush(sn_stopper *s, char **out, size_t *out_len, size_t *out_cap);
/* Bytes currently held back (for tests and diagnostics). */
size_t sn_stop_held(const sn_stopper *s);
bool sn_stop_matched(const sn_stopper *s);

#endif
