#!/usr/bin/env python3
"""Renders chat templates with Python's Jinja2 in the environment transformers'
apply_chat_template builds, as the reference Tandem's interpreter (engine/chat_template)
is compared with byte for byte (tests/unit/engine/chat_template).

  chat_template_reference.py --goldens tests/goldens/chat_templates --out FILE.json

Renders every template in templates.json over every conversation in conversations.json
(the context transformers passes: messages, tools, documents=None,
add_generation_prompt, the special tokens that are set, then chat_template_kwargs), and
every case of feature_cases.json (a template and its context as given). Writes, per
case, the text, or the error Jinja2 raised ("ok": false, "error": "Type: message"):
where Jinja2 fails, Tandem must fail too.

Needs only python3 and Jinja2 (Debian's python3-jinja2)."""
import argparse
import datetime
import json
import os
import sys

try:
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    sys.exit("chat_template_reference.py: Jinja2 is missing (apt-get install python3-jinja2)")


class GenerationTag(jinja2.ext.Extension):
    """transformers' {% generation %} tag (its AssistantTracker): renders the body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_environment():
    """The environment of transformers' _compile_jinja_template."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, source, context):
    try:
        return {"ok": True, "text": env.from_string(source).render(**context)}
    except Exception as e:  # every failure is a result: Tandem must fail the same case
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def chat_context(template, conversation):
    context = {
        "messages": conversation["messages"],
        "tools": conversation.get("tools"),
        "documents": None,
        "add_generation_prompt": conversation.get("add_generation_prompt", True),
    }
    for key in ("bos_token", "eos_token"):
        if template.get(key) is not None:
            context[key] = template[key]
    context.update(conversation.get("kwargs", {}))
    return context


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--goldens", required=True, help="tests/goldens/chat_templates")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    def load(name):
        with open(os.path.join(args.goldens, name), encoding="utf-8") as f:
            return json.load(f)

    templates = load("templates.json")["templates"]
    conversations = load("conversations.json")["conversations"]
    features = load("feature_cases.json")["cases"]
    env = make_environment()

    cases = []
    for t in templates:
        with open(os.path.join(args.goldens, t["file"]), encoding="utf-8", newline="") as f:
            source = f.read()
        for c in conversations:
            result = render(env, source, chat_context(t, c))
            cases.append({"template": t["name"], "conversation": c["name"], **result})
    feature_results = []
    for case in features:
        feature_results.append({"name": case["name"], **render(env, case["template"], case.get("context", {}))})

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"jinja2_version": jinja2.__version__, "chat_cases": cases, "feature_cases": feature_results}, f,
                  ensure_ascii=False, indent=1)
    ok = sum(1 for c in cases if c["ok"])
    print(f"Jinja2 {jinja2.__version__}: {len(cases)} template x conversation renderings ({ok} rendered, "
          f"{len(cases) - ok} raised), {len(feature_results)} feature cases -> {args.out}")


if __name__ == "__main__":
    main()
