/* Stop strings on decoded text (see stop.h).
 *
 * Invariant: `held` never contains a whole stop string, and it is the longest
 * suffix of the text seen so far that is a proper prefix of some stop string.
 * A stop string that starts in already-emitted text is therefore impossible
 * (that would make a longer suffix a prefix of a stop string), so searching
 * held + new text is enough to find the earliest match. */
#include "sanctum/stop.h"

#include <stdlib.h>
#include <string.h>

struct sn_stopper {
    char *stops[SN_STOP_MAX];
    size_t lens[SN_STOP_MAX];
    size_t n;
    size_t max_len;
    char *buf;           /* held tail + the text being examined */
    size_t buf_len, buf_cap;
    bool matched;
};

static sn_status append(char **out, size_t *len, size_t *cap, const char *p, size_t n)
{
    if (n == 0) return SN_OK;
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap : 64;
        while (nc < *len + n + 1) nc *= 2;
        char *q = realloc(*out, nc);
        if (!q) return SN_FAIL(SN_E_NOMEM, "stop: out of memory growing text to %zu bytes", nc);
        *out = q;
        *cap = nc;
    }
    memcpy(*out + *len, p, n);
    *len += n;
    (*out)[*len] = 0;
    return SN_OK;
}

sn_status sn_stop_new(const char *const *stops, size_t n, sn_stopper **out)
{
    *out = NULL;
    if (n > SN_STOP_MAX) return SN_FAIL(SN_E_INVALID, "stop: at most %d stop strings, got %zu", SN_STOP_MAX, n);
    sn_stopper *s = calloc(1, sizeof *s);
    if (!s) return SN_FAIL(SN_E_NOMEM, "stop: out of memory");
    sn_status st = SN_OK;
    for (size_t i = 0; i < n; i++) {
        size_t l = stops[i] ? strlen(stops[i]) : 0;
        if (l == 0 || l > SN_STOP_MAX_LEN) {
            st = SN_FAIL(SN_E_INVALID, "stop[%zu]: length must be 1..%d bytes, got %zu", i, SN_STOP_MAX_LEN, l);
            goto out;
        }
        s->stops[i] = strdup(stops[i]);
        if (!s->stops[i]) { st = SN_FAIL(SN_E_NOMEM, "stop: out of memory"); goto out; }
        s->lens[i] = l;
        s->n = i + 1;
        if (l > s->max_len) s->max_len = l;
    }
    *out = s;
    return SN_OK;
out:
    sn_stop_free(s);
    return st;
}

void sn_stop_free(sn_stopper *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) free(s->stops[i]);
    free(s->buf);
    free(s);
}

size_t sn_stop_held(const sn_stopper *s) { return s->matched ? 0 : s->buf_len; }
bool sn_stop_matched(const sn_stopper *s) { return s->matched; }

/* Length of the longest suffix of buf[0,len) that is a proper prefix of a stop string. */
static size_t partial_tail(const sn_stopper *s, const char *buf, size_t len)
{
    size_t best = 0;
    for (size_t i = 0; i < s->n; i++) {
        size_t lim = s->lens[i] - 1;
        if (lim > len) lim = len;
        for (size_t k = lim; k > best; k--) {
            if (memcmp(buf + len - k, s->stops[i], k) == 0) { best = k; break; }
        }
    }
    return best;
}

sn_status sn_stop_push(sn_stopper *s, const char *text, size_t len,
                       char **out, size_t *out_len, size_t *out_cap, bool *stopped)
{
    *stopped = s->matched;
    if (s->matched || len == 0) return SN_OK;
    if (s->n == 0) return append(out, out_len, out_cap, text, len);
    SN_TRY(append(&s->buf, &s->buf_len, &s->buf_cap, text, len));

    /* Earliest match of any stop string in held + new text. */
    size_t first = (size_t)-1;
    for (size_t i = 0; i < s->n; i++) {
        if (s->lens[i] > s->buf_len) continue;
        const char *hit = memmem(s->buf, s->buf_len, s->stops[i], s->lens[i]);
        if (hit && (size_t)(hit - s->buf) < first) first = (size_t)(hit - s->buf);
    }
    if (first != (size_t)-1) {
        s->matched = true;
        *stopped = true;
        sn_status st = append(out, out_len, out_cap, s->buf, first);
        s->buf_len = 0;
        return st;
    }
    size_t keep = partial_tail(s, s->buf, s->buf_len);
    size_t emit = s->buf_len - keep;
    SN_TRY(append(out, out_len, out_cap, s->buf, emit));
    memmove(s->buf, s->buf + emit, keep);
    s->buf_len = keep;
    return SN_OK;
}

sn_status sn_stop_flush(sn_stopper *s, char **out, size_t *out_len, size_t *out_cap)
{
    if (s->matched) return SN_OK;
    sn_status st = append(out, out_len, out_cap, s->buf, s->buf_len);
    s->buf_len = 0;
    return st;
}
