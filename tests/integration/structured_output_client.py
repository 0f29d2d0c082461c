#!/usr/bin/python3
"""Structured output through a served cluster, as a python3-grpcio user sends it: every
JSON schema, regex and EBNF grammar of the corpora below goes to the router as a
GenerateRequest.constraint, greedy and sampled (temperature 1, a seed per request), and
the outputs are written out for checking by references nobody here wrote:

- regexes: Python's re.fullmatch (re.ASCII, the dialect the grammar engine implements),
  here;
- EBNF grammars (tests/tools/ebnf_corpus.py): each output must parse whole from the root
  with a parser Lark generates from the grammar (tests/tools/ebnf_to_lark.py, Earley);
  where the corpus also gives the language as a hand-written regex, re.fullmatch must
  agree. Before anything is sent, every grammar's parser must accept its known sentences
  and refuse its known non-sentences, so a broken checker fails the run instead of
  passing everything;
- JSON schemas: written as {"entries": [{name, schema, documents}]} for
  tests/tools/json_schema_reference.js validate (Ajv2020 + ajv-formats).

Outputs that ended with FINISH_REASON_LENGTH (max_tokens before the grammar's end: a
random model may wander in an unbounded repetition) are incomplete by definition and
counted; an EBNF one must still be a prefix of a sentence (Lark again). A constraint
the server refuses must be INVALID_ARGUMENT naming "constraint.". Prints a summary JSON line; exits 1 on any invalid output or disagreement.

  structured_output_client.py --addr H:P --stubs DIR --corpus corpus.json --suite suite.json
      --generated N --out documents.json
"""
import argparse
import concurrent.futures
import json
import os
import re
import sys

p = argparse.ArgumentParser()
p.add_argument("--addr", required=True)
p.add_argument("--stubs", required=True)
p.add_argument("--corpus", required=True, help="tests/goldens/json_schemas/corpus.json")
p.add_argument("--suite", required=True, help="json_schema_reference.js suite's output")
p.add_argument("--generated", type=int, default=120, help="schemas from tests/tools/schema_corpus.py")
p.add_argument("--max-tokens", type=int, default=320)
p.add_argument("--concurrency", type=int, default=16)
p.add_argument("--out", required=True)
args = p.parse_args()
sys.path.insert(0, args.stubs)
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tools"))

import grpc  # noqa: E402
from tandem.v1 import generation_pb2 as g  # noqa: E402
from tandem.v1 import generation_pb2_grpc as gg  # noqa: E402
import ebnf_corpus  # noqa: E402
import ebnf_to_lark  # noqa: E402
import regex_reference  # noqa: E402
import schema_corpus  # noqa: E402

stub = gg.GenerationStub(grpc.insecure_channel(args.addr))

PROMPTS = ["Answer in the format asked.", "Write the value.", "Output:", "Here is the data"]


def generate(i, constraint, sampled):
    req = g.GenerateRequest(
        text=PROMPTS[i % len(PROMPTS)], constraint=constraint,
        sampling=g.SamplingParams(temperature=1.0, seed=1000 + i) if sampled else g.SamplingParams(temperature=0.0),
        stop=g.StopConditions(max_tokens=args.max_tokens))
    text, finish = "", None
    try:
        for m in stub.Generate(req, timeout=300):
            text += m.text
            if m.finish_reason:
                finish = g.FinishReason.Name(m.finish_reason)
    except grpc.RpcError as e:
        return {"code": e.code().name, "message": e.details()}
    return {"code": "OK", "text": text, "finish": finish}


jobs = []  # (kind, name, constraint, check, extra)
corpus = json.load(open(args.corpus))
schemas = [(e["name"], e["schema"], e.get("whitespace", "python")) for e in corpus["schemas"]]
schemas += [("suite: " + e["name"], e["schema"], "python") for e in json.load(open(args.suite))["groups"]]
schemas += [(e["name"], e["schema"], "python") for e in schema_corpus.schemas(args.generated, 7)]
for name, schema, ws in schemas:
    jobs.append(("json", name, g.Constraint(json_schema=json.dumps(schema), compact_json=(ws == "compact")), schema))
