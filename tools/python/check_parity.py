#!/usr/bin/env python3
"""Run tests/parity-smoke.json through sanctum-run and compare with the
transformers references (standard library only).

For each prompt: the engine gets the reference prompt_ids (--ids), generates
greedily (--temperature 0, --max-tokens 32) and must produce ref_ids exactly;
the decoded answer must contain expect_substring. Prints one line per prompt
and ends with "N passed, N failed".

Usage: python3 tools/python/check_parity.py [--bin build/sanctum-run] [--model models/default]
                                            [--battery tests/parity-smoke.json] [--backend cpu|cuda]
"""

import argparse
import json
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/sanctum-run")
    ap.add_argument("--model", default="models/default")
    ap.add_argument("--battery", default="tests/parity-smoke.json")
    ap.add_argument("--backend", default="cpu")
    args = ap.parse_args()
    with open(args.battery, encoding="utf-8") as f:
        battery = json.load(f)
    eos = set(battery["eos_token_ids"])
    passed = failed = 0
    for i, p in enumerate(battery["prompts"]):
        cmd = [args.bin, "--model", args.model, "--backend", args.backend, "--ids",
               ",".join(map(str, p["prompt_ids"])), "--print-ids", "--temperature", "0",
               "--max-tokens", str(battery["max_new_tokens"])]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            print(f"FAIL {i}: sanctum-run exited {r.returncode}: {r.stderr.strip()[:300]}")
            failed += 1
            continue
        got = [int(t) for t in r.stdout.split()]
        want = p["ref_ids"]
        # The engine may or may not print the EOS that stopped it; compare up to it.
        body_got = [t for t in got if t not in eos]
        body_want = [t for t in want if t not in eos]
        ok = body_got == body_want
        if ok:
            passed += 1
            print(f"ok   {i}: {p['messages'][-1]['content']!r} -> {p['ref_text']!r}")
        else:
            failed += 1
            print(f"FAIL {i}: {p['messages'][-1]['content']!r}: got {got} want {want}")
        # Single user message: also let the engine render the chat template and
        # tokenize itself (--prompt), which must give the same tokens.
        if len(p["messages"]) == 1 and p["messages"][0]["role"] == "user":
            cmd2 = [a for a in cmd]
            k = cmd2.index("--ids")
            cmd2[k:k + 2] = ["--prompt", p["messages"][0]["content"]]
            r2 = subprocess.run(cmd2, capture_output=True, text=True, timeout=300)
            got2 = [int(t) for t in r2.stdout.split()] if r2.returncode == 0 else None
            if got2 is not None and [t for t in got2 if t not in eos] == body_want:
                passed += 1
                print(f"ok   {i}: --prompt (engine's own template + tokenizer) gives the same tokens")
            else:
                failed += 1
                print(f"FAIL {i}: --prompt path: rc {r2.returncode} got {got2} want {want} {r2.stderr.strip()[:200]}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
