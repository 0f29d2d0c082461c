#!/usr/bin/python3
"""ebnf_to_lark.py, the EBNF checker of the structured-output tests, checked on its own:
the corpus grammars accept their known sentences and refuse their known non-sentences;
the Lark parser agrees with the hand-written regexes on mutations of those sentences;
every escape and every printable ASCII character means one code point; repetition bounds
are exact; malformed grammars are refused, not approximated. Run by ctest
(tools_ebnf_to_lark_test)."""
import os
import random
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ebnf_corpus  # noqa: E402
import ebnf_to_lark as E  # noqa: E402


def accepts(grammar, text, root="root"):
    return E.accepts(E.compile_ebnf(grammar, root), text)


def escaped(cp, width):
    return {2: "\\x%02x", 4: "\\u%04x", 8: "\\U%08x"}[width] % cp


class Corpus(unittest.TestCase):
    def test_known_sentences_and_non_sentences(self):
        self.assertEqual(ebnf_corpus.check_examples(E.compile_ebnf, E.accepts, E.viable_prefix), [])

    def test_parser_agrees_with_regex_on_mutations(self):
        # Edits of sentences land on both sides of the language's edge, where a wrong
        # translation (a lost escape, an off-by-one bound) shows.
        rng = random.Random(24)
        compared = 0
        for entry in ebnf_corpus.GRAMMARS:
            if entry["regex"] is None:
                continue
            parser = E.compile_ebnf(entry["grammar"])
            alphabet = sorted(set("".join(entry["valid"] + entry["invalid"])) | set("a0-\n"))
            for text in entry["valid"]:
                for _ in range(60):
                    k = rng.randrange(len(text) + 1)
                    op = rng.randrange(3)
                    c = rng.choice(alphabet)
                    m = (text[:k] + c + text[k:] if op == 0 else
                         text[:k] + text[k + 1:] if op == 1 else text[:k] + c + text[k + 1:])
                    want = re.fullmatch(entry["regex"], m, re.ASCII) is not None
                    self.assertEqual(E.accepts(parser, m), want, "%r on %r" % (entry["grammar"], m))
                    compared += 1
        self.assertGreater(compared, 1000)


class Characters(unittest.TestCase):
    CODEPOINTS = list(range(0x00, 0x80)) + [0x80, 0xA0, 0xE9, 0xFF, 0x100, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFD,
                                           0xFFFF, 0x10000, 0x1F600, 0x10FFFF]

    def neighbours(self, cp):
        return [c for c in (cp - 1, cp + 1) if 0 <= c <= 0x10FFFF and not 0xD800 <= c <= 0xDFFF]

    def test_every_escape_is_its_code_point(self):
        for cp in self.CODEPOINTS:
            for width in (2, 4, 8):
                if cp >= 16 ** width:
                    continue
                e = escaped(cp, width)
                lit = E.compile_ebnf('root ::= "%s"' % e)
                cls = E.compile_ebnf("root ::= [%s]" % e)
                neg = E.compile_ebnf("root ::= [^%s]" % e)
                self.assertTrue(E.accepts(lit, chr(cp)), e)
                self.assertTrue(E.accepts(cls, chr(cp)), e)
                self.assertFalse(E.accepts(neg, chr(cp)), e)
                for n in self.neighbours(cp):
                    self.assertFalse(E.accepts(lit, chr(n)), (e, n))
                    self.assertFalse(E.accepts(cls, chr(n)), (e, n))
                    self.assertTrue(E.accepts(neg, chr(n)), (e, n))
                self.assertFalse(E.accepts(lit, chr(cp) * 2), e)

    def test_raw_characters_mean_themselves(self):
        for cp in self.CODEPOINTS:
            c = chr(cp)
            if c in '"\\\n':
                continue
            self.assertTrue(accepts('root ::= "a%sb"' % c, "a%sb" % c), hex(cp))
            if c not in "]^-":
                self.assertTrue(accepts("root ::= [%s]" % c, c), hex(cp))
                self.assertFalse(accepts("root ::= [%s]" % c, "x" if c != "x" else "y"), hex(cp))

    def test_named_escapes(self):
        for e, c in [("n", "\n"), ("r", "\r"), ("t", "\t"), ("\\", "\\"), ('"', '"'), ("'", "'"), ("[", "["),
                     ("]", "]"), ("-", "-"), ("/", "/"), ("^", "^")]:
            self.assertTrue(accepts('root ::= "\\%s"' % e, c), e)
            self.assertTrue(accepts("root ::= [\\%s]" % e, c), e)
            self.assertFalse(accepts("root ::= [^\\%s]" % e, c), e)
            self.assertFalse(accepts('root ::= "\\%s"' % e, "\\" + e), e)

    def test_class_forms(self):
        self.assertTrue(accepts("root ::= [a-]", "-"))
        self.assertTrue(accepts("root ::= [-a]", "-"))
        self.assertFalse(accepts("root ::= [a-]", "b"))
        self.assertTrue(accepts("root ::= [--/]", "."))  # a range from '-' to '/'
        self.assertFalse(accepts("root ::= [--/]", "0"))
        self.assertTrue(accepts("root ::= [a-c0-1]", "c"))
        self.assertFalse(accepts("root ::= [a-c0-1]", "2"))
        self.assertFalse(accepts("root ::= [^a-c]", "b"))
        self.assertTrue(accepts("root ::= [^a-c]", "\n"))
        self.assertTrue(accepts("root ::= [^]", "\n"))
        self.assertTrue(accepts("root ::= [^]", "\U0010ffff"))
        self.assertFalse(accepts('root ::= [] | "x"', ""))
        self.assertTrue(accepts('root ::= [] | "x"', "x"))
        self.assertTrue(accepts("root ::= [[]", "["))
        self.assertTrue(accepts("root ::= [a^]", "^"))
        self.assertTrue(accepts("root ::= [\\x20-\\x7e]{3}", " ~a"))
        self.assertTrue(accepts("root ::= . . .", "\n😀\x00"))
        self.assertFalse(accepts("root ::= .", ""))
        self.assertFalse(accepts("root ::= .", "ab"))


