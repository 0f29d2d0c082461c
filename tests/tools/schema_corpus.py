#!/usr/bin/env python3
"""JSON schemas for structured-output tests and benchmarks, made from a seed: objects
with required and optional properties, additionalProperties false or a schema, arrays
with items / prefixItems and length bounds, enum and const, $defs with $ref (recursion
included), anyOf / oneOf, string length bounds, patterns and formats, integer and
number ranges. Each schema is plain data; validity is always decided by Ajv elsewhere.
Strings are bounded (maxLength, enum, pattern, format) so that a model whose choices
are noise still reaches the end of a document within a few hundred tokens.

  schema_corpus.py --count N --seed S    prints {"schemas": [{"name", "schema"}]}
"""
import argparse
import json
import random

FORMATS = ["date", "time", "date-time", "email", "uuid", "ipv4"]
WORDS = ["alpha", "beta", "gamma", "delta", "red", "green", "blue", "on", "off", "yes", "no", "id", "name",
         "count", "price", "tags", "items", "owner", "kind", "value", "when", "where", "score", "ok"]


def leaf(rng):
    k = rng.randrange(11)
    if k == 0:
        return {"type": "string", "maxLength": rng.randint(0, 6)}
    if k == 1:
        lo = rng.randint(0, 3)
        return {"type": "string", "minLength": lo, "maxLength": lo + rng.randint(0, 5)}
    if k == 2:
        return {"type": "string", "pattern": rng.choice(["^[a-z]{2,5}$", "^[A-Z][0-9]{3}$", "^(ab|cd)+$",
                                                          "^\\d{2}-\\d{2}$", "^[a-f0-9]{4,8}$"])}
    if k == 3:
        return {"type": "string", "format": rng.choice(FORMATS)}
    if k == 4:
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 2000)}
    if k == 5:
        s = {"type": "integer"}
        if rng.random() < 0.5:
            s["exclusiveMinimum"] = rng.randint(-10, 10)
        if rng.random() < 0.5:
            s["exclusiveMaximum"] = rng.randint(20, 10000)
        return s
    if k == 6:
        return {"type": "number", "minimum": rng.randint(-5, 0), "maximum": rng.randint(1, 100)}
    if k == 7:
        return {"type": "boolean"}
    if k == 8:
        return {"enum": rng.sample(WORDS, rng.randint(1, 4)) + ([None] if rng.random() < 0.3 else [])}
    if k == 9:
        return {"const": rng.choice([rng.choice(WORDS), rng.randint(0, 99), True, None])}
    return {"type": "null"}


def value(rng, depth):
    if depth <= 0 or rng.random() < 0.45:
        return leaf(rng)
    k = rng.randrange(5)
    if k == 0:
        return obj(rng, depth - 1)
    if k == 1:
        lo = rng.randint(0, 2)
        return {"type": "array", "items": value(rng, depth - 1), "minItems": lo, "maxItems": lo + rng.randint(0, 3)}
    if k == 2:
        return {"type": "array", "prefixItems": [leaf(rng) for _ in range(rng.randint(1, 3))],
                "items": False if rng.random() < 0.5 else leaf(rng), "maxItems": 4}
    if k == 3:
        return {"anyOf": [value(rng, depth - 1) for _ in range(rng.randint(2, 3))]}
    # Disjoint by type: exactly what oneOf means.
    return {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                      {"type": "string", "maxLength": 3}, {"type": "boolean"}][:rng.randint(2, 3)]}


def obj(rng, depth):
    names = rng.sample(WORDS, rng.randint(1, 5))
    props = {n: value(rng, depth) for n in names}
    s = {"type": "object", "properties": props,
         "required": [n for n in names if rng.random() < 0.6]}
    r = rng.random()
    if r < 0.8:
        s["additionalProperties"] = False
    elif r < 0.9:
        s["additionalProperties"] = {"type": "integer", "minimum": 0, "maximum": 9}
    return s


def recursive(rng):
    # A tree through $defs and $ref, bounded by maxItems and depth of the model's luck.
    node = {"type": "object", "properties": {"v": leaf(rng),
                                             "kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                                      "maxItems": 2}},
            "required": ["v"], "additionalProperties": False}
    return {"$defs": {"node": node}, "$ref": "#/$defs/node"}


def schemas(count, seed):
    rng = random.Random(seed)
    out = []
    for i in range(count):
        if i % 10 == 9:
            s = recursive(rng)
        elif i % 4 == 0:
            s = value(rng, 2)
        else:
            s = obj(rng, 2)
        out.append({"name": f"generated-{seed}-{i}", "schema": s})
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--count", type=int, default=120)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    print(json.dumps({"schemas": schemas(a.count, a.seed)}, indent=1))
