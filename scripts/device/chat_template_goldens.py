#!/usr/bin/env python3
"""Renders Tandem's golden chat templates with transformers' own apply_chat_template.

Run on a machine with transformers 5.x (the GPU machine; no network needed):

    python3 scripts/device/chat_template_goldens.py REPO [--out FILE]

REPO is the repository root. For every template of
REPO/tests/goldens/chat_templates/templates.json this writes a model directory of its
own into a temporary folder -- a tiny WordLevel tokenizer.json holding the special
tokens, and a tokenizer_config.json carrying the template and the model's special tokens
(as AddedToken objects, as the model repositories write them) -- loads it with
AutoTokenizer.from_pretrained, and renders every conversation of conversations.json with
apply_chat_template(messages, tools=..., add_generation_prompt=..., tokenize=False,
**chat_template_kwargs). Errors are recorded as results ("ok": false), since Tandem must
fail where transformers fails.

Writes FILE (default REPO/tests/goldens/chat_templates/transformers_renderings.json),
which engine_chat_template_test compares Tandem's renderings with byte for byte once it
is committed. Also prints where transformers and this machine's plain Jinja2 (in
transformers' environment, tests/tools/chat_template_reference.py) disagree.

Needs only python3, transformers (with its tokenizers) and Jinja2."""
import argparse
import copy
import importlib.util
import json
import os
import sys
import tempfile

import jinja2
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers


def write_model_dir(path, template, source, tokenizer_class):
    specials = [t for t in (template.get("bos_token"), template.get("eos_token")) if t is not None]
    vocab = {"<unk>": 0}
    for t in specials:
        vocab.setdefault(t, len(vocab))
    for w in ("hello", "world"):
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(specials)
    tok.save(os.path.join(path, "tokenizer.json"))

    def added(content):
        if content is None:
            return None
        return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": False,
                "rstrip": False, "single_word": False, "special": True}

    config = {
        "tokenizer_class": tokenizer_class,
        "model_max_length": 1000000,
        "unk_token": "<unk>",
        "bos_token": added(template.get("bos_token")),
        "eos_token": added(template.get("eos_token")),
        "chat_template": source,
    }
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)


def load_tokenizer(path, template, source):
    """The tokenizer as AutoTokenizer loads the model directory (transformers 5 calls the
    fast tokenizer class TokenizersBackend; older releases PreTrainedTokenizerFast)."""
    errors = []
    for tokenizer_class in ("PreTrainedTokenizerFast", "TokenizersBackend"):
        write_model_dir(path, template, source, tokenizer_class)
        try:
            return transformers.AutoTokenizer.from_pretrained(path)
        except Exception as e:
            errors.append(f"{tokenizer_class}: {type(e).__name__}: {e}")
    sys.exit(f"{template['name']}: AutoTokenizer cannot load the model directory: " + "; ".join(errors))


def render(tokenizer, conversation, chat_template):
    kwargs = copy.deepcopy(conversation.get("kwargs", {}))
    try:
        out = tokenizer.apply_chat_template(
            copy.deepcopy(conversation["messages"]),
            tools=copy.deepcopy(conversation.get("tools")),
            add_generation_prompt=conversation.get("add_generation_prompt", True),
            tokenize=False,
            chat_template=chat_template,
            **kwargs)
    except Exception as e:  # a result like any other: Tandem must fail the same case
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    if not isinstance(out, str):
        return {"ok": False, "error": f"apply_chat_template(tokenize=False) returned {type(out).__name__}"}
    return {"ok": True, "text": out}


def load_jinja2_reference(repo):
    path = os.path.join(repo, "tests", "tools", "chat_template_reference.py")
    spec = importlib.util.spec_from_file_location("chat_template_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("repo", help="the repository root")
    ap.add_argument("--out", help="default: REPO/tests/goldens/chat_templates/transformers_renderings.json")
    args = ap.parse_args()
    templates_dir = os.path.join(args.repo, "tests", "goldens", "chat_templates")
    out_path = args.out or os.path.join(templates_dir, "transformers_renderings.json")

    with open(os.path.join(templates_dir, "templates.json"), encoding="utf-8") as f:
        templates = json.load(f)["templates"]
    with open(os.path.join(templates_dir, "conversations.json"), encoding="utf-8") as f:
        conversations = json.load(f)["conversations"]
    reference = load_jinja2_reference(args.repo)
    env = reference.make_environment()

    cases, disagreements = [], 0
    for t in templates:
        with open(os.path.join(templates_dir, t["file"]), encoding="utf-8", newline="") as f:
            source = f.read()
        with tempfile.TemporaryDirectory(prefix=f"chat-template-{t['name']}-") as model_dir:
            tokenizer = load_tokenizer(model_dir, t, source)
            # The template as loaded from tokenizer_config.json; given explicitly only if
            # loading changed it, so that the renderings are of the golden template.
            chat_template = None
            if tokenizer.chat_template != source:
                print(f"warning: {t['name']}: the tokenizer loaded another template text; rendering the golden one")
                chat_template = source
            for c in conversations:
                result = render(tokenizer, c, chat_template)
                cases.append({"template": t["name"], "conversation": c["name"], **result})
                plain = reference.render(env, source, reference.chat_context(t, c))
                if plain["ok"] != result["ok"] or plain.get("text") != result.get("text"):
                    disagreements += 1
                    print(f"transformers and Jinja2 disagree on {t['name']} x {c['name']}:\n"
                          f"  transformers: {json.dumps(result, ensure_ascii=False)[:300]}\n"
                          f"  Jinja2:       {json.dumps(plain, ensure_ascii=False)[:300]}")

    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"transformers_version": transformers.__version__, "jinja2_version": jinja2.__version__,
                   "python_version": sys.version.split()[0], "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    ok = sum(1 for c in cases if c["ok"])
    print(f"transformers {transformers.__version__} (Jinja2 {jinja2.__version__}): {len(cases)} renderings "
          f"({ok} rendered, {len(cases) - ok} raised), {disagreements} differing from plain Jinja2 -> {out_path}")


if __name__ == "__main__":
    main()
