#!/usr/bin/python3
"""Translates a grammar in Tandem's EBNF format (engine/grammar/ebnf_parser.h: GBNF-like
rules, `|`, groups, "literals", [classes], `.`, `* + ? {m} {m,} {m,n} {,n}`) into a Lark
grammar, so that outputs constrained by it can be checked by a parser Lark generates
(Earley, character level) rather than by the engine's own matcher.

The format is read from its documentation and the front end's observable behaviour, not
by reusing the engine's code: anything this reader does not recognise raises EbnfError
instead of being approximated, since an approximated checker could accept what the
grammar refuses.

  parser = ebnf_to_lark.compile_ebnf(text, root="root")
  ebnf_to_lark.accepts(parser, output)   # True iff the whole output derives from root
  ebnf_to_lark.viable_prefix(parser, output)   # True iff some sentence starts with it

  ebnf_to_lark.py GRAMMAR_FILE [--root NAME] [--check TEXT]   (prints the Lark grammar)
"""
import sys

import lark

MAX_CODEPOINT = 0x10FFFF
MAX_REPETITION = 100000  # kMaxRepetition: larger bounds are refused by the engine too
MAX_NESTING = 1000
_WS = " \t\r\n"
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t"}
_SELF_ESCAPES = "\\\"'[]-/^"
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_HEX = frozenset("0123456789abcdefABCDEF")
_DIGITS = frozenset("0123456789")


class EbnfError(ValueError):
    pass


