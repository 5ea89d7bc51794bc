#!/usr/bin/env python3
"""Chat-template reference renderings for the C renderer (src/tok, sn_chat_render).

Renders ~12 conversations per format with the real templates in
tools/python/templates/ using jinja2 configured exactly as transformers'
apply_chat_template configures it (sandboxed environment, trim_blocks,
lstrip_blocks, loopcontrols, its tojson / raise_exception / strftime_now).
With --check-transformers (on the GPU box) every rendering is also produced
by transformers itself and must match byte for byte.

Writes tests/fixtures/chat/<format>.json: a list of
    {"messages", "add_generation_prompt", "enable_thinking", "text"}
(mistral entries also carry "today": the date the default system prompt
embeds, since that template calls strftime_now).

Usage: python3 tools/python/make_chat_refs.py [--out tests/fixtures/chat] [--check-transformers]
"""

import argparse
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "templates")
FIXED_TODAY = "2026-01-01"

SPECIAL = {
    "qwen3_5": {"bos_token": None, "eos_token": "<|im_end|>"},
    "qwen2": {"bos_token": None, "eos_token": "<|im_end|>"},
    "mistral": {"bos_token": "<s>", "eos_token": "</s>"},
}


def U(c):
    return {"role": "user", "content": c}


def A(c):
    return {"role": "assistant", "content": c}


def S(c):
    return {"role": "system", "content": c}


UNI = "Héllo wörld — 你好, ça va? 🙂\nSecond line\ttab"

CASES = {
    "qwen3_5": [
        ([U("Hello")], True, False),
        ([U("Hello")], True, True),
        ([S("You are a helpful assistant."), U("What is 2+2? Respond with only the number.")], True, False),
        ([U("What is 17+25?"), A("42"), U("Now add 8 to that.")], True, False),
        ([U("Think about it: 3*3?"), A("<think>\n3*3 is 9.\n</think>\n\n9"), U("And 4*4?")], True, False),
        ([U("Say hi."), A("hi")], False, False),
        ([U("Why?"), A("<think>\nbecause\n</think>\n\nBecause.")], False, False),
        ([S("  padded system \n"), U("  padded user text \n\n")], True, False),
        ([U(UNI)], True, False),
        ([S(""), U("empty system")], True, False),
        ([U("first"), U("second in a row")], True, True),
        ([S("Be brief."), U("a"), A("b"), U("c"), A("d"), U("e")], True, True),
        ([U("history with empty answer"), A(""), U("again")], True, False),
    ],
    "qwen2": [
        ([U("Hello")], True, False),
        ([S("You are a helpful assistant."), U("Hello")], True, False),
        ([U("What is 17+25?"), A("42"), U("Now add 8 to that.")], True, False),
        ([U("Say hi."), A("hi")], False, False),
        ([U("a"), A("b"), S("A later system message."), U("c")], True, False),
        ([U(UNI)], True, False),
        ([U("  spaces are kept  \n")], True, False),
        ([U("no generation prompt")], False, False),
        ([S(""), U("empty system")], True, False),
        ([S("Be brief."), U("a"), A("b"), U("c"), A("d"), U("e")], True, False),
        ([U("<think>\nnot special here\n</think>\n\nok")], True, False),
        ([U("first"), U("second in a row")], True, False),
    ],
    "mistral": [
        ([S("You are a helpful assistant."), U("Hello")], True, False),
        ([U("Hello")], True, False),
        ([S("Be brief."), U("What is 17+25?"), A("42"), U("Now add 8 to that.")], True, False),
        ([S("Be brief."), U("Say hi."), A("hi")], False, False),
        ([S("sys"), U(UNI)], True, False),
        ([S("sys"), U("  spaces are kept  \n")], True, False),
        ([S("sys"), U("no generation prompt")], False, False),
        ([S(""), U("empty system")], True, False),
        ([S("Be brief."), U("a"), A("b"), U("c"), A("d"), U("e")], True, False),
        ([U("a"), A("b"), U("c")], True, False),
        ([S("multi\nline\n\nsystem"), U("x")], True, False),
        ([S("sys"), U("[INST] literal brackets [/INST]")], True, False),
    ],
}


def load_template(fmt):
    with open(os.path.join(TEMPLATES, f"{fmt}.jinja"), encoding="utf-8") as f:
        return f.read()


def make_env(today):
    """The environment transformers builds in chat_template_utils."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        # fixed so the reference is reproducible; the real one uses datetime.now()
        assert fmt == "%Y-%m-%d", fmt
        return today

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


_COMPILED = {}


def render(fmt, messages, add_generation_prompt, enable_thinking, today=FIXED_TODAY):
    key = (fmt, today)
    if key not in _COMPILED:  # compiling the template costs ~30 ms; rendering is cheap
        _COMPILED[key] = make_env(today).from_string(load_template(fmt))
    tpl = _COMPILED[key]
    kw = dict(SPECIAL[fmt])
    return tpl.render(messages=messages, tools=None, documents=None,
                      add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking, **kw)


def render_transformers(fmt, messages, add_generation_prompt, enable_thinking):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    sp = SPECIAL[fmt]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<|im_end|>": 3}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    kw = {"unk_token": "<unk>", "eos_token": sp["eos_token"]}
    if sp["bos_token"]:
        kw["bos_token"] = sp["bos_token"]
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, **kw)
    return tok.apply_chat_template(messages, chat_template=load_template(fmt), tokenize=False,
                                   add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/chat")
    ap.add_argument("--check-transformers", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    mismatches = 0
    for fmt, cases in CASES.items():
        out = []
        for messages, gen, think in cases:
            text = render(fmt, messages, gen, think)
            entry = {"messages": messages, "add_generation_prompt": gen, "enable_thinking": think, "text": text}
            if fmt == "mistral":
                entry["today"] = FIXED_TODAY
            if args.check_transformers:
                import datetime
                ref = render_transformers(fmt, messages, gen, think)
                if fmt == "mistral":
                    real = datetime.datetime.now().strftime("%Y-%m-%d")
                    ref = ref.replace(f"The current date is {real}.", f"The current date is {FIXED_TODAY}.")
                if ref != text:
                    mismatches += 1
                    print(f"MISMATCH {fmt}: {json.dumps(messages)[:200]}\n  jinja2:       {text!r}\n"
                          f"  transformers: {ref!r}", flush=True)
            out.append(entry)
        path = os.path.join(args.out, f"{fmt}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1, ensure_ascii=False)
            f.write("\n")
        print(f"{fmt}: {len(out)} renderings -> {path}", flush=True)
    if args.check_transformers:
        print(f"transformers check: {mismatches} mismatches", flush=True)
    sys.exit(1 if mismatches else 0)


if __name__ == "__main__":
    main()
