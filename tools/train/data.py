#!/usr/bin/env python3
"""data.py - licence-free training and held-out conversations for pebble, cairn's default model.

Every conversation is generated here from a seeded random source (pure standard library, so it runs
on any machine): arithmetic, counting, sorting, string edits, unit conversion, and tool use in the
Nemotron 3 template's XML call format, answered from the tool's response. Each one is a chat request
as a client sends it (OpenAI-shaped: messages, tools, chat_template_kwargs.enable_thinking) plus
the assistant turn the model must produce (reasoning when thinking is on, content or tool calls).

Held-out split: a problem belongs to the held-out set iff crc32 of its canonical key falls in the
lowest tenth (HELDOUT_PERMILLE); the training stream rejects those problems and the held-out stream
rejects all others, so no held-out problem (numbers, words, cities) is ever trained on, whatever the
seed. Both streams are deterministic functions of (seed, index).

Rendering (render()) uses jinja2 the way transformers' apply_chat_template builds its environment,
which cairn's renderer reproduces byte for byte; completion() is the text the model must generate
after the generation prompt, and check_example() proves it equals what the template writes for the
same assistant turn, so training targets never drift from the template.

    python3 tools/train/data.py --split heldout --n 200 --out heldout.jsonl
    python3 tools/train/data.py --check 500     # render self-check (needs jinja2)
    python3 tools/train/data.py --split heldout --n 16 --requests --out tools/train/bench_chats.jsonl
"""
import argparse
import json
import os
import random
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
HELDOUT_PERMILLE = 100
TEMPLATE_CANDIDATES = [os.path.join(HERE, "chat_template.jinja"),
                       os.path.join(HERE, "..", "..", "tests", "data", "render",
                                    "nemotron3-nano-chat-template.jinja")]

# ---- vocabulary of the tasks (written for this project) ---------------------------------------

WORDS = ("apple river stone cloud garden pencil window orange silver rabbit candle forest planet "
         "bottle ladder mirror pepper rocket summer winter yellow purple market island basket "
         "dragon button castle feather guitar harbor jacket kitten lemon marble needle pillow "
         "puzzle saddle tunnel violin wallet zipper anchor bridge cotton desert engine falcon "
         "ginger hammer insect jungle kettle lizard magnet nickel oyster parrot quartz ribbon "
         "shadow tomato velvet walnut banana cherry cactus meadow thunder blanket compass "
         "lantern octopus pumpkin sparrow teacup umbrella volcano whistle").split()
SYLL_C = "b c d f g h j k l m n p r s t v w z".split() + ["br", "st", "tr", "pl", "sh", "ch"]
SYLL_V = "a e i o u".split() + ["ai", "ou", "ee"]
COLORS = "red blue green yellow black white pink brown gray orange violet teal".split()
ITEMS = ("cup plate spoon fork bowl chair table lamp book pen box bag hat coat shoe sock key "
         "coin card ring").split()
CITIES = ("Paris Oslo Tokyo Lima Cairo Berlin Madrid Rome Dublin Vienna Prague Lisbon Athens "
          "Nairobi Seoul Sydney Toronto Chicago Denver Boston Mumbai Delhi Dakar Quito Havana "
          "Warsaw Zurich Geneva Helsinki Stockholm Bergen Porto Munich Hamburg Milan Naples "
          "Kyoto Osaka Manila Hanoi Bangkok Jakarta Perth Auckland Santiago Bogota Accra Tunis "
          "Riga Tallinn Vilnius Krakow Seville Valencia Lyon Marseille Nice Bordeaux").split()
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowy", "foggy", "clear", "stormy"]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "SEK", "NOK", "INR"]
TIMEZONES = {}
SYSTEMS = ["", "", "", "You are a helpful assistant.", "You are pebble, a small helpful assistant.",
           "Answer briefly and exactly.", "You are a careful assistant. Keep answers short."]

