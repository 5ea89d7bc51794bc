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
  corpus_refs.json    for corpus.txt.gz (make_tok_corpus.py) cut into ~2 KB
                      chunks at newlines: {"chunks": [[offset, length]...],
                      "qwen3": [[n_ids, fnv]...], "tekken": [[n_ids, fnv]...]}
                      where fnv is FNV-1a 64 (hex) over the ids as
                      little-endian uint32, so a mismatch names its chunk
  tekken_refs.json    [{"text", "ids"}]  a tekken.json built from the Qwen3
                      vocabulary (rank = id, 1000 control tokens, the tekken
                      pattern; test_tok.c builds the same file), encoded by
                      mistral_common's Tekkenizer, else by tiktoken (the same
                      algorithm); skipped when neither is installed

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


TEKKEN_PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
                  r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
                  r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN_SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"]
N_SPECIAL = 1000


def byte_level_inverse():
    inv, extra = {}, 0
    for b in range(256):
        if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF:
            inv[chr(b)] = b
        else:
            inv[chr(256 + extra)] = b
            extra += 1
    return inv


def tekken_refs(spec, strings, fx):
    """Qwen3's model vocabulary as a tekken.json; reference ids from
    mistral_common (or tiktoken, which implements the same rank BPE)."""
    import base64
    import tempfile
    inv = byte_level_inverse()
    vocab = spec["model"]["vocab"]
    ranks = {}
    for tok, i in vocab.items():
        ranks[bytes(inv[c] for c in tok)] = i
    n = len(vocab)
    assert sorted(ranks.values()) == list(range(n))
    tk = {
        "config": {"pattern": TEKKEN_PATTERN, "num_vocab_tokens": n, "default_vocab_size": n + N_SPECIAL,
                   "default_num_special_tokens": N_SPECIAL, "version": "v7"},
        "vocab": [{"rank": r, "token_bytes": base64.b64encode(b).decode(), "token_str": None}
                  for b, r in sorted(ranks.items(), key=lambda x: x[1])],
        "special_tokens": [{"rank": i, "token_str": s, "is_control": True} for i, s in enumerate(TEKKEN_SPECIALS)],
    }
    try:
        from mistral_common.tokens.tokenizers.tekken import Tekkenizer
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(tk, f)
        t = Tekkenizer.from_file(f.name)
        enc, how = (lambda s: t.encode(s, bos=False, eos=False)), "mistral_common"
    except ImportError:
        try:
            import tiktoken
        except ImportError:
            print("tekken_refs.json skipped: neither mistral_common nor tiktoken is installed")
            return None
        e = tiktoken.Encoding(name="qwen3-vocab-tekken", pat_str=TEKKEN_PATTERN, mergeable_ranks=ranks,
                              special_tokens={})
        enc, how = (lambda s: [r + N_SPECIAL for r in e.encode_ordinary(s)]), "tiktoken " + tiktoken.__version__
    out = [{"text": s, "ids": enc(s)} for s in strings]
    with open(os.path.join(fx, "tekken_refs.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print("wrote tekken_refs.json (%d strings, %s)" % (len(out), how))
    return enc


def fnv_ids(ids):
    h = 0xcbf29ce484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def corpus_chunks(raw, size=2048):
    chunks, off = [], 0
    while off < len(raw):
        nl = raw.find(b"\n", off + size)
        end = len(raw) if nl < 0 else nl + 1
        chunks.append((off, end - off))
        off = end
    return chunks


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
    split["pattern"]["Regex"] = QWEN3_PATTERN
    tekken_enc = tekken_refs(spec, strings, fx)

    cpath = os.path.join(fx, "corpus.txt.gz")
    if os.path.exists(cpath):
        raw = gzip.open(cpath).read()
        chunks = corpus_chunks(raw)
        out = {"chunks": [list(c) for c in chunks], "qwen3": [], "tekken": []}
        for off, n in chunks:
            t = raw[off:off + n].decode("utf-8")
            ids = tok.encode(t, add_special_tokens=False).ids
            out["qwen3"].append([len(ids), fnv_ids(ids)])
            if tekken_enc:
                ids = tekken_enc(t)
                out["tekken"].append([len(ids), fnv_ids(ids)])
        with open(os.path.join(fx, "corpus_refs.json"), "w") as f:
            json.dump(out, f)
            f.write("\n")
        print("wrote corpus_refs.json (%d chunks, %d bytes)" % (len(chunks), len(raw)))


if __name__ == "__main__":
    main()
