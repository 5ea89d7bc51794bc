/* Stop strings: split across tokens, across flushes, overlapping prefixes,
 * multi-byte text, and that no byte of a stop string is ever emitted. */
#include "harness.h"
#include "sanctum/stop.h"

#include <stdint.h>
#include <stdlib.h>

typedef struct { char *p; size_t n, cap; } buf;

/* Feeds pieces one by one; returns what was emitted (NUL-terminated) and whether it stopped. */
static char *feed(const char *const *stops, size_t ns, const char *const *pieces, size_t np, bool *stopped, bool flush)
{
    sn_stopper *s = NULL;
    buf b = {0};
    *stopped = false;
    if (sn_stop_new(stops, ns, &s) != SN_OK) return NULL;
    for (size_t i = 0; i < np && !*stopped; i++)
        if (sn_stop_push(s, pieces[i], strlen(pieces[i]), &b.p, &b.n, &b.cap, stopped) != SN_OK) break;
    if (flush && !*stopped) sn_stop_flush(s, &b.p, &b.n, &b.cap);
    sn_stop_free(s);
    if (!b.p) b.p = calloc(1, 1);
    return b.p;
}

static void test_no_stops_passthrough(void)
{
    bool st;
    const char *pieces[] = {"Hello", ", ", "world"};
    char *o = feed(NULL, 0, pieces, 3, &st, false);
    CHECK(o && strcmp(o, "Hello, world") == 0);
    CHECK(!st);
    free(o);
}

static void test_stop_in_one_piece(void)
{
    bool st;
    const char *stops[] = {"END"};
    const char *pieces[] = {"abc", "xxENDyy", "zz"};
    char *o = feed(stops, 1, pieces, 3, &st, true);
    CHECKF(o && strcmp(o, "abcxx") == 0, "got '%s'", o);
    CHECK(st);
    free(o);
}

static void test_stop_split_across_tokens(void)
{
    bool st;
    const char *stops[] = {"</answer>"};
    const char *pieces[] = {"42 <", "/ans", "wer", ">", " trailing"};
    char *o = feed(stops, 1, pieces, 5, &st, true);
    CHECKF(o && strcmp(o, "42 ") == 0, "got '%s'", o);
    CHECK(st);
    free(o);
}

static void test_hold_back_exact(void)
{
    /* After "ab<" with stop "<|end|>", exactly "<" must be held, "ab" emitted. */
    const char *stops[] = {"<|end|>"};
    sn_stopper *s = NULL;
    CHECK_OK(sn_stop_new(stops, 1, &s));
    buf b = {0};
    bool st = false;
    CHECK_OK(sn_stop_push(s, "ab<", 3, &b.p, &b.n, &b.cap, &st));
    CHECK(b.n == 2 && memcmp(b.p, "ab", 2) == 0);
    CHECK(sn_stop_held(s) == 1);
    CHECK_OK(sn_stop_push(s, "|en", 3, &b.p, &b.n, &b.cap, &st));
    CHECK(b.n == 2);
    CHECK(sn_stop_held(s) == 4);
    /* A false start: the held tail is released once it cannot match. */
    CHECK_OK(sn_stop_push(s, "x", 1, &b.p, &b.n, &b.cap, &st));
    CHECK(!st);
    CHECKF(b.n == 7 && memcmp(b.p, "ab<|enx", 7) == 0, "got '%.*s'", (int)b.n, b.p);
    CHECK(sn_stop_held(s) == 0);
    sn_stop_free(s);
    free(b.p);
}

static void test_false_start_then_match(void)
{
    /* "aab" with stop "ab": the first 'a' is released, the match begins at the second. */
    bool st;
    const char *stops[] = {"ab"};
    const char *pieces[] = {"x", "a", "a", "b", "c"};
    char *o = feed(stops, 1, pieces, 5, &st, true);
    CHECKF(o && strcmp(o, "xa") == 0, "got '%s'", o);
    CHECK(st);
    free(o);
}

