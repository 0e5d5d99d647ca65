#include <memory>

#include "grammar.h"

namespace kvrun {

namespace {
// JSON (RFC 8259) with an object at the top, whitespace bounded: at most one
// line break and 20 blanks between tokens, so a model cannot pad forever;
// none after the closing brace, where the answer ends. No \u
// escape of a lone surrogate (D800-DFFF): not a character.
constexpr std::string_view kJsonObject = R"g(
root    ::= object
value   ::= object | array | string | number | "true" | "false" | "null"
object  ::= "{" ws ( string ws ":" ws value ws ("," ws string ws ":" ws value ws)* )? "}"
array   ::= "[" ws ( value ws ("," ws value ws)* )? "]"
string  ::= "\"" ( [^"\\\x00-\x1F\x7F] | "\\" (["\\/bfnrt] | "u" hex4) )* "\""
hex4    ::= [0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}
number  ::= "-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?
ws      ::= | " " | "\n" [ \t]{0,20}
)g";
} // namespace

std::shared_ptr<const Grammar> json_object_grammar() {
    static const std::shared_ptr<const Grammar> g =
        std::make_shared<const Grammar>(compile_gbnf(kJsonObject));
    return g;
}

} // namespace kvrun
