#!/usr/bin/env python3
"""Reference renderings of chat templates WITH tools and tool calls, for
tests/test_chat.c (the tokenizer area's fixture; make_chat_refs.py covers
plain conversations).

Renders with the real templates in tools/python/templates/ through the
jinja2 environment transformers builds (make_chat_refs.make_env: sandbox,
trim_blocks, lstrip_blocks, its tojson = json.dumps(ensure_ascii=False)).
With --check-transformers (GPU box) every case is also rendered by
transformers' apply_chat_template and must match byte for byte.

Writes tests/fixtures/tokenizer/chat_tools.json: a list of
  {"format", "messages", "tools", "add_generation_prompt", "enable_thinking", "today", "text"}
Messages use the OpenAI shape: assistant "tool_calls": [{"id", "type",
"function": {"name", "arguments": {...}}}], tool messages "tool_call_id".

Usage: python3 tools/python/make_chat_tool_refs.py [--check-transformers]
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_chat_refs as base  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather — in °C",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer", "minimum": 1}},
                   "required": ["city"]}}}
CALC = {"type": "function", "function": {
    "name": "calc", "description": "Evaluate \"expr\"\n(multi-line)\tand\\escapes",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"},
                                                    "precision": {"type": "number", "default": 0.5},
                                                    "tags": {"type": "array", "items": {}}}}}}
TOOLS = [WEATHER, CALC]


def U(c): return {"role": "user", "content": c}
def A(c): return {"role": "assistant", "content": c}
def S(c): return {"role": "system", "content": c}
def T(c, cid=None):
    m = {"role": "tool", "content": c}
    if cid:
        m["tool_call_id"] = cid
    return m


def TC(name, args, cid=None):
    c = {"type": "function", "function": {"name": name, "arguments": args}}
    if cid:
        c["id"] = cid
    return c


def AT(content, calls):
    return {"role": "assistant", "content": content, "tool_calls": calls}


ODD_ARGS = {"expr": "1+1\nthen \"quote\"", "nested": {"a": [1, 2.5, {"b": None}], "flag": True, "empty": {}},
            "list": [], "f": 1e-07, "big": 1e16, "mid": 123456789.125, "neg": -0.0, "i": -42,
            "uni": "naïve 你好 \u2028 \u0007", "t": False, "n": None, "x": 0.1}

CASES = [
    ("qwen3_5", [U("weather in Paris?")], TOOLS, True, False),
    ("qwen3_5", [S("Be brief."), U("weather?")], TOOLS, True, True),
    ("qwen3_5", [S("   "), U("x")], [CALC], True, False),
    ("qwen3_5", [U("weather?"), AT("", [TC("get_weather", {"city": "Paris", "days": 3})]),
                 T("sunny, 21°C"), T("{\"ok\": true}")], TOOLS, True, False),
    ("qwen3_5", [U("calc"), AT("Let me check.", [TC("calc", ODD_ARGS), TC("get_weather", {"city": "Oslo"})])],
     TOOLS, False, False),
    ("qwen3_5", [U("a"), AT("<think>\nplan\n</think>\n\n", [TC("calc", {"expr": "2"})]), T("2"), A("It is 2.")],
     TOOLS, False, False),
    ("qwen3_5", [U("no tools but a call"), AT(None, [TC("calc", {"expr": "x", "tags": ["a", 1]})])], None, True, False),
    ("qwen2", [U("weather in Paris?")], TOOLS, True, False),
    ("qwen2", [S("Custom system."), U("weather?")], TOOLS, True, False),
    ("qwen2", [U("weather?"), AT("", [TC("get_weather", {"city": "Paris", "days": 3})]), T("sunny"), T("windy"),
               A("Sunny and windy.")], TOOLS, False, False),
    ("qwen2", [U("calc"), AT("Checking", [TC("calc", ODD_ARGS), TC("get_weather", {"city": "Oslo"})])], None, True, False),
    ("mistral", [S("sys"), U("weather in Paris?")], TOOLS, True, False),
    ("mistral", [S("sys"), U("weather?"), AT("", [TC("get_weather", {"city": "Paris"}, "abc123XYZ")]),
                 T("sunny", "abc123XYZ"), A("It is sunny."), U("and tomorrow?")], TOOLS, True, False),
    ("mistral", [S("sys"), U("hi"), A("hello"), U("hi")], [CALC], True, False),
    ("mistral", [U("calc"), AT("", [TC("calc", ODD_ARGS, "A1b2C3d4E"), TC("calc", {"expr": "3"}, "zzzzzzzzz")]),
                 T("2", "A1b2C3d4E"), T("3", "zzzzzzzzz")], None, True, False),
]


def render(fmt, messages, tools, gen, think):
    tpl = base.make_env(base.FIXED_TODAY).from_string(base.load_template(fmt))
    return tpl.render(messages=messages, tools=tools, documents=None, add_generation_prompt=gen,
                      enable_thinking=think, **base.SPECIAL[fmt])


def render_transformers(fmt, messages, tools, gen, think):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    sp = base.SPECIAL[fmt]
    tk = Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2, "<|im_end|>": 3}, unk_token="<unk>"))
    kw = {"unk_token": "<unk>", "eos_token": sp["eos_token"]}
    if sp["bos_token"]:
        kw["bos_token"] = sp["bos_token"]
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, **kw)
    return tok.apply_chat_template(messages, tools=tools, chat_template=base.load_template(fmt), tokenize=False,
                                   add_generation_prompt=gen, enable_thinking=think)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(HERE, "..", "..", "tests", "fixtures", "tokenizer", "chat_tools.json"))
    ap.add_argument("--check-transformers", action="store_true")
    a = ap.parse_args()
    out, bad = [], 0
    for fmt, msgs, tools, gen, think in CASES:
        text = render(fmt, msgs, tools, gen, think)
        if a.check_transformers:
            import datetime
            ref = render_transformers(fmt, msgs, tools, gen, think)
            real = datetime.datetime.now().strftime("%Y-%m-%d")
            ref = ref.replace(f"The current date is {real}.", f"The current date is {base.FIXED_TODAY}.")
            if ref != text:
                bad += 1
                print(f"MISMATCH {fmt}: {text!r}\n  transformers: {ref!r}")
        out.append({"format": fmt, "messages": msgs, "tools": tools, "add_generation_prompt": gen,
                    "enable_thinking": think, "today": base.FIXED_TODAY, "text": text})
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{len(out)} tool renderings -> {a.out}" + (f"; transformers mismatches: {bad}" if a.check_transformers else ""))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