# The syntax tree: ("seq", [node]), ("alt", [node]), ("lit", str), ("class", negated,
# [(lo, hi)]), ("any",), ("ref", name, pos), ("rep", node, min, max), max None = unbounded.
class _Reader:
    def __init__(self, text):
        self.s = text
        self.i = 0

    def fail(self, what, at=None):
        at = self.i if at is None else at
        line = self.s.count("\n", 0, at) + 1
        col = at - (self.s.rfind("\n", 0, at) + 1) + 1
        raise EbnfError("ebnf: %d:%d: %s" % (line, col, what))

    def peek(self, ahead=0):
        k = self.i + ahead
        return self.s[k] if k < len(self.s) else ""

    def at_end(self):
        return self.i >= len(self.s)

    def skip_space(self):
        while not self.at_end():
            c = self.peek()
            if c in _WS:
                self.i += 1
            elif c == "#":
                while not self.at_end() and self.peek() != "\n":
                    self.i += 1
            else:
                break

    def read_name(self):
        start = self.i
        while not self.at_end() and self.peek() in _NAME_CHARS:
            self.i += 1
        return self.s[start:self.i]

    # A body ends where the next `name ::=` begins (comments may sit between the two).
    def at_rule_start(self):
        saved = self.i
        try:
            if not self.read_name():
                return False
            self.skip_space()
            return self.s.startswith("::=", self.i)
        finally:
            self.i = saved

    def rules(self):
        rules = {}
        self.skip_space()
        while not self.at_end():
            pos = self.i
            name = self.read_name()
            if not name:
                self.fail("expected a rule name")
            self.skip_space()
            if not self.s.startswith("::=", self.i):
                self.fail("expected '::=' after rule name '%s'" % name)
            self.i += 3
            self.skip_space()
            body = self.alternatives(0)
            if name in rules:
                self.fail("rule '%s' is defined twice" % name, pos)
            rules[name] = body
            self.skip_space()
        return rules

    def alternatives(self, depth):
        if depth > MAX_NESTING:
            self.fail("groups nested deeper than %d" % MAX_NESTING)
        alts = []
        while True:
            alts.append(self.sequence(depth))
            self.skip_space()
            if self.peek() != "|":
                break
            self.i += 1
            self.skip_space()
        return alts[0] if len(alts) == 1 else ("alt", alts)

    def sequence(self, depth):
        items = []
        while True:
            self.skip_space()
            if self.at_end():
                break
            c = self.peek()
            if c in "|)":
                break
            if c in _NAME_CHARS and self.at_rule_start():
                break
            items.append(self.postfix(self.primary(depth)))
        return ("seq", items)

    def primary(self, depth):
        c = self.peek()
        if c == '"':
            return self.literal()
        if c == "[":
            return self.char_class()
        if c == ".":
            self.i += 1
            return ("any",)
        if c == "(":
            self.i += 1
            self.skip_space()
            inner = self.alternatives(depth + 1)
            self.skip_space()
            if self.peek() != ")":
                self.fail("expected ')'")
            self.i += 1
            return inner
        if c in _NAME_CHARS:
            pos = self.i
            return ("ref", self.read_name(), pos)
        self.fail("unexpected character %r" % c)

    def read_int(self):
        if self.peek() not in _DIGITS:
            self.fail("expected a number")
        v = 0
        while self.peek() in _DIGITS:
            v = v * 10 + int(self.peek())
            if v > MAX_REPETITION:
                self.fail("repetition bound above %d" % MAX_REPETITION)
            self.i += 1
        return v

    # Operators bind only when they touch the item: `"a" *` is an error, as in the engine.
    def postfix(self, item):
        while True:
            c = self.peek()
            if c == "*":
                self.i += 1
                item = ("rep", item, 0, None)
            elif c == "+":
                self.i += 1
                item = ("rep", item, 1, None)
            elif c == "?":
                self.i += 1
                item = ("rep", item, 0, 1)
            elif c == "{":
                self.i += 1
                self.skip_space()
                lo, hi = 0, None
                if self.peek() != ",":
                    lo = hi = self.read_int()
                self.skip_space()
                if self.peek() == ",":
                    self.i += 1
                    self.skip_space()
                    hi = None
                    if self.peek() != "}":
                        hi = self.read_int()
                self.skip_space()
                if self.peek() != "}":
                    self.fail("expected '}' closing a repetition")
                self.i += 1
                if hi is not None and hi < lo:
                    self.fail("repetition {%d,%d} is out of order" % (lo, hi))
                item = ("rep", item, lo, hi)
            else:
                return item

    def read_char(self):
        if self.at_end():
            self.fail("unterminated literal or class")
        c = self.peek()
        self.i += 1
        if c != "\\":
            if 0xD800 <= ord(c) <= 0xDFFF:
                self.fail("invalid UTF-8 (a lone surrogate)", self.i - 1)
            return ord(c)
        if self.at_end():
            self.fail("unterminated escape")
        e = self.peek()
        self.i += 1
        if e in _ESCAPES:
            return ord(_ESCAPES[e])
        if e in _SELF_ESCAPES:
            return ord(e)
        digits = {"x": 2, "u": 4, "U": 8}.get(e)
        if digits is None:
            self.fail("unknown escape '\\%s'" % e, self.i - 2)
        hexits = self.s[self.i:self.i + digits]
        if len(hexits) != digits or any(h not in _HEX for h in hexits):
            self.fail("expected %d hex digits" % digits)
        self.i += digits
        v = int(hexits, 16)
        if v > MAX_CODEPOINT or 0xD800 <= v <= 0xDFFF:
            self.fail("code point 0x%X is not a Unicode scalar value" % v)
        return v

    def literal(self):
        start = self.i
        self.i += 1
        out = []
        while True:
            if self.at_end() or self.peek() == "\n":
                self.fail("unterminated literal", start)
            if self.peek() == '"':
                self.i += 1
                return ("lit", "".join(out))
            out.append(chr(self.read_char()))

    def char_class(self):
        start = self.i
        self.i += 1
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        ranges = []
        while True:
            if self.at_end() or self.peek() == "\n":
                self.fail("unterminated class", start)
            if self.peek() == "]":
                self.i += 1
                return ("class", negated, ranges)
            lo = hi = self.read_char()
            # `-` before `]` is a member, not a range: [a-] holds 'a' and '-'.
            if self.peek() == "-" and self.peek(1) != "]":
                self.i += 1
                hi = self.read_char()
                if hi < lo:
                    self.fail("class range out of order")
            ranges.append((lo, hi))


# Lark evaluates \x \u \U \n \t \r itself (to the raw character) and keeps other escapes
# as written, so ASCII punctuation goes out backslash-escaped (a regex sees it as that
# character) and everything outside printable ASCII as a hex escape.
def _regex_char(cp):
    c = chr(cp)
    if c.isascii() and c.isalnum():
        return c
    if 0x21 <= cp <= 0x7E:
        return "\\" + c
    if cp <= 0xFF:
        return "\\x%02x" % cp
    if cp <= 0xFFFF:
        return "\\u%04x" % cp
    return "\\U%08x" % cp


def _string_char(c):
    cp = ord(c)
    if c in '"\\':
        return "\\" + c
    if 0x20 <= cp <= 0x7E:
        return c
    return _regex_char(cp)


