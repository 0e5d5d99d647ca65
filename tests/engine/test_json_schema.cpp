// JSON Schema -> grammar (src/grammar/json_schema.cpp): documents a schema
// accepts match its grammar, documents it rejects do not; integer bounds
// against every number in a window; unsupported keywords named.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "error.h"
#include "grammar.h"
#include "json_schema.h"
#include "matcher.h"

using namespace kvrun;

namespace {

std::shared_ptr<const Grammar> schema_grammar(const std::string& schema) {
    const std::string gbnf = json_schema_to_gbnf(schema);
    try {
        return std::make_shared<const Grammar>(compile_gbnf(gbnf));
    } catch (const Error& e) {
        FAIL(e.what() << "\n" << gbnf);
    }
    return nullptr;
}

std::string refusal(const std::string& schema) {
    try {
        json_schema_to_gbnf(schema);
    } catch (const Error& e) {
        CHECK(e.code() == Exit::usage);
        return e.what();
    }
    return "(accepted)";
}

} // namespace

TEST_CASE("json schema: documents the schema accepts match, others do not") {
    struct Case {
        const char* schema;
        std::vector<std::string> yes, no;
    };
    const std::vector<Case> cases = {
        {R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
             "required": ["name"], "additionalProperties": false})",
         {R"({"name": "Tom", "age": 3})", R"({"name": "Tom"})",
          "{ \"name\": \"T\\u00e9\",\n  \"age\": -12 }"},
         {R"({"age": 3})", R"({"name": 3})", R"({"name": "Tom", "age": 3.5})",
          R"({"name": "Tom", "x": 1})", R"({"age": 3, "name": "Tom"})", R"({"name": "Tom",})",
          R"({"name": "Tom"} x)"}},
        {R"({"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"},
             "c": {"type": "number"}}})",
         {R"({})", R"({"b": null})", R"({"a": true, "c": -1.5e3})", R"({"c": 0})"},
         {R"({"b": null, "a": true})", R"({"a": 1})", R"({"c": 01})"}},
        {R"({"type": "array", "items": {"enum": ["red", "green", 3, null]}, "minItems": 2, "maxItems": 3})",
         {R"(["red", 3])", R"([null, "green", "red"])"},
         {R"(["red"])", R"(["red", 3, 3, 3])", R"(["blue", 3])", "[]"}},
        {R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": false})",
         {R"([])", R"([1])", R"([1, "x"])"},
         {R"([1, "x", 2])", R"(["x"])"}},
        {R"({"type": "array", "prefixItems": [{"const": "id"}], "items": {"type": "integer"}, "minItems": 2})",
         {R"(["id", 1])", R"(["id", 1, 2, 3])"},
         {R"(["id"])", R"(["x", 1])"}},
        {R"({"type": "string", "minLength": 2, "maxLength": 4})",
         {R"("ab")", R"("a\"bc")", "\"\xC3\xA9t\xC3\xA9\""},
         {R"("a")", R"("abcde")", "\"a\nb\""}},
        {R"({"type": "string", "pattern": "^[A-Z]{3}-\\d{2,4}(x|yz)?$"})",
         {R"("ABC-12")", R"("XYZ-1234yz")", R"("ABC-123x")"},
         {R"("AB-12")", R"("ABC-1")", R"("ABC-12q")", R"(" ABC-12")"}},
        {R"({"type": "string", "pattern": "a.c"})",
         {R"("abc")", R"("xxa-cyy")"},
         {R"("ac")", R"("a\"c")"}},
        {R"({"type": "string", "format": "date"})",
         {R"("2026-12-07")", R"("2024-02-28")"},
         {R"("2026-13-01")", R"("2026-02-30")", R"("2026-4-1")"}},
        {R"({"type": "string", "format": "date-time"})",
         {R"("2026-12-07T10:20:30Z")", R"("2026-12-07T23:59:59.5+01:00")"},
         {R"("2026-12-07 10:20:30Z")", R"("2026-12-07T24:00:00Z")"}},
        {R"({"type": "string", "format": "uuid"})",
         {R"("123e4567-e89b-12d3-a456-426614174000")"},
         {R"("123e4567e89b12d3a456426614174000")"}},
        {R"({"type": ["string", "null"]})", {R"("x")", "null"}, {"1", "true"}},
        {R"({"type": ["integer", "string", "null"], "minimum": 3, "maxLength": 2})",
         {"3", "44", R"("ab")", "null"},
         {"2", R"("abc")"}},
        {R"({"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"k": {"const": 1}}, "required": ["k"]}]})",
         {"7", R"({"k": 1})"},
         {R"({"k": 2})", R"("7")"}},
        {R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
             "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}},
             "$ref": "#/$defs/node"})",
         {R"({"v": 1})", R"({"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}, {"v": 4}]})"},
         {R"({"v": 1, "kids": [{"kids": []}]})"}},
        {R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
             {"properties": {"b": {"type": "string"}}}], "additionalProperties": false})",
         {R"({"a": 1})", R"({"a": 1, "b": "x"})"},
         {R"({"b": "x"})"}},
        {R"({"type": "object", "additionalProperties": {"type": "boolean"}})",
         {R"({"x": true, "y": false})", R"({})"},
         {R"({"x": 2})"}},
        // Pydantic's recursive model field: allOf around a $ref to itself.
        {R"({"$defs": {"N": {"type": "object", "properties": {"next": {"allOf": [{"$ref": "#/$defs/N"}]}}}},
             "$ref": "#/$defs/N"})",
         {R"({})", R"({"next": {"next": {}}})"},
         {R"({"next": 1})"}},
        {R"({"type": "integer", "minimum": 999999999999999})",
         {"999999999999999", "1000000000000000"},
         {"999999999999998", "10000000000000000"}},
        {R"({"type": "object"})", {R"({})", R"({"any": [1, {"x": null}]})"}, {"[]"}},
        {"{}", {"1", R"("s")", R"([{"a": []}])"}, {"", "nul"}},
        {R"({"const": {"k": [1, "two"]}})", {R"({"k":[1,"two"]})"}, {R"({"k": [1, "two"]})"}},
    };
    for (const Case& c : cases) {
        CAPTURE(c.schema);
        const auto g = schema_grammar(c.schema);
        for (const std::string& s : c.yes) {
            CAPTURE(s);
            CHECK(GrammarMatcher::matches(g, s));
        }
        for (const std::string& s : c.no) {
            CAPTURE(s);
            CHECK_FALSE(GrammarMatcher::matches(g, s));
        }
    }
}

