#!/usr/bin/env python3
"""Labels strings with Python's re.fullmatch (re.ASCII), the reference the grammar
engine's regex front end (engine/grammar/regex_to_grammar.h, dialect kPython) is
compared with (tests/unit/engine/grammar/regex_reference_test.cc).

  regex_reference.py --out FILE.json [--per-pattern N] [--seed S]

For each pattern below, strings are made three ways: sampled from the pattern's parse
tree as Python's own parser (re._parser) gives it, those samples mutated (characters
inserted, deleted, replaced, parts repeated), and random strings over the pattern's
characters and a few others. Every string is labelled by re.fullmatch; the output is
{"cases": [{"pattern": P, "strings": [[S, MATCHES], ...]}]}. Python's parser and
matcher are the reference: nothing here decides a label.

Needs only python3."""
import argparse
import json
import os
import random
import re
import sys

try:
    import re._parser as sre_parse
    import re._constants as sre_c
except ImportError:  # Python < 3.11
    import sre_parse
    import sre_constants as sre_c

PATTERNS = [
    "abc", "a|b|cd", "(ab|c)*d", "(?:x|yz)+", "a?b?c?", "[a-z]+", "[^a-z]*", "[a-cx-z0-9_]{2,4}",
    "\\d+", "\\D\\d", "\\w+\\s\\W", "\\S+", "[\\d\\s]+", "[^\\w]", "[\\W\\d]+", ".", ".+", "a.c",
    "a{3}", "a{2,}", "a{,2}b", "(ab){1,3}", "a{0}", "x{2,3}?y+?z*?w??", "(?P<year>\\d{4})-(?P<m>0[1-9]|1[0-2])",
    "(?P<n>[A-Z])(?:[a-z]*)", "^start", "end$", "^both$", "\\x41\\u00e9\\U0001F600", "\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\\\",
    "\\n\\t\\r\\f\\v", "caf\u00e9|na\u00efve", "[\u00e0-\u00ff]+", "[\u4e00-\u9fa5]{1,3}", "[^\u00e9]",
    "\U0001F600+", "[\U0001F600-\U0001F64F]\\d", "a|", "|b", "()", "(a|)(b|)", "((a)|(b))+c",
    "[]a]+", "[^]a]", "[a\\]\\-z]+", "[-a]", "[a-]", "a{x}", "a{1,x}", "{", "-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?",
    "[A-Za-z_][A-Za-z0-9_]*", "\"([^\"\\\\]|\\\\.)*\"", "(true|false|null)", "\\s*\\[\\s*(\\d+(\\s*,\\s*\\d+)*)?\\s*\\]",
    "([01]\\d|2[0-3]):[0-5]\\d", "(a+)+b", "(a|b|c)*abc", "(\\d{3}-){2}\\d{4}", "\\0", "[\\b]", "\\x00[\\x01-\\x1f]",
    "[^\\x00-\\x7f]+", "\u20ac?\\d+(,\\d{3})*", "a*?", "(?:)", "[.]", "\\w*\\W\\w*", "(ab|a)(bc|c)",
]

EXTRA_CHARS = "aZ09_ -.\n\t\"\\\u00e9\u00ff\u4e00\u20ac\U0001F600\x00\x1f\x7f]{}()"
MAX_SAMPLE_REPEAT = 5


def category_chars(cat):
    if cat == sre_c.CATEGORY_DIGIT:
        return "0123456789"
    if cat == sre_c.CATEGORY_NOT_DIGIT:
        return "aZ_ -\u00e9"
    if cat == sre_c.CATEGORY_SPACE:
        return " \t\n\r\f\v"
    if cat == sre_c.CATEGORY_NOT_SPACE:
        return "ab0_-\u00e9"
    if cat == sre_c.CATEGORY_WORD:
        return "azAZ09_"
    if cat == sre_c.CATEGORY_NOT_WORD:
        return " -.\u00e9\n"
    return "a"


def sample_in(items, rng):
    """A character a class (IN) probably matches: picks from its positive members, or
    for a negated class a character from outside a few members."""
    negated = any(op == sre_c.NEGATE for op, _ in items)
    pool = []
    for op, arg in items:
        if op == sre_c.LITERAL:
            pool.append(chr(arg))
        elif op == sre_c.RANGE:
            lo, hi = arg
            pool.append(chr(rng.randint(lo, hi)))
            pool.append(chr(lo))
            pool.append(chr(hi))
        elif op == sre_c.CATEGORY:
            pool.extend(category_chars(arg))
    if negated:
        return rng.choice(EXTRA_CHARS + "qQ5")
    return rng.choice(pool) if pool else rng.choice(EXTRA_CHARS)


def sample(tree, rng, out):
    for op, arg in tree:
        if op == sre_c.LITERAL:
            out.append(chr(arg))
        elif op == sre_c.NOT_LITERAL:
            out.append(rng.choice(EXTRA_CHARS))
        elif op == sre_c.ANY:
            out.append(rng.choice(EXTRA_CHARS))
        elif op == sre_c.IN:
            out.append(sample_in(arg, rng))
        elif op == sre_c.BRANCH:
            sample(rng.choice(arg[1]), rng, out)
        elif op == sre_c.SUBPATTERN:
            sample(arg[-1], rng, out)
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
            lo, hi, sub = arg
            hi = min(hi, lo + MAX_SAMPLE_REPEAT)
            for _ in range(rng.randint(lo, hi)):
                sample(sub, rng, out)
        elif op == sre_c.AT:
            pass
        elif op == sre_c.CATEGORY:
            out.append(rng.choice(category_chars(arg)))
        else:
            raise ValueError(f"unexpected opcode {op}")


def mutate(s, alphabet, rng):
    s = list(s)
    for _ in range(rng.randint(1, 2)):
        kind = rng.randrange(5)
        pos = rng.randint(0, len(s))
        if kind == 0:
            s.insert(pos, rng.choice(alphabet))
        elif kind == 1 and s:
            del s[min(pos, len(s) - 1)]
        elif kind == 2 and s:
            s[min(pos, len(s) - 1)] = rng.choice(alphabet)
        elif kind == 3 and s:
            a = rng.randint(0, len(s) - 1)
            b = rng.randint(a, len(s))
            s[b:b] = s[a:b]
        elif kind == 4:
            s = s[:pos]
    return "".join(s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--per-pattern", type=int, default=120)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    cases = []
    for pattern in PATTERNS:
        compiled = re.compile(pattern, re.ASCII)
        tree = sre_parse.parse(pattern, re.ASCII)
        alphabet = sorted(set(pattern) | set(EXTRA_CHARS))
        strings = {""}
        samples = []
        for _ in range(args.per_pattern // 3):
            out = []
            sample(tree, rng, out)
            samples.append("".join(out))
        strings.update(samples)
        for s in samples:
            strings.add(mutate(s, alphabet, rng))
        for _ in range(args.per_pattern // 3):
            strings.add("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8))))
        # Nested quantifiers backtrack exponentially in Python's matcher on long
        # near-misses; such patterns keep short strings only.
        if "+)+" in pattern:
            strings = {s for s in strings if len(s) <= 16}
        labelled = [[s, compiled.fullmatch(s) is not None] for s in sorted(strings)]
        cases.append({"pattern": pattern, "strings": labelled})
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"cases": cases}, f, ensure_ascii=True)
    matched = sum(m for c in cases for _, m in c["strings"])
    total = sum(len(c["strings"]) for c in cases)
    print(f"regex_reference.py: {len(cases)} patterns, {total} strings, {matched} matching", file=sys.stderr)


if __name__ == "__main__":
    main()