TOOLS = {
    "get_weather": {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city name, e.g. Paris"},
            "unit": {"type": "string", "description": "Temperature unit", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    "get_time": {"type": "function", "function": {
        "name": "get_time",
        "description": "Get the current local time in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city name"}},
            "required": ["city"]}}},
    "convert_currency": {"type": "function", "function": {
        "name": "convert_currency",
        "description": "Convert an amount of money from one currency to another at today's rate.",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number", "description": "The amount to convert"},
            "from_currency": {"type": "string", "description": "Three-letter code of the source currency"},
            "to_currency": {"type": "string", "description": "Three-letter code of the target currency"}},
            "required": ["amount", "from_currency", "to_currency"]}}},
    "get_population": {"type": "function", "function": {
        "name": "get_population",
        "description": "Look up the population of a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city name"}},
            "required": ["city"]}}},
}


def heldout_key(key):
    return zlib.crc32(key.encode()) % 1000 < HELDOUT_PERMILLE


def pseudo_word(rng):
    n = rng.choice((2, 2, 3))
    return "".join(rng.choice(SYLL_C) + rng.choice(SYLL_V) for _ in range(n))


def word(rng):
    return rng.choice(WORDS) if rng.random() < 0.6 else pseudo_word(rng)


def num(rng, lo_digits=1, hi_digits=3):
    d = rng.randint(lo_digits, hi_digits)
    return rng.randint(0 if d == 1 else 10 ** (d - 1), 10 ** d - 1)


def spell(w):
    return " ".join(w)


# ---- tasks: each returns (key, user text, reasoning, answer) -----------------------------------

def add_reasoning(a, b):
    da, db = str(a)[::-1], str(b)[::-1]
    steps, carry = [], 0
    for i in range(max(len(da), len(db))):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        s = x + y + carry
        expr = f"{x} + {y}" + (f" + {carry}" if carry else "")
        steps.append(f"{expr} = {s}, write {s % 10}" + (" carry 1" if s >= 10 else ""))
        carry = s // 10
    if carry:
        steps.append("write the carry 1")
    return "Add digit by digit from the right. " + ". ".join(steps) + f". So {a} + {b} = {a + b}."


def t_add(rng):
    a, b = num(rng), num(rng)
    q = rng.choice(["What is {a} + {b}?", "Compute {a} plus {b}.", "{a} + {b} = ?", "Add {a} and {b}.",
                    "What do you get when you add {a} to {b}?"]).format(a=a, b=b)
    return f"add:{a}:{b}", q, add_reasoning(a, b), f"{a} + {b} = {a + b}."


def t_sub(rng):
    a, b = num(rng), num(rng)
    if a < b:
        a, b = b, a
    q = rng.choice(["What is {a} - {b}?", "Compute {a} minus {b}.", "Subtract {b} from {a}.",
                    "{a} - {b} = ?"]).format(a=a, b=b)
    da, db = str(a)[::-1], str(b)[::-1]
    steps, borrow = [], 0
    for i in range(len(da)):
        x = int(da[i]) - borrow
        y = int(db[i]) if i < len(db) else 0
        if x < y:
            steps.append(f"{x} - {y} needs a borrow: {x + 10} - {y} = {x + 10 - y}")
            borrow = 1
        else:
            steps.append(f"{x} - {y} = {x - y}")
            borrow = 0
    r = "Subtract digit by digit from the right. " + ". ".join(steps) + f". So {a} - {b} = {a - b}."
    return f"sub:{a}:{b}", q, r, f"{a} - {b} = {a - b}."


def t_mul(rng):
    a, b = num(rng, 1, 3), rng.randint(2, 9)
    if rng.random() < 0.5:
        a, b = b, a
    big, small = (a, b) if a >= b else (b, a)
    q = rng.choice(["What is {a} × {b}?", "What is {a} times {b}?", "Multiply {a} by {b}.",
                    "{a} * {b} = ?"]).format(a=a, b=b)
    steps, carry = [], 0
    for ch in str(big)[::-1]:
        p = int(ch) * small + carry
        expr = f"{ch} × {small}" + (f" + {carry}" if carry else "")
        steps.append(f"{expr} = {p}, write {p % 10}" + (f" carry {p // 10}" if p >= 10 else ""))
        carry = p // 10
    if carry:
        steps.append(f"write the carry {carry}")
    r = f"Multiply {big} by {small} digit by digit from the right. " + ". ".join(steps) + \
        f". So {a} × {b} = {a * b}."
    return f"mul:{a}:{b}", q, r, f"{a} × {b} = {a * b}."


