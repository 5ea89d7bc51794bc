/* Growable NUL-terminated text, shared by the chat renderer (chat.c), the
 * reply parser (chat_reply.c) and the detokenizer (detok.c): one growth rule
 * for all three, so the "room for the terminator" arithmetic lives once. */
#ifndef SN_TOK_TEXT_H
#define SN_TOK_TEXT_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Makes room in *p (length *len, capacity *cap) for extra more bytes plus the
 * NUL, doubling from first bytes when empty. Returns 0 on success, else the
 * capacity that could not be allocated (for the caller's error message);
 * *p and *cap are unchanged then. */
static inline size_t tok_text_reserve(char **p, size_t *len, size_t *cap, size_t extra, size_t first)
{
    if (*len + extra + 1 <= *cap && *p) return 0;
    size_t c = *cap ? *cap : first;
    while (c < *len + extra + 1) c *= 2;
    char *q = realloc(*p, c);
    if (!q) return c;
    *p = q;
    *cap = c;
    return 0;
}

/* Appends s[0..n) and keeps the text NUL-terminated; false when out of memory
 * (the text is left as it was). */
static inline bool tok_text_append(char **p, size_t *len, size_t *cap, const char *s, size_t n, size_t first)
{
    if (tok_text_reserve(p, len, cap, n, first)) return false;
    memcpy(*p + *len, s, n);
    *len += n;
    (*p)[*len] = 0;
    return true;
}

#endif
