#!/usr/bin/env python3
"""Builds tests/fixtures/tokenizer/corpus.txt.gz: a deterministic ~250 KB
stress corpus for the tokenizer tests (make_tok_refs.py then records, per
chunk, the ids Hugging Face tokenizers / tiktoken produce).

Contents: sanctum's own tokenizer sources (code: indentation, operators,
escapes, special-token text), the GPL-3 text (verbatim copying allowed), and
seeded pseudo-text drawn from many scripts: Latin with composed and
decomposed accents, Greek, Cyrillic, Arabic and Hebrew with marks,
Devanagari/Bengali/Tamil/Thai, CJK, Hangul (syllables and jamo), emoji with
ZWJ/skin tones/flags/keycaps, digits of several scripts, contractions in
mixed case, and whitespace of every kind (tabs, NBSP, ideographic space,
CRLF, NEL, LS/PS, long runs).

Usage: python3 tools/python/make_tok_corpus.py   (run from the repo root)
"""
import glob
import gzip
import os
import random

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def rand_from(r, ranges, k):
    out = []
    for _ in range(k):
        lo, hi = r.choice(ranges)
        out.append(chr(r.randint(lo, hi)))
    return "".join(out)


SCRIPTS = {
    "latin": [(0x61, 0x7A), (0x41, 0x5A), (0xE0, 0xFF), (0x100, 0x17F)],
    "greek": [(0x3B1, 0x3C9), (0x391, 0x3A9), (0x1F00, 0x1F15)],
    "cyrillic": [(0x430, 0x44F), (0x410, 0x42F)],
    "arabic": [(0x627, 0x64A), (0x64B, 0x652)],
    "hebrew": [(0x5D0, 0x5EA), (0x5B0, 0x5BC)],
    "devanagari": [(0x915, 0x939), (0x93E, 0x94D)],
    "bengali": [(0x995, 0x9B9), (0x9BE, 0x9CC)],
    "tamil": [(0xB95, 0xBB9), (0xBBE, 0xBCD)],
    "thai": [(0xE01, 0xE2E), (0xE31, 0xE3A), (0xE47, 0xE4E)],
    "cjk": [(0x4E00, 0x9FFF)],
    "kana": [(0x3041, 0x3096), (0x30A1, 0x30FA)],
    "hangul": [(0xAC00, 0xD7A3)],
    "jamo": [(0x1100, 0x1112), (0x1161, 0x1175), (0x11A8, 0x11C2)],
}
EMOJI = ["😀", "🎉", "👍🏽", "👨\u200d👩\u200d👧\u200d👦", "🇯🇵", "🇺🇸", "1\ufe0f\u20e3", "❤\ufe0f", "🏳\ufe0f\u200d🌈", "🧑🏿\u200d💻"]
WS = [" ", "  ", "   ", "\t", "\t\t", "\n", "\r\n", "\n\n", " \n ", "\u00a0", "\u3000", "\u2003", "\u0085", "\u2028", "\u2029",
      "        ", " \t \t"]
PUNCT = [".", ",", "!", "?", "...", ";", ":", "—", "–", "«", "»", "“", "”", "(", ")", "[", "]", "{", "}", "'", "\"", "/", "\\",
         "@", "#", "$", "%", "^", "&", "*", "+", "=", "<", ">", "|", "~", "`", "¿", "¡", "。", "、", "！", "？"]
WORDS = ["the", "The", "THE", "don't", "DON'T", "I'm", "you're", "they've", "we'll", "she'd", "it's", "IT'S", "John's",
         "o'clock", "rock'n'roll", "cafe\u0301", "café", "naïve", "nai\u0308ve", "Ångström", "A\u030angstro\u0308m",
         "ﬁne", "Ｆｕｌｌ", "x²", "½", "Ⅻ", "http://example.com/a?b=1&c=2", "user@mail.org", "snake_case", "CamelCase",
         "__init__", "0x7FFF", "3.14159", "1,000,000", "٣٤٥", "८९", "٠١"]


def pseudo(r, lines):
    out = []
    for _ in range(lines):
        parts = []
        for _ in range(r.randint(3, 25)):
            x = r.random()
            if x < 0.35:
                parts.append(rand_from(r, SCRIPTS[r.choice(list(SCRIPTS))], r.randint(1, 12)))
            elif x < 0.55:
                parts.append(r.choice(WORDS))
            elif x < 0.65:
                parts.append(str(r.randint(0, 10 ** r.randint(1, 12))))
            elif x < 0.72:
                parts.append(r.choice(EMOJI) * r.randint(1, 3))
            elif x < 0.85:
                parts.append(r.choice(PUNCT) * r.randint(1, 3))
            else:
                parts.append(r.choice(WS))
            parts.append(r.choice([" ", " ", " ", "", r.choice(WS)]))
        out.append("".join(parts))
    return "\n".join(out) + "\n"


def main():
    r = random.Random(20261129)
    pieces = []
    for p in sorted(glob.glob(os.path.join(ROOT, "src", "tok", "*.[ch]"))):
        pieces.append(open(p, encoding="utf-8").read())
    gpl = "/usr/share/common-licenses/GPL-3"
    if os.path.exists(gpl):
        pieces.append(open(gpl, encoding="utf-8").read())
    pieces.append(pseudo(r, 1500))
    text = "\n".join(pieces)
    out = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "corpus.txt.gz")
    with gzip.GzipFile(out, "wb", mtime=0) as f:
        f.write(text.encode("utf-8"))
    print("wrote %s: %d characters, %d bytes" % (out, len(text), len(text.encode("utf-8"))))


if __name__ == "__main__":
    main()