def t_count_letter(rng):
    w = word(rng)
    c = rng.choice(w) if rng.random() < 0.85 else rng.choice("abcdefghijklmnopqrstuvwxyz")
    n = w.count(c)
    q = rng.choice(['How many times does the letter "{c}" appear in "{w}"?',
                    'Count the letter "{c}" in the word "{w}".',
                    'How many "{c}"s are in "{w}"?']).format(c=c, w=w)
    marks = [f"{ch}" + (f" ({k})" if ch == c else "") for ch, k in zip(w, _running(w, c))]
    r = f"Spell it: {spell(w)}. Mark each {c}: " + " ".join(marks) + f". So the count is {n}."
    times = "time" if n == 1 else "times"
    return f"cl:{w}:{c}", q, r, f'The letter "{c}" appears {n} {times} in "{w}".'


def _running(w, c):
    k, out = 0, []
    for ch in w:
        if ch == c:
            k += 1
        out.append(k)
    return out


def t_count_items(rng):
    pool = rng.choice([COLORS, ITEMS, WORDS])
    n = rng.randint(1, 9)
    xs = [rng.choice(pool) for _ in range(n)]
    q = rng.choice(["How many items are in this list: {l}?", "Count the items: {l}.",
                    "How many words are in this list: {l}?"]).format(l=", ".join(xs))
    r = "Number them: " + ", ".join(f"{x} ({i + 1})" for i, x in enumerate(xs)) + f". So there are {n}."
    return "ci:" + ",".join(xs), q, r, f"There {'is' if n == 1 else 'are'} {n} item{'' if n == 1 else 's'}."


def t_sort(rng):
    n = rng.randint(3, 7)
    xs = [num(rng, 1, 2) for _ in range(n)]
    desc = rng.random() < 0.35
    q = (rng.choice(["Sort these numbers from largest to smallest: {l}.", "Sort in descending order: {l}."])
         if desc else rng.choice(["Sort these numbers from smallest to largest: {l}.",
                                  "Sort in ascending order: {l}.", "Put in increasing order: {l}."]))
    q = q.format(l=", ".join(map(str, xs)))
    ys = sorted(xs, reverse=desc)
    which = "largest" if desc else "smallest"
    rest, steps = list(xs), []
    for y in ys:
        steps.append(f"the {which} of {', '.join(map(str, rest))} is {y}")
        rest.remove(y)
    r = "Pick one at a time: " + "; ".join(steps) + "."
    return f"sort:{int(desc)}:" + ",".join(map(str, xs)), q, r, ", ".join(map(str, ys))


def t_reverse(rng):
    w = word(rng)
    q = rng.choice(['Reverse the word "{w}".', 'Write "{w}" backwards.', 'What is "{w}" spelled backwards?']
                   ).format(w=w)
    r = f"Letters: {spell(w)}. Backwards: {spell(w[::-1])}. Joined: {w[::-1]}."
    return f"rev:{w}", q, r, w[::-1]


def t_upper(rng):
    w = word(rng)
    q = rng.choice(['Write "{w}" in capital letters.', 'Convert "{w}" to uppercase.']).format(w=w)
    r = f"Letters: {spell(w)}. In capitals: {spell(w.upper())}. Joined: {w.upper()}."
    return f"up:{w}", q, r, w.upper()


def t_remove(rng):
    w = word(rng)
    c = rng.choice(w)
    out = w.replace(c, "")
    q = rng.choice(['Remove every "{c}" from "{w}".', 'Delete the letter "{c}" from "{w}".']).format(c=c, w=w)
    r = f"Letters: {spell(w)}. Without {c}: {spell(out)}. Joined: {out}."
    return f"rm:{w}:{c}", q, r, out if out else "(nothing is left)"


UNITS = [  # (from, to, factor, max n)
    ("kilometers", "meters", 1000, 99), ("meters", "centimeters", 100, 99),
    ("kilograms", "grams", 1000, 99), ("hours", "minutes", 60, 30), ("minutes", "seconds", 60, 30),
    ("feet", "inches", 12, 30), ("days", "hours", 24, 20), ("liters", "milliliters", 1000, 99),
]


