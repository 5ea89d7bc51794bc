/* Decoding: ids -> bytes -> UTF-8, whole (sn_tok_decode) or streamed
 * (sn_detok_*). Byte-level tokens can end in the middle of a character, so
 * the stream holds back an incomplete but still valid prefix until the next
 * token completes it. Invalid bytes become U+FFFD with the "maximal subpart"
 * rule (one U+FFFD per maximal invalid prefix), the rule of Rust's
 * String::from_utf8_lossy, which Hugging Face's ByteLevel decoder uses;
 * streaming and whole decoding therefore produce the same text. */
#include "tok/tok_internal.h"
#include "tok/tok_text.h"

#include <string.h>

/* Length the lead byte announces (0 = never valid as a lead), and the
 * allowed range of the byte after it (the Unicode well-formed table). */
static int utf8_need(unsigned char c, unsigned char *lo, unsigned char *hi)
{
    *lo = 0x80;
    *hi = 0xbf;
    if (c < 0x80) return 1;
    if (c < 0xc2) return 0;
    if (c < 0xe0) return 2;
    if (c < 0xf0) {
        if (c == 0xe0) *lo = 0xa0;
        if (c == 0xed) *hi = 0x9f;
        return 3;
    }
    if (c < 0xf5) {
        if (c == 0xf0) *lo = 0x90;
        if (c == 0xf4) *hi = 0x8f;
        return 4;
    }
    return 0;
}

/* At b[i]: returns the length of a complete valid character (> 0), or
 * -k where k >= 1 is the length of the maximal invalid subpart, or 0 when
 * the bytes run out inside a valid prefix. */
static int utf8_step(const unsigned char *b, size_t n, size_t i)
{
    unsigned char lo, hi;
    int need = utf8_need(b[i], &lo, &hi);
    if (need == 0) return -1;
    for (int k = 1; k < need; k++) {
        if (i + (size_t)k >= n) return 0;
        unsigned char c = b[i + (size_t)k];
        if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xbf)) return -k;
    }
    return need;
}

size_t tok_utf8_check(const char *s, size_t n)
{
    const unsigned char *b = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (b[i] < 0x80) { i++; continue; }
        int r = utf8_step(b, n, i);
        if (r <= 0) return i;
        i += (size_t)r;
    }
    return n;
}

static sn_status buf_reserve(char **out, size_t *len, size_t *cap, size_t extra)
{
    size_t failed = tok_text_reserve(out, len, cap, extra, 64);
    if (failed) return SN_FAIL(SN_E_NOMEM, "detokenizer: out of memory (%zu bytes)", failed);
    return SN_OK;
}

sn_status tok_utf8_lossy(const char *s, size_t n, bool final, char **out, size_t *out_len, size_t *out_cap,
                         size_t *held)
{
    const unsigned char *b = (const unsigned char *)s;
    /* Worst case every byte becomes a 3-byte U+FFFD. */
    SN_TRY(buf_reserve(out, out_len, out_cap, n * 3));
    char *o = *out + *out_len;
    size_t i = 0;
    *held = 0;
    while (i < n) {
        if (b[i] < 0x80) { *o++ = (char)b[i++]; continue; }
        int r = utf8_step(b, n, i);
        if (r > 0) {
            memcpy(o, b + i, (size_t)r);
            o += r;
            i += (size_t)r;
        } else if (r == 0 && !final) {
            *held = n - i;
            break;
        } else {
            memcpy(o, "\xef\xbf\xbd", 3);
            o += 3;
            i += r == 0 ? n - i : (size_t)-r;
        }
    }
    *out_len = (size_t)(o - *out);
    (*out)[*out_len] = 0;
    return SN_OK;
}

sn_status sn_tok_decode(const sn_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, char **out,
                        size_t *out_len)
{
    if (!t || !out || (!ids && n)) return SN_FAIL(SN_E_INVALID, "sn_tok_decode: NULL argument");
    *out = NULL;
    if (out_len) *out_len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !(t->flags[id] & TF_PRESENT))
            return SN_FAIL(SN_E_RANGE, "decode: token id %d at position %zu is not in the vocabulary (size %d)", id, i,
                           t->n_ids);
        if (!(skip_special && (t->flags[id] & TF_SPECIAL))) total += t->len[id];
    }
    char *raw = malloc(total + 1);
    if (!raw) return SN_FAIL(SN_E_NOMEM, "decode: out of memory (%zu bytes)", total);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (skip_special && (t->flags[id] & TF_SPECIAL)) continue;
        memcpy(raw + k, t->blob + t->off[id], t->len[id]);
        k += t->len[id];
    }
    size_t len = 0, cap = 0, held;
    char *res = NULL;
    sn_status st = tok_utf8_lossy(raw, k, true, &res, &len, &cap, &held);
    free(raw);
    if (st != SN_OK) { free(res); return st; }
    *out = res;
    if (out_len) *out_len = len;
    return SN_OK;
}

void sn_detok_init(sn_detok *d) { memset(d, 0, sizeof *d); }

sn_status sn_detok_push(sn_detok *d, const sn_tokenizer *t, int32_t id, bool show_special, char **out,
                        size_t *out_len, size_t *out_cap)
{
    if (!d || !t || !out || !out_len || !out_cap) return SN_FAIL(SN_E_INVALID, "sn_detok_push: NULL argument");
    if (id < 0 || id >= t->n_ids || !(t->flags[id] & TF_PRESENT))
        return SN_FAIL(SN_E_RANGE, "detokenizer: token id %d is not in the vocabulary (size %d)", id, t->n_ids);
    SN_ASSERT(d->n_pending < 4);
    /* A skipped special token leaves the byte stream untouched, as in
     * decode(skip_special_tokens=True). */
    if ((t->flags[id] & TF_SPECIAL) && !show_special) {
        SN_TRY(buf_reserve(out, out_len, out_cap, 0));
        (*out)[*out_len] = 0;   /* the buffer is always a string, even when nothing was added */
        return SN_OK;
    }
    const char *p = t->blob + t->off[id];
    size_t n = t->len[id];
    char small[260];
    char *buf = small;
    size_t bn = d->n_pending + n;
    if (d->n_pending) {
        if (bn > sizeof small && !(buf = malloc(bn))) return SN_FAIL(SN_E_NOMEM, "detokenizer: out of memory");
        memcpy(buf, d->pending, d->n_pending);
        memcpy(buf + d->n_pending, p, n);
        p = buf;
    }
    size_t held = 0;
    sn_status st = tok_utf8_lossy(p, bn, false, out, out_len, out_cap, &held);
    if (st == SN_OK) {
        SN_ASSERT(held < 4);
        memcpy(d->pending, p + bn - held, held);
        d->n_pending = held;
    }
    if (buf != small) free(buf);
    return st;
}

sn_status sn_detok_flush(sn_detok *d, char **out, size_t *out_len, size_t *out_cap)
{
    if (!d || !out || !out_len || !out_cap) return SN_FAIL(SN_E_INVALID, "sn_detok_flush: NULL argument");
    size_t held;
    sn_status st = tok_utf8_lossy(d->pending, d->n_pending, true, out, out_len, out_cap, &held);
    d->n_pending = 0;
    return st;
}