TEST_CASE("json schema: integer bounds match exactly the integers within them") {
    struct Bounds {
        const char* keywords;
        long lo, hi; // the window checked is [-1200, 1200]; these are the true bounds
    };
    const std::vector<Bounds> cases = {
        {R"("minimum": 0, "maximum": 120)", 0, 120},
        {R"("minimum": -50, "maximum": 10)", -50, 10},
        {R"("minimum": 7)", 7, 1L << 40},
        {R"("maximum": -3)", -(1L << 40), -3},
        {R"("minimum": 100, "maximum": 999)", 100, 999},
        {R"("exclusiveMinimum": -1, "exclusiveMaximum": 1000)", 0, 999},
        {R"("minimum": -1100, "maximum": -1010)", -1100, -1010},
        {R"("minimum": 5.5, "maximum": 9.5)", 6, 9},
    };
    for (const Bounds& b : cases) {
        CAPTURE(b.keywords);
        const auto g = schema_grammar(std::string(R"({"type": "integer", )") + b.keywords + "}");
        for (long v = -1200; v <= 1200; v++) {
            const bool in = v >= b.lo && v <= b.hi;
            if (GrammarMatcher::matches(g, std::to_string(v)) != in) FAIL_CHECK(v);
        }
        CHECK_FALSE(GrammarMatcher::matches(g, "-0"));
        CHECK_FALSE(GrammarMatcher::matches(g, "007"));
    }
    CHECK(refusal(R"({"type": "integer", "minimum": 5, "maximum": 4})").find("no integer") !=
          std::string::npos);
}