class _Emitter:
    def __init__(self, rules):
        self.rules = rules
        self.names = {}
        for k, name in enumerate(rules):
            self.names[name] = "r%d_%s" % (k, name.lower().replace("-", "_"))

    def emit(self, node):
        kind = node[0]
        if kind == "seq":
            parts = [self.emit(n) for n in node[1]]
            parts = [p for p in parts if p != "eps"]
            return "(" + " ".join(parts) + ")" if parts else "eps"
        if kind == "alt":
            return "(" + " | ".join(self.emit(n) for n in node[1]) + ")"
        if kind == "lit":
            # One terminal per character: with no terminal longer than one character, a
            # parse that stops at the input's end means a viable prefix (viable_prefix).
            return "(" + " ".join('"%s"' % _string_char(c) for c in node[1]) + ")" if node[1] else "eps"
        if kind == "any":
            return "/./s"
        if kind == "class":
            _, negated, ranges = node
            if not ranges:
                # [] matches nothing, [^] any code point.
                return "/./s" if negated else "never"
            body = "".join(_regex_char(lo) if lo == hi else _regex_char(lo) + "-" + _regex_char(hi)
                           for lo, hi in ranges)
            return "/[" + ("^" if negated else "") + body + "]/"
        if kind == "ref":
            if node[1] not in self.names:
                raise EbnfError("ebnf: undefined rule '%s'" % node[1])
            return self.names[node[1]]
        if kind == "rep":
            _, child, lo, hi = node
            inner = self.emit(child)
            if inner == "eps":
                return "eps"
            inner = "(" + inner + ")"
            if hi is None:
                if lo == 0:
                    return inner + "*"
                if lo == 1:
                    return inner + "+"
                return "(%s~%d %s*)" % (inner, lo, inner)
            if hi == 0:
                return "eps"
            if (lo, hi) == (0, 1):
                return inner + "?"
            return "%s~%d" % (inner, lo) if lo == hi else "%s~%d..%d" % (inner, lo, hi)
        raise EbnfError("ebnf_to_lark: no translation for node %r" % (kind,))

    def grammar(self):
        lines = ["%s: %s" % (self.names[name], self.emit(body)) for name, body in self.rules.items()]
        lines.append("eps:")
        # A rule with no derivation: what an empty class [] translates to.
        lines.append("never: never")
        return "\n".join(lines) + "\n"


def translate(text, root="root"):
    """The Lark grammar for `text` and the name of its start rule; EbnfError when `text`
    is not a grammar of the format (or uses something this translator does not know)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise EbnfError("ebnf: invalid UTF-8: %s" % e)
    try:
        rules = _Reader(text).rules()
        if root not in rules:
            raise EbnfError("grammar: no root rule '%s'" % root)
        emitter = _Emitter(rules)
        return emitter.grammar(), emitter.names[root]
    except RecursionError:
        raise EbnfError("ebnf_to_lark: grammar nested too deeply for this checker")


def compile_ebnf(text, root="root"):
    grammar, start = translate(text, root)
    return lark.Lark(grammar, start=start, parser="earley", lexer="dynamic")


def accepts(parser, text):
    try:
        parser.parse(text)
        return True
    except lark.exceptions.UnexpectedInput:
        return False


def viable_prefix(parser, text):
    """Whether `text` is a sentence or can be extended into one: what an output cut short
    by max_tokens must be. Every terminal is one character, so Earley meets a character
    no live item can scan as UnexpectedCharacters, and input that ends before a sentence
    does as UnexpectedEOF listing the terminals still expected: none when the only items
    left wait on a rule that derives nothing (what [] translates to)."""
    try:
        parser.parse(text)
        return True
    except lark.exceptions.UnexpectedEOF as e:
        return bool(e.expected)
    except lark.exceptions.UnexpectedCharacters:
        return False


def main():
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("grammar")
    p.add_argument("--root", default="root")
    p.add_argument("--check", help="print whether this text is a sentence of the grammar")
    a = p.parse_args()
    text = open(a.grammar, encoding="utf-8").read()
    try:
        grammar, start = translate(text, a.root)
    except EbnfError as e:
        print(e, file=sys.stderr)
        return 2
    print(grammar, end="")
    if a.check is not None:
        print("accepted" if accepts(compile_ebnf(text, a.root), a.check) else "refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
