/* Stop strings: split across tokens, across flushes, overlapping prefixes,
 * multi-byte text, and that no byte of a stop string is ever emitted. */
#include "harness.h"
#include "sanctum/stop.h"

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
    RUN(test_invalid);
    return TEST_END();
}