class Structure(unittest.TestCase):
    def lengths(self, grammar, top=12):
        p = E.compile_ebnf(grammar)
        return [n for n in range(top) if E.accepts(p, "a" * n)]

    def test_repetition_bounds(self):
        for lo in range(0, 5):
            for hi in range(lo, 7):
                self.assertEqual(self.lengths('root ::= "a"{%d,%d}' % (lo, hi)), list(range(lo, hi + 1)))
            self.assertEqual(self.lengths('root ::= "a"{%d}' % lo), [lo])
            self.assertEqual(self.lengths('root ::= "a"{%d,}' % lo), list(range(lo, 12)))
            self.assertEqual(self.lengths('root ::= "a"{,%d}' % lo), list(range(0, lo + 1)))
        self.assertEqual(self.lengths('root ::= "a"*'), list(range(12)))
        self.assertEqual(self.lengths('root ::= "a"+'), list(range(1, 12)))
        self.assertEqual(self.lengths('root ::= "a"?'), [0, 1])
        self.assertEqual(self.lengths('root ::= "a"{,}'), list(range(12)))
        self.assertEqual(self.lengths('root ::= "a"{ 2 , 3 }'), [2, 3])
        self.assertEqual(self.lengths('root ::= "aa"{2}?'), [0, 4])
        self.assertEqual(self.lengths('root ::= ("a"{2}){1,2}'), [2, 4])
        self.assertEqual(self.lengths('root ::= ("a"?)* "a"'), list(range(1, 12)))
        self.assertEqual(self.lengths('root ::= ("")* ("" | "a")'), [0, 1])
        self.assertEqual(self.lengths('root ::= "a"{60,70}', 80), list(range(60, 71)))

    def test_rules_and_layout(self):
        self.assertTrue(accepts('root ::= a-1 A\na-1 ::= "x"\nA ::= a\na ::= "y"', "xy"))
        self.assertTrue(accepts('root # the root\n  ::= "a" # trailing\n  "b"\nunused ::= "z"', "ab"))
        self.assertTrue(accepts('root ::= x\nx ::= "a" | # empty next\n', ""))
        self.assertTrue(accepts('top ::= "t"\nroot ::= "r"', "t", root="top"))
        self.assertFalse(accepts('top ::= "t"\nroot ::= "r"', "r", root="top"))
        self.assertTrue(accepts('root ::= ( ( "a" ) | ( ) ) "b"', "b"))
        self.assertTrue(accepts('root ::= "a" | "b" c\nc ::= "c"', "bc"))
        self.assertFalse(accepts('root ::= "a" | "b" c\nc ::= "c"', "ac"))
        self.assertTrue(accepts('root ::= "#x"', "#x"))
        self.assertTrue(accepts('root ::= [#]', "#"))
        self.assertTrue(accepts('root ::= "::="', "::="))

    def test_whole_output_only(self):
        self.assertFalse(accepts('root ::= "ab"', "ab "))
        self.assertFalse(accepts('root ::= "ab"', " ab"))
        self.assertFalse(accepts('root ::= "ab"', "a"))
        self.assertFalse(accepts('root ::= "a" "b"', "a b"))

    def test_recursion(self):
        g = 'root ::= l\nl ::= l "," "x" | "x"'
        self.assertTrue(accepts(g, ",".join(["x"] * 200)))
        self.assertFalse(accepts(g, "x,"))
        g = 'root ::= "(" root ")" | ""'
        self.assertTrue(accepts(g, "(" * 50 + ")" * 50))
        self.assertFalse(accepts(g, "(" * 50 + ")" * 49))