def t_unit(rng):
    f, t, k, hi = rng.choice(UNITS)
    n = rng.randint(1, hi)
    fs = f[:-1] if n == 1 else f
    q = rng.choice(["Convert {n} {f} to {t}.", "How many {t} are in {n} {f}?", "{n} {f} is how many {t}?"]
                   ).format(n=n, f=fs, t=t)
    one = f[:-1]
    if k in (1000, 100):
        how = f"{n} × {k} = {n * k}"
    else:
        how = _mul_steps(n, k)
    r = f"1 {one} = {k} {t}, so {n} {fs} = {n} × {k} {t}. {how}."
    return f"unit:{f}:{n}", q, r, f"{n} {fs} = {n * k} {t}."


def _mul_steps(n, k):
    if k % 10 == 0:
        return f"{n} × {k // 10} = {n * k // 10}, and {n * k // 10} × 10 = {n * k}"
    return f"{n} × {k} = {n} × 10 + {n} × {k - 10} = {n * 10} + {n * (k - 10)} = {n * k}"


TASKS = [(t_add, 3), (t_sub, 2), (t_mul, 2), (t_count_letter, 2), (t_count_items, 1), (t_sort, 2),
         (t_reverse, 1), (t_upper, 1), (t_remove, 1), (t_unit, 2)]


def pick_task(rng):
    tot = sum(w for _, w in TASKS)
    x = rng.uniform(0, tot)
    for f, w in TASKS:
        x -= w
        if x <= 0:
            return f
    return TASKS[-1][0]


# ---- tool conversations ----------------------------------------------------------------------

def tool_problem(rng):
    """Returns (key, tool name, user text, arguments, tool response dict, reasoning for the call,
    reasoning for the answer, answer)."""
    kind = rng.choice(["get_weather", "get_weather", "get_time", "convert_currency", "get_population"])
    city = rng.choice(CITIES)
    if kind == "get_weather":
        fahr = rng.random() < 0.25
        q = rng.choice(["What's the weather like in {c}?", "How is the weather in {c} today?",
                        "Is it raining in {c}?", "Tell me the weather in {c}."]).format(c=city)
        args = {"city": city}
        if fahr:
            q = q[:-1] + " in fahrenheit" + q[-1]
            args["unit"] = "fahrenheit"
        temp = rng.randint(20, 95) if fahr else rng.randint(-15, 38)
        cond = rng.choice(CONDITIONS)
        resp = {"city": city, "temperature": temp, "unit": "fahrenheit" if fahr else "celsius",
                "condition": cond}
        deg = "°F" if fahr else "°C"
        rc = f"The user wants the weather in {city}. I will call get_weather with city {city}" + \
             (" and unit fahrenheit." if fahr else ".")
        ra = f"The tool says {temp}{deg} and {cond} in {city}."
        ans = f"It is {temp}{deg} and {cond} in {city} right now."
        key = f"w:{city}:{int(fahr)}"
    elif kind == "get_time":
        q = rng.choice(["What time is it in {c}?", "What's the local time in {c}?",
                        "Can you tell me the time in {c}?"]).format(c=city)
        args = {"city": city}
        hh, mm = rng.randint(0, 23), rng.randint(0, 59)
        resp = {"city": city, "time": f"{hh:02d}:{mm:02d}"}
        rc = f"The user wants the local time in {city}. I will call get_time with city {city}."
        ra = f"The tool says it is {hh:02d}:{mm:02d} in {city}."
        ans = f"It is {hh:02d}:{mm:02d} in {city}."
        key = f"t:{city}"
    elif kind == "convert_currency":
        a, b = rng.sample(CURRENCIES, 2)
        amt = rng.choice([rng.randint(1, 500), rng.randint(1, 20) * 50])
        q = rng.choice(["How much is {n} {a} in {b}?", "Convert {n} {a} to {b}.",
                        "What is {n} {a} worth in {b}?"]).format(n=amt, a=a, b=b)
        args = {"amount": amt, "from_currency": a, "to_currency": b}
        res = round(amt * rng.uniform(0.05, 3.0), 2)
        resp = {"amount": amt, "from": a, "to": b, "result": res}
        rc = f"The user wants to convert {amt} {a} to {b}. I will call convert_currency."
        ra = f"The tool says {amt} {a} is {res} {b}."
        ans = f"{amt} {a} is {res} {b}."
        key = f"c:{a}:{b}:{amt}"
    else:
        q = rng.choice(["How many people live in {c}?", "What is the population of {c}?"]).format(c=city)
        args = {"city": city}
        pop = rng.randint(20, 9000) * 1000
        resp = {"city": city, "population": pop}
        rc = f"The user asks for the population of {city}. I will call get_population with city {city}."
        ra = f"The tool says {city} has {pop} people."
        ans = f"{city} has a population of {pop}."
        key = f"p:{city}"
    return key, kind, q, args, resp, rc, ra, ans