TEST_CASE("json schema: what cannot be expressed is refused, naming the keyword and where") {
    CHECK(refusal(R"({"type": "string", "format": "email"})") ==
          "JSON schema: at #: \"format\": \"email\" is not supported (date, time, date-time, uuid "
          "are)");
    CHECK(refusal(R"({"type": "array", "uniqueItems": true})") ==
          "JSON schema: at #: \"uniqueItems\" is not supported");
    CHECK(refusal(R"({"properties": {"a": {"not": {}}}})") ==
          "JSON schema: at #/properties/a: \"not\" is not supported");
    CHECK(refusal(R"({"type": "number", "minimum": 1})").find("\"minimum\" is not supported") !=
          std::string::npos);
    CHECK(refusal(R"({"$ref": "#/$defs/missing"})").find("is not defined") != std::string::npos);
    CHECK(refusal(R"({"$ref": "http://x/y.json"})").find("only #, #/$defs/NAME") !=
          std::string::npos);
    CHECK(refusal(R"({"type": "object", "required": ["x"]})").find("not in \"properties\"") !=
          std::string::npos);
    CHECK(refusal(R"({"type": "strange"})").find("unknown \"type\"") != std::string::npos);
    CHECK(refusal(R"({"type": "string", "pattern": "(?=a)b"})").find("lookaround") !=
          std::string::npos);
    CHECK(refusal(R"({"type": "string", "pattern": "a\\bb"})").find("\\b") != std::string::npos);
    CHECK(refusal(R"({"type": "string", "pattern": "a+?"})").find("lazy") != std::string::npos);
    CHECK(refusal(R"({"type": "string", "pattern": "x", "maxLength": 3})").find("together") !=
          std::string::npos);
    CHECK(refusal(R"({"frobnicate": 1})").find("\"frobnicate\" is not supported") !=
          std::string::npos);
    CHECK(refusal("{not json").find("JSON schema: not JSON") != std::string::npos);
    CHECK(refusal("false").find("false") != std::string::npos);
    CHECK(refusal(R"({"type": ["object", "object"]})").find("a type twice") != std::string::npos);
    CHECK(refusal(R"({"properties": {"a": {}}, "additionalProperties": true})")
              .find("other than false beside \"properties\"") != std::string::npos);
    CHECK(
        refusal(R"({"allOf": [{"properties": {"n": {"minimum": 0}}}, {"properties": {"n": {}}}]})")
            .find("in more than one part") != std::string::npos);
    CHECK(refusal(R"({"allOf": [{"properties": {"a": {}}, "minProperties": 1}, {}]})")
              .find("\"minProperties\" is not supported") != std::string::npos);
    CHECK(
        refusal(
            R"({"$defs": {"N": {"allOf": [{"$ref": "#/$defs/N"}, {"properties": {"x": {}}}]}}, "$ref": "#/$defs/N"})") ==
        "JSON schema: at #/$defs/N/allOf/0: \"allOf\" is not supported");
    CHECK(
        refusal(
            R"({"$defs": {"N": {"properties": {"n": {"allOf": [{"$ref": "#/$defs/N"}, {"properties": {"x": {}}}]}}}},
                     "$ref": "#/$defs/N"})")
            .find("recursive") != std::string::npos);
    CHECK(refusal(R"({"type": "string", "pattern": "^\\é$"})").find("non-ASCII") !=
          std::string::npos);
    // Nested type lists: bounded work, then refused.
    std::string deep = R"({"type": "string"})";
    for (int i = 0; i < 14; i++)
        deep = R"({"type": ["object", "null"], "properties": {"a": )" + deep + R"(, "b": )" + deep +
               "}}";
    CHECK(refusal(deep).find("too large") != std::string::npos);
    // Annotations are read past.
    CHECK(
        refusal(
            R"({"title": "T", "description": "D", "$schema": "x", "type": "integer", "default": 3})") ==
        "(accepted)");
}