class Prefixes(unittest.TestCase):
    # What an output cut short by max_tokens is checked against.
    CASES = [
        ('root ::= "ab"', ["", "a", "ab"], ["b", "ac", "abc", "aa"]),
        ('root ::= "a"{2,3}', ["", "a", "aa", "aaa"], ["aaaa", "b"]),
        ('root ::= [^x]* "x"', ["", "yy", "\n", "x"], ["xx", "xa"]),
        ('root ::= .', ["", "😀"], ["ab"]),
        ('root ::= l\nl ::= l "," "x" | "x"', ["", "x", "x,", "x,x,"], [",", "xx", "x,,"]),
        ('root ::= pair+\npair ::= "(" pair* ")" | "[" pair* "]"', ["", "(((", "([]", "()["], ["(]", "())", "( ", ")"]),
        ('root ::= "x" | [] "y"', ["", "x"], ["y"]),
        ('root ::= "a" [] | "c"', ["", "c"], ["a", "ac"]),
    ]

    def test_prefixes(self):
        for grammar, viable, dead in self.CASES:
            p = E.compile_ebnf(grammar)
            for text in viable:
                self.assertTrue(E.viable_prefix(p, text), (grammar, text))
            for text in dead:
                self.assertFalse(E.viable_prefix(p, text), (grammar, text))

    def test_corpus_prefixes_live_and_die(self):
        # Every prefix of a sentence is viable (check_examples); with a character no
        # sentence of these grammars holds appended, none is.
        for entry in ebnf_corpus.GRAMMARS:
            p = E.compile_ebnf(entry["grammar"])
            if "." in entry["grammar"].replace('"."', "") or "[^" in entry["grammar"]:
                continue
            for text in entry["valid"]:
                for k in range(len(text) + 1):
                    self.assertFalse(E.viable_prefix(p, text[:k] + "\x07"), (entry["grammar"], text[:k]))


class Refusals(unittest.TestCase):
    BAD = [
        ("", "no root rule"),
        ('rot ::= "a"', "no root rule"),
        ('root "a"', "expected '::='"),
        ('root ::= "a"\nroot ::= "b"', "defined twice"),
        ("root ::= x", "undefined rule 'x'"),
        ('root ::= "a"\nunused ::= x', "undefined rule 'x'"),
        ('root ::= "a', "unterminated literal"),
        ('root ::= "a\nb"', "unterminated literal"),
        ("root ::= [a", "unterminated class"),
        ('root ::= "\\q"', "unknown escape"),
        ('root ::= "\\x4"', "hex digits"),
        ('root ::= "\\u12g4"', "hex digits"),
        ('root ::= "\\uD800"', "not a Unicode scalar value"),
        ('root ::= "\\U00110000"', "not a Unicode scalar value"),
        ('root ::= "\\', "unterminated"),
        ("root ::= [z-a]", "out of order"),
        ('root ::= "a"{3,2}', "out of order"),
        ('root ::= "a"{100001}', "repetition bound above"),
        ('root ::= "a"{}', "expected a number"),
        ('root ::= "a"{2', "expected '}'"),
        ('root ::= "a"{x}', "expected a number"),
        ('root ::= "a" *', "unexpected character '*'"),
        ("root ::= (", "expected ')'"),
        ('root ::= ("a"', "expected ')'"),
        ('root ::= "a")', "expected a rule name"),
        ("root ::= @", "unexpected character '@'"),
        ("root ::= 'a'", "unexpected character"),
        ('root ::= "a"\f', "unexpected character"),
        ("root ::= \ud800", "unexpected character"),
        ('root ::= "\ud800"', "surrogate"),
        (b'root ::= "\xff"', "invalid UTF-8"),
    ]

    def test_malformed_grammars_are_refused(self):
        for text, why in self.BAD:
            with self.assertRaises(E.EbnfError, msg=repr(text)) as ctx:
                E.translate(text)
            self.assertIn(why, str(ctx.exception), repr(text))

    def test_errors_name_the_line(self):
        with self.assertRaises(E.EbnfError) as ctx:
            E.translate('root ::= a\na ::= "x" @')
        self.assertIn("2:11", str(ctx.exception))


if __name__ == "__main__":
    unittest.main()