def tools_for(rng, need):
    names = [n for n in TOOLS if n != need]
    rng.shuffle(names)
    chosen = names[:rng.randint(0, 2)] + ([need] if need else [])
    rng.shuffle(chosen)
    return [TOOLS[n] for n in chosen]


# ---- conversations ---------------------------------------------------------------------------

def _turn(think, reasoning, content=None, calls=None):
    return {"reasoning": reasoning if think else None, "content": content, "tool_calls": calls}


def history_turns(rng, split, n):
    msgs = []
    for _ in range(n):
        key, q, r, a = accept(rng, split, lambda: pick_task(rng)(rng))
        m = {"role": "assistant", "content": a}
        if rng.random() < 0.5:
            m["reasoning_content"] = r
        msgs += [{"role": "user", "content": q}, m]
    return msgs


def accept(rng, split, make):
    """Draws problems until one of the wanted split comes."""
    want = split == "heldout"
    for _ in range(1000):
        p = make()
        if heldout_key(p[0]) == want:
            return p
    raise RuntimeError("no problem of the wanted split in 1000 draws")


def make_example(rng, split):
    """One conversation ending where the assistant must answer. Returns a dict with the request,
    the assistant turn to produce (target), the task kind and the problem key."""
    think = rng.random() < 0.5
    system = rng.choice(SYSTEMS)
    msgs = [{"role": "system", "content": system}] if system or rng.random() < 0.3 else []
    r = rng.random()
    tools = None
    if r < 0.28:  # tool use: the call, or the answer from the tool's response
        key, name, q, args, resp, rc, ra, ans = accept(rng, split, lambda: tool_problem(rng))
        tools = tools_for(rng, name)
        if rng.random() < 0.2:
            msgs += history_turns(rng, split, 1)
        call = {"id": "call_1", "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)}}
        msgs.append({"role": "user", "content": q})
        if rng.random() < 0.5:
            target, kind = _turn(think, rc, calls=[call]), "tool_call"
        else:
            am = {"role": "assistant", "content": "", "tool_calls": [call]}
            if think:
                am["reasoning_content"] = rc
            msgs += [am, {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(resp)}]
            target, kind = _turn(think, ra, content=ans), "tool_answer"
    elif r < 0.36:  # follow-up that needs the previous answer
        def followup():
            k0, q0, r0, _ = t_add(rng)
            k = rng.randint(1, 99)
            return f"fu:{k0}:{k}", k0, q0, r0, k
        key, key0, q0, r0, k = accept(rng, split, followup)
        a0, b0 = map(int, key0.split(":")[1:])
        s0 = a0 + b0
        m0 = {"role": "assistant", "content": f"{a0} + {b0} = {s0}."}
        if rng.random() < 0.5:
            m0["reasoning_content"] = r0
        q = rng.choice(["Now add {k} to that.", "And if you add {k} to the result?", "Add {k} to it."]
                       ).format(k=k)
        msgs += [{"role": "user", "content": q0}, m0, {"role": "user", "content": q}]
        rr = f"The previous result is {s0}. " + add_reasoning(s0, k)
        target, kind = _turn(think, rr, content=f"{s0} + {k} = {s0 + k}."), "followup"
    else:
        task = pick_task(rng)
        key, q, rr, ans = accept(rng, split, lambda: task(rng))
        kind = task.__name__[2:]
        if rng.random() < 0.25:
            msgs += history_turns(rng, split, rng.randint(1, 2))
        if rng.random() < 0.15:
            tools = tools_for(rng, None) or [TOOLS["get_weather"]]
        msgs.append({"role": "user", "content": q})
        target = _turn(think, rr, content=ans)
    req = {"messages": msgs, "chat_template_kwargs": {"enable_thinking": think}}
    if tools:
        req["tools"] = tools
    return {"kind": kind, "key": key, "think": think, "request": req, "target": target}


def example(seed, index, split):
    rng = random.Random(f"{seed}:{split}:{index}")
    return make_example(rng, split)


# ---- rendering ---------------------------------------------------------------------------------

_ENV = None


def load_template(path=None):
    global _ENV
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    for p in ([path] if path else TEMPLATE_CANDIDATES):
        if p and os.path.exists(p):
            with open(p, encoding="utf-8") as f:
                src = f.read()
            _ENV = (env.from_string(src), src)
            return src
    raise FileNotFoundError("chat template not found: " + ", ".join(TEMPLATE_CANDIDATES))


def _vars(req, extra=None, add_generation_prompt=True):
    msgs = []
    for m in req["messages"] + (extra or []):
        o = {"role": m["role"], "content": m.get("content") or ""}
        if m["role"] == "assistant":
            if m.get("reasoning_content") is not None:
                o["reasoning_content"] = m["reasoning_content"]
            if m.get("tool_calls"):
                o["tool_calls"] = [{"function": {"name": c["function"]["name"],
                                                 "arguments": json.loads(c["function"]["arguments"])}}
                                   for c in m["tool_calls"]]
        msgs.append(o)
    return dict(messages=msgs, tools=req.get("tools"), add_generation_prompt=add_generation_prompt,
                enable_thinking=req["chat_template_kwargs"]["enable_thinking"])


def render(req):
    if _ENV is None:
        load_template()
    return _ENV[0].render(**_vars(req))


def call_text(calls):
    out = ""
    for c in calls:
        out += "<tool_call>\n<function=" + c["function"]["name"] + ">\n"
        for k, v in json.loads(c["function"]["arguments"]).items():
            out += f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
        out += "</function>\n</tool_call>\n"
    return out


def completion(ex):
    """The text after the generation prompt, up to and including <|im_end|>."""
    t = ex["target"]
    body = t["content"] or ""
    if t["tool_calls"]:
        body = (body.strip() + "\n" if body.strip() else "") + call_text(t["tool_calls"])
    if ex["think"]:
        return t["reasoning"] + "\n</think>\n" + body + "<|im_end|>"
    if t["tool_calls"]:  # the template writes a turn of calls as "<think></think>\n<tool_call>…"
        body = "\n" + body
    return body + "<|im_end|>"


def check_example(ex):
    """The prompt plus completion must equal the template's rendering of the finished turn."""
    if _ENV is None:
        load_template()
    t = ex["target"]
    am = {"role": "assistant", "content": t["content"] or ""}
    if t["reasoning"] is not None:
        am["reasoning_content"] = t["reasoning"]
    if t["tool_calls"]:
        am["tool_calls"] = t["tool_calls"]
    full = _ENV[0].render(**_vars(ex["request"], [am], add_generation_prompt=False))
    got = render(ex["request"]) + completion(ex) + "\n"
    if full != got:
        raise AssertionError(f"template mismatch for {ex['key']}:\n{full!r}\n!=\n{got!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--split", choices=["train", "heldout"], default="heldout")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--out", default="-")
    ap.add_argument("--check", type=int, default=0, help="render N examples of each split and self-check")
    ap.add_argument("--requests", action="store_true", help="write the chat requests only (for cairn bench --chat)")
    args = ap.parse_args()
    if args.check:
        for split in ("train", "heldout"):
            for i in range(args.check):
                ex = example(args.seed, i, split)
                assert heldout_key(ex["key"]) == (split == "heldout"), ex["key"]
                check_example(ex)
        print(f"data.py: {2 * args.check} examples render as the template writes them")
        return 0
    f = sys.stdout if args.out == "-" else open(args.out, "w", encoding="utf-8")
    for i in range(args.start, args.start + args.n):
        ex = example(args.seed, i, args.split)
        ex["completion"] = completion(ex)
        f.write(json.dumps(ex["request"] if args.requests else ex, ensure_ascii=False) + "\n")
    if f is not sys.stdout:
        f.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
