/* Reading one decode step's critical path off a kernel timeline (start and
 * end of every kernel on the GPU's clock, as sn_cuda_timeline_* gives
 * them): bench_cuda --timeline. Pure functions, tested on the CPU
 * (tests/test_timeline.c).
 *
 * A kernel's exposed time is how far it carries the step past every
 * kernel before it in the stream: kernels taken in order of their start
 * (the stream's order: a kernel starts, at the earliest, once the one
 * before it has started, under PDL's edge), exposed = end - max(the step's
 * start, every earlier kernel's end), 0 when it ends inside them. Idle time
 * before a kernel (its launch, a dependency resolving) counts as its own;
 * the time it runs beside the kernels before it (its prologue overlapping
 * under PDL) does not. The exposed times sum to the step's span, first
 * start to last end. Busy time is end - start, overlaps counted in full. */
#ifndef SANCTUM_BENCH_TIMELINE_H
#define SANCTUM_BENCH_TIMELINE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline int tl_low(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; }

/* The kernel's own name in a mangled CUDA name: the length-prefixed
 * identifier that starts with "k_" (_ZN..12k_md_gate_upILi4E.. ->
 * k_md_gate_up). The digits before it may run on from a namespace's hash
 * (..._7113f43716k_gdn_after_conv..), so each of their last one to three
 * is tried as the length: the identifier must be lower case, digits and
 * underscores (ours are), and one that ends where such a run ends is
 * preferred. Else (unmangled) the name up to '(' or '<'. Cut to n - 1. */
static inline void tl_short_name(const char *m, char *out, size_t n)
{
    if (!n)
        return;
    out[0] = '\0';
    if (!m)
        return;
    const size_t len = strlen(m);
    for (const char *p = strstr(m, "k_"); p; p = strstr(p + 1, "k_")) {
        size_t best = 0;
        int best_ends = 0;
        size_t L = 0, scale = 1;
        for (const char *d = p; d > m && d[-1] >= '0' && d[-1] <= '9' && scale <= 100; d--, scale *= 10) {
            L += (size_t)(d[-1] - '0') * scale;
            if (d[-1] == '0' || L < 2 || (size_t)(p - m) + L > len)
                continue;
            size_t i = 0;
            while (i < L && tl_low(p[i]))
                i++;
            if (i < L)
                continue;
            const int ends = !tl_low(p[L]);
            if (!best || (ends && !best_ends)) {
                best = L;
                best_ends = ends;
            }
        }
        if (best) {
            const size_t c = best < n - 1 ? best : n - 1;
            memcpy(out, p, c);
            out[c] = '\0';
            return;
        }
    }
    size_t c = strcspn(m, "(<");
    if (c > n - 1)
        c = n - 1;
    memcpy(out, m, c);
    out[c] = '\0';
}

static const uint64_t *tl_sort_key; /* qsort's context (single-threaded use) */
static inline int tl_cmp_key(const void *a, const void *b)
{
    const uint64_t x = tl_sort_key[*(const int *)a], y = tl_sort_key[*(const int *)b];
    if (x != y)
        return x < y ? -1 : 1;
    return *(const int *)a - *(const int *)b;
}

/* order[0..n) = the kernels by start (ties: as listed) */
static inline void tl_by_start(const uint64_t *start, int n, int *order)
{
    for (int i = 0; i < n; i++)
        order[i] = i;
    tl_sort_key = start;
    qsort(order, (size_t)n, sizeof *order, tl_cmp_key);
}

/* exposed[i] for the n kernels of one step (ns), and gap[i] (NULL: not
 * wanted) = its start - every earlier kernel's end (0 for the first;
 * negative: it started beside them); returns the span, 0 when n < 1 or a
 * kernel ends before it starts. order gets the kernels by start. */
static inline uint64_t tl_exposed(const uint64_t *start, const uint64_t *end, int n, uint64_t *exposed,
                                  int64_t *gap, int *order)
{
    if (n < 1)
        return 0;
    uint64_t last = end[0];
    for (int i = 0; i < n; i++) {
        if (end[i] < start[i])
            return 0;
        if (end[i] > last)
            last = end[i];
    }
    tl_by_start(start, n, order);
    const uint64_t s0 = start[order[0]];
    uint64_t front = s0;
    for (int j = 0; j < n; j++) {
        const int i = order[j];
        if (gap)
            gap[i] = (int64_t)(start[i] - front);
        exposed[i] = end[i] > front ? end[i] - front : 0;
        if (end[i] > front)
            front = end[i];
    }
    return last - s0;
}

/* The kernels of the last step when the records cannot be grouped by
 * their launch (a graph launch's kernels normally share one correlation
 * id): in order of start, a new step begins where a kernel starts more than
 * gap ns after every kernel before it has ended (the host's round trip
 * between steps; inside a step the kernels follow within a few us). The
 * last step's indices into idx (order: scratch for n), returns how many. */
static inline int tl_last_step_by_gap(const uint64_t *start, const uint64_t *end, int n, uint64_t gap, int *idx,
                                      int *order)
{
    if (n < 1)
        return 0;
    tl_by_start(start, n, order);
    int first = 0;
    uint64_t front = end[order[0]];
    for (int j = 1; j < n; j++) {
        const int i = order[j];
        if (start[i] > front && start[i] - front > gap)
            first = j;
        if (end[i] > front)
            front = end[i];
    }
    for (int j = first; j < n; j++)
        idx[j - first] = order[j];
    return n - first;
}

#endif