static void test_earliest_of_many(void)
{
    bool st;
    const char *stops[] = {"world", "lo w", "zzz"};
    const char *pieces[] = {"hel", "lo world"};
    char *o = feed(stops, 3, pieces, 2, &st, true);
    CHECKF(o && strcmp(o, "hel") == 0, "got '%s'", o);
    CHECK(st);
    free(o);
}

static void test_flush_releases_tail(void)
{
    bool st;
    const char *stops[] = {"STOP"};
    const char *pieces[] = {"the end ST"};
    char *o = feed(stops, 1, pieces, 1, &st, true);
    CHECKF(o && strcmp(o, "the end ST") == 0, "got '%s'", o);
    CHECK(!st);
    free(o);
}

static void test_multibyte(void)
{
    bool st;
    const char *stops[] = {"\xc3\xa9t\xc3\xa9"}; /* "été" */
    const char *pieces[] = {"un \xc3\xa9", "t", "\xc3\xa9 chaud"};
    char *o = feed(stops, 1, pieces, 3, &st, true);
    CHECKF(o && strcmp(o, "un ") == 0, "got '%s'", o);
    CHECK(st);
    free(o);
}

static void test_never_leaks_byte_by_byte(void)
{
    /* Feed a long text one byte at a time: the emitted stream must never
     * contain any complete stop string, and must equal the text cut at the stop. */
    const char *text = "some <st words <sto and then <stop> the rest <stop>";
    const char *stops[] = {"<stop>"};
    sn_stopper *s = NULL;
    CHECK_OK(sn_stop_new(stops, 1, &s));
    buf b = {0};
    bool st = false;
    for (size_t i = 0; text[i] && !st; i++) {
        CHECK_OK(sn_stop_push(s, text + i, 1, &b.p, &b.n, &b.cap, &st));
        /* At every step the emitted bytes are a prefix of the final answer. */
        CHECK(b.n <= strlen("some <st words <sto and then ") && (b.n == 0 || memcmp(b.p, text, b.n) == 0));
    }
    CHECK(st);
    CHECKF(b.n == strlen("some <st words <sto and then ") && memcmp(b.p, text, b.n) == 0,
           "got '%.*s'", (int)b.n, b.p);
    /* After the match nothing more comes out. */
    size_t n0 = b.n;
    CHECK_OK(sn_stop_push(s, "more", 4, &b.p, &b.n, &b.cap, &st));
    CHECK(b.n == n0 && st && sn_stop_matched(s));
    sn_stop_free(s);
    free(b.p);
}

/* Random texts, stops and cuts against a reference: at the first push after
 * which some stop string lies wholly in the text so far, the output is the
 * text up to the earliest start of such a match; until then every push leaves
 * the emitted bytes a prefix of the text with no stop string in them, and
 * holds back exactly the longest suffix that is a proper prefix of a stop.
 * A three-letter alphabet (one letter a two-byte UTF-8 character) makes
 * overlapping and repeated partial matches common. */
static uint64_t rs = 0x9E3779B97F4A7C15ull;
static unsigned rnd(unsigned n)
{
    rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17;
    return (unsigned)(rs % n);
}

static size_t rand_text(char *t, size_t max_units)
{
    static const char *units[] = { "a", "b", "\xc3\xa9" };
    size_t n = 0, k = 1 + rnd((unsigned)max_units);
    for (size_t i = 0; i < k; i++) {
        const char *u = units[rnd(3)];
        memcpy(t + n, u, strlen(u));
        n += strlen(u);
    }
    t[n] = 0;
    return n;
}

/* the longest suffix of t[0,len) that is a proper prefix of a stop */
static size_t ref_partial(char stops[][16], size_t ns, const char *t, size_t len)
{
    size_t best = 0;
    for (size_t i = 0; i < ns; i++)
        for (size_t k = 1; k < strlen(stops[i]) && k <= len; k++)
            if (k > best && !memcmp(t + len - k, stops[i], k)) best = k;
    return best;
}

