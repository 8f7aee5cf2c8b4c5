#!/usr/bin/env python3
"""render_goldens.py - renders every chat case through the published Nemotron 3 Nano template.

Usage: tools/reference/render_goldens.py [--cases FILE] [--template FILE] [--out FILE]
Defaults (from the repository root): tests/data/render/cases.json,
tests/data/render/nemotron3-nano-chat-template.jinja, tests/data/render/goldens.json.

The jinja2 environment is built the way Hugging Face transformers builds it for
apply_chat_template (src/transformers/utils/chat_template_utils.py): an
ImmutableSandboxedEnvironment with trim_blocks=True, lstrip_blocks=True and the loopcontrols
extension; a `tojson` filter that is json.dumps(x, ensure_ascii=False, indent=None,
separators=None, sort_keys=False) (so ", " and ": " separators, key order kept, no HTML
escaping); the globals raise_exception and strftime_now. transformers also installs its
AssistantTracker extension for {% generation %} blocks; this template has none, so it is left out.

Each case is {"name", "covers", "request"}: `request` is a chat request as a client sends it,
OpenAI-shaped (messages, tools, chat_template_kwargs, add_generation_prompt) or Ollama-shaped
(messages, tools, think). template_vars() maps it to the template's variables; the C parser
(src/text/chat.c) applies the same mapping, rule for rule:

  * content: a string as is; an array of text parts joined with "\\n" (as vLLM joins them);
    null or absent on an assistant turn -> "".
  * assistant reasoning: the first of reasoning_content, reasoning (vLLM), thinking (Ollama)
    that is present and not null, passed as reasoning_content.
  * tool calls: only function.name and function.arguments reach the template. Arguments given as
    a JSON string are parsed with json.loads (vLLM does this); a string that is not valid JSON,
    null or an absent value become {} (vLLM's fallback). An empty tool_calls list is dropped.
  * tools: passed as they are (None when absent, as transformers passes them).
  * enable_thinking: chat_template_kwargs.enable_thinking, else Ollama's think (a level string
    "high"/"medium"/"low" counts as true), else not passed (the template defaults to true).
    truncate_history_thinking: chat_template_kwargs only. add_generation_prompt: top level,
    default true.
  * /think and /no_think in system or user text are cairn's own extension, applied by the C
    parser only; cases must not contain them (checked here), and tests/text/test_render.c tests
    them against hand-written expectations.

Output: a JSON array of {"name", "prompt"} in case order, written with ensure_ascii=False and
indent=1, so the file is deterministic and diffs stay readable.
"""
import argparse
import json
import os
import re
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data", "render")
TOGGLE = re.compile(r"(^|\s)/(no_)?think(?=\s|$)")


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def content_text(msg, name):
    c = msg.get("content")
    if c is None:
        if msg["role"] != "assistant":
            raise ValueError(f"{name}: {msg['role']} message without content")
        return ""
    if isinstance(c, str):
        return c
    texts = []
    for part in c:
        if isinstance(part, str):
            texts.append(part)
        elif part.get("type") in ("text", "input_text", "output_text"):
            texts.append(part["text"])
        else:
            raise ValueError(f"{name}: unsupported content part {part!r}")
    return "\n".join(texts)


def tool_arguments(a):
    if isinstance(a, str):
        try:
            a = json.loads(a)
        except json.JSONDecodeError:
            return {}
    if a is None:
        return {}
    if not isinstance(a, dict):
        raise ValueError("tool call arguments must be a JSON object")
    return a


def template_vars(req, name):
    messages = []
    for m in req["messages"]:
        role = m["role"]
        if role not in ("system", "user", "assistant", "tool"):
            raise ValueError(f"{name}: unknown role {role!r}")
        out = {"role": role, "content": content_text(m, name)}
        if role in ("system", "user") and TOGGLE.search(out["content"]):
            raise ValueError(f"{name}: /think and /no_think are tested in C, not in goldens")
        if role == "assistant":
            for key in ("reasoning_content", "reasoning", "thinking"):
                if m.get(key) is not None:
                    out["reasoning_content"] = m[key]
                    break
            calls = m.get("tool_calls") or []
            if calls:
                out["tool_calls"] = [{"function": {
                    "name": tc["function"]["name"],
                    "arguments": tool_arguments(tc["function"].get("arguments"))}}
                    for tc in calls]
        messages.append(out)
    kwargs = {}
    ctk = req.get("chat_template_kwargs") or {}
    if "enable_thinking" in ctk:
        kwargs["enable_thinking"] = ctk["enable_thinking"]
    elif req.get("think") is not None:
        kwargs["enable_thinking"] = req["think"] in (True, "high", "medium", "low")
    if "truncate_history_thinking" in ctk:
        kwargs["truncate_history_thinking"] = ctk["truncate_history_thinking"]
    return dict(messages=messages, tools=req.get("tools"),
                add_generation_prompt=req.get("add_generation_prompt", True), **kwargs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=os.path.join(DATA, "cases.json"))
    ap.add_argument("--template", default=os.path.join(DATA, "nemotron3-nano-chat-template.jinja"))
    ap.add_argument("--out", default=os.path.join(DATA, "goldens.json"))
    args = ap.parse_args()
    with open(args.template, encoding="utf-8") as f:
        template = make_env().from_string(f.read())
    with open(args.cases, encoding="utf-8") as f:
        cases = json.load(f)
    names = set()
    goldens = []
    for case in cases:
        name = case["name"]
        if name in names:
            sys.exit(f"render_goldens.py: duplicate case name {name}")
        names.add(name)
        prompt = template.render(**template_vars(case["request"], name))
        goldens.append({"name": name, "prompt": prompt})
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(json.dumps(goldens, ensure_ascii=False, indent=1))
        f.write("\n")
    print(f"render_goldens.py: {len(goldens)} cases -> {args.out} (jinja2 {jinja2.__version__})")


if __name__ == "__main__":
    main()
