#!/usr/bin/env python3
"""Reference token ids for tests/test_tok.c, made with the Hugging Face
`tokenizers` library (the oracle sanctum's tokenizer must match exactly).

Reads tests/fixtures/tokenizer/strings.json (a list of strings) and the
vendored Qwen3 tokenizer (tests/fixtures/tokenizer/qwen3/tokenizer.json.gz)
and writes, next to them:

  qwen3_refs.json     [{"text", "ids"}]  the file as shipped
  qwen3_pm_refs.json  [{"text", "ids"}]  the same vocabulary with the Qwen3.5
                      pre-tokenizer regex (\\p{M} joins letters), made by
                      editing the Split pattern exactly as test_tok.c does

Both use encode(text, add_special_tokens=False), i.e. special tokens written
in the text are matched (sanctum's parse_special = true).

Usage (on the GPU box, tokenizers >= 0.20):
  python3 tools/python/make_tok_refs.py [--root REPO_ROOT]
"""
import argparse
import gzip
import json
import os
import sys

QWEN3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                  r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def refs(tok, strings):
    out = []
    for s in strings:
        ids = tok.encode(s, add_special_tokens=False).ids
        out.append({"text": s, "ids": ids})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    a = ap.parse_args()
    import tokenizers
    from tokenizers import Tokenizer

    fx = os.path.join(a.root, "tests", "fixtures", "tokenizer")
    strings = json.load(open(os.path.join(fx, "strings.json"), encoding="utf-8"))
    raw = gzip.open(os.path.join(fx, "qwen3", "tokenizer.json.gz")).read().decode("utf-8")
    spec = json.loads(raw)
    split = spec["pre_tokenizer"]["pretokenizers"][0]
    if split["pattern"]["Regex"] != QWEN3_PATTERN:
        sys.exit("unexpected Qwen3 Split pattern: %r" % split["pattern"]["Regex"])

    tok = Tokenizer.from_str(raw)
    r3 = refs(tok, strings)
    split["pattern"]["Regex"] = QWEN35_PATTERN
    tok_pm = Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
    rpm = refs(tok_pm, strings)

    for name, data in (("qwen3_refs.json", r3), ("qwen3_pm_refs.json", rpm)):
        with open(os.path.join(fx, name), "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=0)
            f.write("\n")
        print("wrote %s (%d strings, tokenizers %s)" % (name, len(data), tokenizers.__version__))
    diff = sum(1 for x, y in zip(r3, rpm) if x["ids"] != y["ids"])
    print("strings whose ids differ between the two patterns: %d" % diff)


if __name__ == "__main__":
    main()
