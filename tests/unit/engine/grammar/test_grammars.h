// Grammars shared by the matcher tests.
#pragma once

namespace tandem::grammar::testing {

// JSON values (objects, arrays, strings with escapes, numbers), up to two whitespace
// characters between tokens: recursive, with long repetitions and string escapes.
inline constexpr char kJsonEbnf[] = R"(
root   ::= value
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( pair ( "," ws pair )* )? "}" ws
pair   ::= string ws ":" ws value
array  ::= "[" ws ( value ( "," ws value )* )? "]" ws
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ["\\/bfnrtu] )* "\"" ws
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )? ws
ws     ::= [ \t\n]{0,2}
)";

}  // namespace tandem::grammar::testing