for pattern in regex_reference.PATTERNS:
    jobs.append(("regex", pattern, g.Constraint(regex=pattern), pattern))

ebnf_self_check = ebnf_corpus.check_examples(ebnf_to_lark.compile_ebnf, ebnf_to_lark.accepts,
                                             ebnf_to_lark.viable_prefix)
if ebnf_self_check:
    print(json.dumps({"ebnf_self_check": ebnf_self_check}))
    sys.exit(1)
ebnf_examples = sum(len(e["valid"]) + len(e["invalid"]) for e in ebnf_corpus.GRAMMARS)
for entry in ebnf_corpus.GRAMMARS:
    checker = (ebnf_to_lark.compile_ebnf(entry["grammar"]), entry["regex"])
    jobs.append(("ebnf", entry["grammar"], g.Constraint(ebnf=g.EbnfGrammar(grammar=entry["grammar"])), checker))


runs = [(j, sampled) for j in jobs for sampled in (False, True)]
with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
    results = list(pool.map(lambda ij: generate(ij[0], ij[1][0][2], ij[1][1]), enumerate(runs)))

summary = {k: {"requests": 0, "stop": 0, "length": 0, "refused": 0, "invalid": 0} for k in ("json", "regex", "ebnf")}
summary["ebnf"]["length_prefix_checked"] = 0
ebnf_finishes = {}  # grammar -> finish reasons of its two runs
problems = []
refusals = {}
entries = {}
for ((kind, name, _, check), sampled), r in zip(runs, results):
    s = summary[kind]
    s["requests"] += 1
    if r["code"] != "OK":
        s["refused"] += 1
        refusals[name] = r["message"]
        if r["code"] != "INVALID_ARGUMENT" or "constraint." not in r["message"]:
            problems.append({"kind": kind, "name": name, "refusal": r})
        continue
    if kind == "ebnf":
        ebnf_finishes.setdefault(name, []).append(r["finish"])
    if r["finish"] == "FINISH_REASON_LENGTH":
        s["length"] += 1
        # Cut short, an EBNF output must still be the start of a sentence.
        if kind == "ebnf":
            s["length_prefix_checked"] += 1
            if not ebnf_to_lark.viable_prefix(check[0], r["text"]):
                s["invalid"] += 1
                problems.append({"kind": kind, "name": name, "sampled": sampled, "text": r["text"],
                                 "why": "not a prefix of any sentence"})
        continue
    s["stop"] += 1
    text = r["text"]
    if kind == "json":
        e = entries.setdefault(name, {"name": name, "schema": check, "documents": []})
        e["documents"].append(text)
        continue
    if kind == "ebnf":
        parser, pattern = check
        ok = ebnf_to_lark.accepts(parser, text)
        if pattern is not None and (re.fullmatch(pattern, text, re.ASCII) is not None) != ok:
            problems.append({"kind": kind, "name": name, "sampled": sampled, "text": text,
                             "disagreement": "Lark %s, regex does not" % ("accepts" if ok else "refuses")})
    else:
        ok = re.fullmatch(check, text, re.ASCII) is not None
    if not ok:
        s["invalid"] += 1
        problems.append({"kind": kind, "name": name, "sampled": sampled, "text": text})

with open(args.out, "w") as f:
    json.dump({"entries": list(entries.values())}, f)
print(json.dumps({"summary": summary, "schemas": len(schemas), "json_entries_with_documents": len(entries),
                  "ebnf_grammars": len(ebnf_corpus.GRAMMARS), "ebnf_examples": ebnf_examples,
                  "ebnf_finishes": ebnf_finishes,
                  "refusals": refusals, "problems": problems[:20], "num_problems": len(problems)}))
sys.exit(1 if problems else 0)
