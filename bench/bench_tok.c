/* Tokenizer encode speed: 1 MB of English through sn_tok_encode.
 *
 * Bound: encoding 1 MB of English text must take under one second (issue 3),
 * so a 100k-token prompt never costs more than ~0.5 s before prefill.
 *
 * The default text is deterministic pseudo-English: common words drawn with
 * a Zipf-like law, 8% random "rare" words (cache misses that run the full
 * merge loop), capitalised sentence starts, punctuation, numbers and
 * paragraph breaks. --file times a real text instead (repeated or cut to
 * the size). The cold figure is the first pass on a fresh tokenizer (empty
 * word cache); warm repeats it.
 *
 * Usage: bench_tok --tokenizer PATH [--file TEXT] [--mb N]
 * (bench/bench_tok.sh builds it, runs it on the vendored Qwen3 tokenizer and
 * appends the result line with its command to bench/results.log.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "bench_common.h"
#include "sanctum/tokenizer.h"

static const char *WORDS[] = {
    "the", "of", "and", "to", "a", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not",
    "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you", "were",
    "their", "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will", "would", "who",
    "so", "no", "she", "other", "its", "may", "these", "what", "them", "than", "some", "him", "time", "into", "only",
    "do", "could", "new", "about", "two", "first", "then", "also", "any", "like", "our", "such", "my", "people",
    "over", "made", "well", "years", "state", "after", "most", "work", "should", "between", "world", "system",
    "through", "where", "because", "government", "during", "without", "however", "information", "development",
    "language", "model", "inference", "server", "memory", "request", "response", "performance", "tokenizer",
    "example", "important", "understand", "different", "following", "especially", "nevertheless", "particular",
    "education", "community", "experience", "knowledge", "history", "science", "research", "analysis", "problem",
    "question", "answer", "children", "family", "country", "company", "program", "number", "market", "power",
    "water", "light", "house", "school", "city", "money", "story", "night", "place", "point", "hand", "eyes",
    "don't", "it's", "I'm", "we'll", "they've", "can't", "doesn't", "you're", "Mr.", "Dr.", "U.S.", "e.g.",
};

static unsigned long long rng = 0x9e3779b97f4a7c15ull;
static unsigned rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (unsigned)(rng >> 11);
}

static char *make_english(size_t size)
{
    char *t = malloc(size + 64);
    if (!t) return NULL;
    size_t n = 0, nw = sizeof WORDS / sizeof *WORDS;
    bool cap = true;
    int in_sentence = 0;
    while (n < size) {
        char w[32];
        unsigned r = rnd() % 1000;
        if (r < 80) {   /* a rare word: random letters */
            int len = 4 + (int)(rnd() % 9);
            for (int i = 0; i < len; i++) w[i] = (char)('a' + rnd() % 26);
            w[len] = 0;
        } else if (r < 95) {
            snprintf(w, sizeof w, "%u", rnd() % 100000);
        } else {
            /* Zipf-like: the square of a uniform variate favours the first words */
            double u = (rnd() % 10000) / 10000.0;
            snprintf(w, sizeof w, "%s", WORDS[(size_t)(u * u * (double)nw)]);
        }
        if (cap && w[0] >= 'a' && w[0] <= 'z') w[0] = (char)(w[0] - 32);
        cap = false;
        n += (size_t)snprintf(t + n, 64, "%s", w);
        in_sentence++;
        unsigned p = rnd() % 100;
        if (in_sentence > 6 && p < 12) {
            t[n++] = p < 9 ? '.' : p < 11 ? '?' : '!';
            cap = true;
            in_sentence = 0;
            if (rnd() % 8 == 0) { t[n++] = '\n'; t[n++] = '\n'; continue; }
        } else if (p < 20) {
            t[n++] = p < 17 ? ',' : p < 19 ? ';' : ':';
        }
        t[n++] = ' ';
    }
    t[size] = 0;
    return t;
}

static char *read_text(const char *path, size_t size)
{
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return NULL; }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *src = malloc(len > 0 ? (size_t)len : 1);
    if (!src || len <= 0 || fread(src, 1, (size_t)len, f) != (size_t)len) { fclose(f); free(src); return NULL; }
    fclose(f);
    char *t = malloc(size + 1);
    if (!t) { free(src); return NULL; }
    for (size_t o = 0; o < size; o += (size_t)len)
        memcpy(t + o, src, size - o < (size_t)len ? size - o : (size_t)len);
    /* do not end inside a UTF-8 sequence */
    size_t n = size;
    while (n > 0 && ((unsigned char)t[n - 1] & 0xc0) == 0x80) n--;
    if (n > 0 && (unsigned char)t[n - 1] >= 0xc0) n--;
    t[n] = 0;
    free(src);
    return t;
}

int main(int argc, char **argv)
{
    const char *tok_path = NULL, *file = NULL;
    double mb = 1.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) tok_path = argv[++i];
        else if (!strcmp(argv[i], "--file") && i + 1 < argc) file = argv[++i];
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atof(argv[++i]);
        else { fprintf(stderr, "usage: %s [--tokenizer PATH] [--file TEXT] [--mb N]\n", argv[0]); return 2; }
    }
    if (!tok_path || mb <= 0 || mb > 1024) { fprintf(stderr, "need --tokenizer and 0 < --mb <= 1024\n"); return 2; }
    size_t size = (size_t)(mb * 1024 * 1024);
    char *text = file ? read_text(file, size) : make_english(size);
    if (!text) { fprintf(stderr, "cannot build the text\n"); return 1; }
    size_t len = strlen(text);

    sn_tokenizer *t = NULL;
    double t0 = bench_now();
    if (sn_tok_load(tok_path, NULL, &t) != SN_OK) { fprintf(stderr, "load: %s\n", sn_errmsg()); return 1; }
    double load_s = bench_now() - t0;

    sn_ids ids = {0};
    double cold = 0, warm = 1e9;
    for (int pass = 0; pass < 4; pass++) {
        ids.n = 0;
        t0 = bench_now();
        if (sn_tok_encode(t, text, len, false, &ids) != SN_OK) { fprintf(stderr, "encode: %s\n", sn_errmsg()); return 1; }
        double s = bench_now() - t0;
        if (pass == 0) cold = s;
        else if (s < warm) warm = s;
    }
    /* decode back as a sanity check: a benchmark of wrong output is worthless */
    char *dec = NULL;
    size_t dn = 0;
    utf8proc_uint8_t *nfc = NULL;
    utf8proc_ssize_t nn = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &nfc,
                                       UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (sn_tok_decode(t, ids.ids, ids.n, false, &dec, &dn) != SN_OK || nn < 0 || dn != (size_t)nn ||
        memcmp(dec, nfc, dn) != 0) {
        fprintf(stderr, "decode(encode(text)) != NFC(text)\n");
        return 1;
    }
    free(nfc);
    double mbs = (double)len / (1024.0 * 1024.0);
    printf(
             "bench_tok: encode %.2f MB %s (%s, %zu tokens, %.2f bytes/token): cold %.3f s (%.1f MB/s), warm %.3f s "
             "(%.1f MB/s); load %.2f s; bound: < 1 s per MB -> %s\n",
             mbs, file ? file : "synthetic English", sn_tok_kind(t), ids.n, (double)len / (double)ids.n, cold,
             mbs / cold, warm, mbs / warm, load_s, cold / mbs < 1.0 ? "PASS" : "FAIL");
    free(dec);
    sn_ids_free(&ids);
    sn_tok_free(t);
    free(text);
    return cold / mbs < 1.0 ? 0 : 1;
}
