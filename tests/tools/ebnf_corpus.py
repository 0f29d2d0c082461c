"""EBNF grammars (engine/grammar/ebnf_parser.h's format) for the structured-output tests,
each with strings known to be sentences and strings known not to be, written by hand from
the grammar's intent. `regex` is the same language written independently as a Python
regex (re.ASCII), where one exists: a second opinion beside the Lark parser
(ebnf_to_lark.py), which is the checker.

Together they cover: alternation, groups, every repetition form ({m}, {m,}, {m,n}, {,n},
*, +, ?, nested), classes with ranges, negated classes, escapes inside literals and
classes (\\xHH \\uHHHH \\UHHHHHHHH \\t \\n \\\\ \\" \\[ \\] \\- \\^ \\/), raw UTF-8, `.`,
empty literals and alternatives, comments and multi-line bodies, names with `-`, and
recursion (left, right, nested).
"""

GRAMMARS = [
    {"grammar": 'root ::= "yes" | "no"', "regex": r"yes|no",
     "valid": ["yes", "no"], "invalid": ["", "y", "yesno", "No", "yes "]},
    {"grammar": 'root ::= greeting " " name\ngreeting ::= "hi" | "hello"\nname ::= [A-Z] [a-z]*',
     "regex": r"(hi|hello) [A-Z][a-z]*",
     "valid": ["hi A", "hello Bob", "hi Zzzz"], "invalid": ["hi", "hi bob", "hey Bob", "hello  Bob", "hi BOB"]},
    {"grammar": 'root ::= digit+ ("." digit digit)?\ndigit ::= [0-9]', "regex": r"[0-9]+(\.[0-9][0-9])?",
     "valid": ["0", "123", "3.14", "007.00"], "invalid": ["", ".12", "1.", "1.2", "1.234", "1,25"]},
    {"grammar": 'root ::= item ("," item)*\nitem ::= [a-c]{1,3}', "regex": r"[a-c]{1,3}(,[a-c]{1,3})*",
     "valid": ["a", "abc", "a,bb,ccc", "cab,a"], "invalid": ["", "abca", "a,", ",a", "a,,b", "d"]},
    {"grammar": 'root ::= "(" inner ")"\ninner ::= [^()]*', "regex": r"\([^()]*\)",
     "valid": ["()", "(abc)", "( \n\t)", "(é😀)"], "invalid": ["(", "(()", "(a)b", "((a))", ""]},
    {"grammar": 'root ::= date "T" time\ndate ::= [0-9]{4} "-" [0-9]{2} "-" [0-9]{2}\n'
                'time ::= [0-9]{2} ":" [0-9]{2}',
     "regex": r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}",
     "valid": ["2024-01-31T23:59", "0000-00-00T00:00"],
     "invalid": ["2024-1-31T23:59", "2024-01-31 23:59", "2024-01-31T23:5", "12024-01-31T23:59"]},
    {"grammar": 'root ::= ("ab" | "c")? "d"+', "regex": r"(ab|c)?d+",
     "valid": ["d", "abd", "cddd"], "invalid": ["", "ab", "abcd", "a", "dc"]},
    {"grammar": 'root ::= key "=" val (";" key "=" val)*\nkey ::= [a-z]+\nval ::= [0-9]+ | "\\"" [a-z]* "\\""',
     "regex": r'[a-z]+=([0-9]+|"[a-z]*")(;[a-z]+=([0-9]+|"[a-z]*"))*',
     "valid": ["a=1", 'k=""', 'x=12;y="ab";z=0'], "invalid": ["a=", "=1", 'a="1"', "a=1;", 'a="b', "A=1"]},
    {"grammar": 'root ::= [\\x41-\\x5a]{2} [0-9]?', "regex": r"[A-Z]{2}[0-9]?",
     "valid": ["AB", "ZZ9"], "invalid": ["A", "ab", "ABC", "AB12", "@A", "[A"]},
    {"grammar": 'root ::= "[" (num ("," num)*)? "]"\nnum ::= "-"? [1-9] [0-9]{0,2}',
     "regex": r"\[(-?[1-9][0-9]{0,2}(,-?[1-9][0-9]{0,2})*)?\]",
     "valid": ["[]", "[1]", "[-999,5,10]"], "invalid": ["[", "[0]", "[1000]", "[1,]", "[--1]", "[ 1]"]},
    {"grammar": 'root ::= pair+\npair ::= "(" pair* ")" | "[" pair* "]"', "regex": None,
     "valid": ["()", "[]()", "([()[]])", "((((()))))"], "invalid": ["", "(", "(]", "([)]", "())", "( )"]},
    # Left recursion, operator precedence, a prefix operator recursing on itself.
    {"grammar": '# arithmetic\nroot ::= expr\nexpr ::= expr ("+" | "-") term | term\n'
                'term ::= term ("*" | "/") factor | factor\nfactor ::= [0-9]{1,3} | "(" expr ")" | "-" factor',
     "regex": None,
     "valid": ["1", "1+2*3", "(1-2)/3", "--4", "((7))", "999*-(0+1)"],
     "invalid": ["", "1+", "(1", "1234", "1**2", "a", "()", "1 + 2"]},
    # A JSON string: a negated class with escaped members and a control-character range.
    {"grammar": 'root ::= "\\"" char* "\\""\nchar ::= [^"\\\\\\x00-\\x1f] | "\\\\" (["\\\\/bfnrt] | "u" hex{4})\n'
                'hex ::= [0-9a-fA-F]',
     "regex": r'"([^"\\\x00-\x1f]|\\(["\\/bfnrt]|u[0-9a-fA-F]{4}))*"',
     "valid": ['""', '"abc"', '"a\\"b"', '"\\u00e9\\n"', '"é ☃ 😀"', '"\\\\"'],
     "invalid": ['"a', '"\\x"', '"a"b"', '"\x01"', '"\\u12"', '"\n"', '"\\"', "abc"]},
    # Nested repetitions with every bound form; comments, a body over lines, a `-` name.
    {"grammar": '# records\nroot ::= record{1,3}\nrecord ::= tag ( "-" num-part )*   # parts\n    ";"\n'
                'tag ::= [a-z]{1,2}\nnum-part ::= [0-9]{2,} | "x"{,2}',
     "regex": r"([a-z]{1,2}(-([0-9]{2,}|x{0,2}))*;){1,3}",
     "valid": ["a;", "ab-12-x-;", "a;b;c;", "zz-123456;", "q--xx;"],
     "invalid": ["", "a", "abc;", "a;b;c;d;", "a-1;", "a-xxx;", "a-12x;"]},
    # Code points beyond ASCII: raw UTF-8 ranges, \u ranges, a \U literal, an empty literal.
    {"grammar": 'root ::= word (" " word){0,2} mark?\nword ::= [a-zà-ÿ\\u0391-\\u03A9\\u03B1-\\u03C9]+\n'
                'mark ::= "\\U0001F600" | "✓" | "\\u00BF" ""',
     "regex": "[a-zà-ÿΑ-Ωα-ω]+( [a-zà-ÿΑ-Ωα-ω]+){0,2}(\U0001F600|✓|¿)?",
     "valid": ["αβγ", "café olé", "ÿ Ω z😀", "a✓", "÷¿"],
     "invalid": ["", "A", "a  b", "a b c d", "😀", "é😀😀", "ä\u0300", "ά", "a "]},
    # Class metacharacters escaped, a hex range over ^ _ `, `.` (any code point, newlines
    # too) and an empty alternative.
    {"grammar": 'root ::= sym+ tail\nsym ::= [\\[\\]\\-\\^\\\\/] | "\\t" | [\\x5e-\\x60]\ntail ::= "." . |',
     "regex": r"([\[\]\-\^\\/\t^-`])+(\.[\s\S])?",
     "valid": ["[]-^\\/\t_`", "-.x", "^.\n", "/.😀", "]"],
     "invalid": ["", "a", ".", "[.", "[.xy", "\n", "[a", "-\\..."]},
    # S-expressions: nested right recursion, a negated class excluding a quote and \n.
    {"grammar": 'root ::= list\nlist ::= "(" ( item ( " " item )* )? ")"\nitem ::= atom | list\n'
                "atom ::= [a-z]+ | \"'\" [^'\\n]* \"'\"",
     "regex": None,
     "valid": ["()", "(a (b c) ())", "('x y' ('' ()))", "('(' ')')"],
     "invalid": ["", "(", "(a  b)", "a", "('a)", "( a)", "('a\nb')", "(a))"]},
]


def check_examples(compile_grammar, accepts, viable_prefix):
    """Problems (strings) where a grammar's parser disagrees with its known sentences and
    non-sentences (or refuses a prefix of a sentence), or where the regex does: how a
    broken checker gets caught."""
    import re
    problems = []
    for entry in GRAMMARS:
        parser = compile_grammar(entry["grammar"])
        for text, want in [(t, True) for t in entry["valid"]] + [(t, False) for t in entry["invalid"]]:
            if accepts(parser, text) != want:
                problems.append("%r: parser %s %r" % (entry["grammar"], "refuses" if want else "accepts", text))
            if want and not all(viable_prefix(parser, text[:k]) for k in range(len(text) + 1)):
                problems.append("%r: parser refuses a prefix of %r" % (entry["grammar"], text))
            if entry["regex"] is not None and (re.fullmatch(entry["regex"], text, re.ASCII) is not None) != want:
                problems.append("%r: regex %s %r" % (entry["grammar"], "refuses" if want else "accepts", text))
    return problems