/* the earliest start of a whole stop in t[0,len), or -1 */
static long ref_first(char stops[][16], size_t ns, const char *t, size_t len)
{
    long first = -1;
    for (size_t i = 0; i < ns; i++) {
        size_t l = strlen(stops[i]);
        for (size_t p = 0; p + l <= len; p++)
            if (!memcmp(t + p, stops[i], l) && (first < 0 || (long)p < first)) first = (long)p;
    }
    return first;
}

static void test_random_against_reference(void)
{
    int bad = 0;
    for (int trial = 0; trial < 20000 && bad < 5; trial++) {
        char stops[3][16], text[128];
        const char *sp[3];
        size_t ns = 1 + rnd(3);
        for (size_t i = 0; i < ns; i++) {
            rand_text(stops[i], 4);
            sp[i] = stops[i];
        }
        size_t tl = rand_text(text, 40);
        sn_stopper *s = NULL;
        CHECK_OK(sn_stop_new(sp, ns, &s));
        if (!s) return;
        buf b = {0};
        bool st = false;
        size_t at = 0;
        bool failed = false;
        while (at < tl && !st) {
            size_t n = rnd(7); /* byte cuts, empty pushes and splits inside a character included */
            if (n > tl - at) n = tl - at;
            CHECK_OK(sn_stop_push(s, text + at, n, &b.p, &b.n, &b.cap, &st));
            at += n;
            const long first = ref_first(stops, ns, text, at);
            const size_t held = ref_partial(stops, ns, text, at);
            const bool ok = first >= 0 ? st && b.n == (size_t)first && (b.n == 0 || !memcmp(b.p, text, b.n))
                                       : !st && b.n == at - held && sn_stop_held(s) == held &&
                                             (b.n == 0 || !memcmp(b.p, text, b.n));
            if (!ok) {
                bad++;
                failed = true;
                CHECKF(ok, "trial %d: stops '%s' '%s' '%s', text '%s' pushed to %zu: out %zu bytes, held %zu, "
                       "stopped %d; want %s %ld / held %zu", trial, stops[0], ns > 1 ? stops[1] : "",
                       ns > 2 ? stops[2] : "", text, at, b.n, sn_stop_held(s), st, first >= 0 ? "stop at" : "no stop",
                       first, held);
                break;
            }
        }
        if (!st && !failed) { /* no stop in the whole text: the flush releases the rest */
            CHECK_OK(sn_stop_flush(s, &b.p, &b.n, &b.cap));
            CHECKF(b.n == tl && (tl == 0 || !memcmp(b.p, text, tl)), "trial %d: flush gave %zu of %zu bytes", trial,
                   b.n, tl);
        }
        sn_stop_free(s);
        free(b.p);
    }
}

static void test_invalid(void)
{
    sn_stopper *s = NULL;
    const char *empty[] = {""};
    CHECK(sn_stop_new(empty, 1, &s) == SN_E_INVALID && s == NULL);
    CHECK(strstr(sn_errmsg(), "stop[0]") != NULL);
    char big[SN_STOP_MAX_LEN + 2];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    const char *bigs[] = {"ok", big};
    CHECK(sn_stop_new(bigs, 2, &s) == SN_E_INVALID);
    CHECK(strstr(sn_errmsg(), "stop[1]") != NULL);
    const char *many[SN_STOP_MAX + 1];
    for (int i = 0; i <= SN_STOP_MAX; i++) many[i] = "x";
    CHECK(sn_stop_new(many, SN_STOP_MAX + 1, &s) == SN_E_INVALID);
    sn_stop_free(NULL);
}

int main(void)
{
    RUN(test_no_stops_passthrough);
    RUN(test_stop_in_one_piece);
    RUN(test_stop_split_across_tokens);
    RUN(test_hold_back_exact);
    RUN(test_false_start_then_match);
    RUN(test_earliest_of_many);
    RUN(test_flush_releases_tail);
    RUN(test_multibyte);
    RUN(test_never_leaks_byte_by_byte);
    RUN(test_random_against_reference);
    RUN(test_invalid);
    return TEST_END();
}
