#!/usr/bin/env python3
"""Warp stall samples per SASS instruction, from ncu's source page.

On the GPU box, after `ncu --set full -o REP ...`:
    ncu -i REP.ncu-rep --page source --csv --print-source sass > src.csv
Here:
    tools/python/ncu_sass.py src.csv KERNEL [--nth N] [--top K] [--regions a:0,b:600,...]

KERNEL is a substring of the kernel's name (the N-th match, default 0). It
prints the kernel's samples by stall reason, the instructions with the most
samples (index, samples, executions, SASS, two main reasons) and, with
--regions, samples and executed instructions summed over index ranges (each
name starts at its index and runs to the next one's). Run 33 of
docs/PERFORMANCE.md read k_attn_decode_gqa and the MoE pair this way.
"""
import argparse
import csv
import sys


def kernels(path):
    """[(name, header, rows)] in file order."""
    out, cur, hdr = [], None, None
    with open(path, newline='') as f:
        for r in csv.reader(f):
            if len(r) >= 2 and r[0] == 'Kernel Name':
                cur = [r[1], None, []]
                out.append(cur)
                hdr = None
            elif r and r[0] == 'Address' and cur is not None:
                hdr = {k: i for i, k in enumerate(r)}
                cur[1] = hdr
            elif cur is not None and hdr and len(r) > len(hdr) // 2:
                cur[2].append(r)
    return out


def num(r, h, key):
    v = r[h[key]] if key in h and h[key] < len(r) else ''
    try:
        return int(v.replace(',', ''))
    except ValueError:
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('csv')
    ap.add_argument('kernel')
    ap.add_argument('--nth', type=int, default=0)
    ap.add_argument('--top', type=int, default=25)
    ap.add_argument('--regions', default='')
    a = ap.parse_args()
    ks = [k for k in kernels(a.csv) if a.kernel in k[0]]
    if len(ks) <= a.nth:
        sys.exit('ncu_sass: %d kernels match %r' % (len(ks), a.kernel))
    name, h, rows = ks[a.nth]
    stalls = [c for c in h if c.startswith('stall_') and 'Not Issued' not in c]
    tot = sum(num(r, h, '# Samples') for r in rows) or 1
    print('%s\n%d instructions, %d samples' % (name[:160], len(rows), tot))
    by = {s: sum(num(r, h, s) for r in rows) for s in stalls}
    print(' '.join('%s %.1f%%' % (s[6:], 100.0 * v / tot) for s, v in sorted(by.items(), key=lambda x: -x[1]) if v))
    if a.regions:
        marks = []
        for part in a.regions.split(','):
            nm, _, st = part.partition(':')
            marks.append((int(st), nm))
        marks.sort()
        for j, (st, nm) in enumerate(marks):
            en = marks[j + 1][0] if j + 1 < len(marks) else len(rows)
            smp = sum(num(r, h, '# Samples') for r in rows[st:en])
            ex = sum(num(r, h, 'Instructions Executed') for r in rows[st:en])
            print('%-12s [%5d, %5d) %6.1f%% of samples, %9d warp instructions executed' % (nm, st, en,
                                                                                          100.0 * smp / tot, ex))
    top = sorted(range(len(rows)), key=lambda i: -num(rows[i], h, '# Samples'))[:a.top]
    for i in sorted(top):
        r = rows[i]
        why = sorted(((num(r, h, s), s[6:]) for s in stalls), reverse=True)[:2]
        print('%5d %6d %9d  %-58s %s' % (i, num(r, h, '# Samples'), num(r, h, 'Instructions Executed'),
                                         r[h['Source']].strip()[:58], ' '.join('%s:%d' % (b, v) for v, b in why if v)))


if __name__ == '__main__':
    main()
