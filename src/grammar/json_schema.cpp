// A schema becomes one GBNF rule per subschema, named after its place
// (root, root-name, root-tags-item, def-Address), plus the shared JSON
// primitives at the end. $refs become references to the definition's rule,
// so recursive schemas stay finite.
#include "json_schema.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "error.h"

namespace kvrun {

namespace {

using json = nlohmann::ordered_json; // properties keep the schema's order

// Read past: they describe, they do not constrain.
const std::set<std::string> kAnnotations = {
    "title",    "description", "default",          "examples",       "$schema", "$id",
    "$comment", "readOnly",    "writeOnly",        "deprecated",     "$defs",   "definitions",
    "strict",   "$anchor",     "contentMediaType", "contentEncoding"};

// Whitespace between tokens: bounded, as in the json_object grammar. A value
// ends with its last character (whitespace goes inside its container), so
// the answer ends the moment the top value is complete.
constexpr std::string_view kPrimitives = R"g(
ws ::= | " " | "\n" [ \t]{0,20}
json-char ::= [^"\\\x00-\x1F\x7F] | "\\" (["\\/bfnrt] | "u" ([0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}))
json-string ::= "\"" json-char* "\""
json-number ::= "-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?
json-integer ::= "-"? ("0" | [1-9] [0-9]{0,15})
json-boolean ::= "true" | "false"
json-null ::= "null"
json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null
json-object ::= "{" ws ( json-string ws ":" ws json-value ws ("," ws json-string ws ":" ws json-value ws)* )? "}"
json-array ::= "[" ws ( json-value ws ("," ws json-value ws)* )? "]"
)g";

// A GBNF string literal of raw bytes.
std::string literal(std::string_view s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += static_cast<char>(c);
        } else if (c < 0x20 || c == 0x7F) {
            out += fmt::format("\\x{:02X}", c);
        } else {
            out += static_cast<char>(c);
        }
    }
    return out + "\"";
}

// Decimal strings of [lo, hi] (0 <= lo <= hi), without leading zeros, as
// GBNF alternatives: one digit count at a time, then digit by digit.
void same_length_range(const std::string& lo, const std::string& hi, std::string& out) {
    const size_t n = lo.size();
    if (lo.find_first_not_of('0') == std::string::npos &&
        hi.find_first_not_of('9') == std::string::npos) {
        out += fmt::format("[0-9]{{{}}}", n); // every string of n digits
        return;
    }
    if (n == 1) {
        out += fmt::format("[{}-{}]", lo[0], hi[0]);
        return;
    }
    if (lo[0] == hi[0]) {
        out += fmt::format("\"{}\" (", lo[0]);
        same_length_range(lo.substr(1), hi.substr(1), out);
        out += ")";
        return;
    }
    const std::string nines(n - 1, '9'), zeros(n - 1, '0');
    out += fmt::format("\"{}\" (", lo[0]);
    same_length_range(lo.substr(1), nines, out);
    out += ")";
    if (hi[0] - lo[0] > 1)
        out += fmt::format(" | [{}-{}] [0-9]{{{}}}", char(lo[0] + 1), char(hi[0] - 1), n - 1);
    out += fmt::format(" | \"{}\" (", hi[0]);
    same_length_range(zeros, hi.substr(1), out);
    out += ")";
}

std::string nonneg_range(uint64_t lo, uint64_t hi) {
    std::string out;
    const auto digits = [](uint64_t v) { return std::to_string(v).size(); };
    for (size_t d = digits(lo); d <= digits(hi); d++) {
        uint64_t a = d == 1 ? 0 : 1;
        for (size_t k = 1; k < d; k++) a *= 10; // 10^(d-1)
        uint64_t b = a == 0 ? 9 : a * 10 - 1;
        a = std::max(a, lo);
        b = std::min(b, hi);
        if (a > b) continue;
        if (!out.empty()) out += " | ";
        out += "(";
        same_length_range(std::to_string(a), std::to_string(b), out);
        out += ")";
    }
    return out;
}

// Any non-negative integer of at least `lo`: the digits of lo's length from
// lo up, or any longer number.
std::string at_least(uint64_t lo) {
    const std::string s = std::to_string(lo);
    uint64_t top = 1;
    for (size_t k = 0; k < s.size(); k++) top *= 10;
    if (s.size() >= 16) return nonneg_range(lo, top - 1); // json-integer's longest
    return fmt::format("{} | [1-9] [0-9]{{{},15}}", nonneg_range(lo, top - 1), s.size());
}

class SchemaCompiler {
  public:
    explicit SchemaCompiler(const json& root) : root_(root) {}

    std::string compile() {
        const std::string r = rule("root", root_, "#");
        if (r != "root") add("root", r);
        std::string out;
        for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
        return out + std::string(kPrimitives);
    }

  private:
    static constexpr size_t kMaxRules = 20000;
    const json& root_;
    std::vector<std::pair<std::string, std::string>> rules_;
    std::map<std::string, std::string> refs_; // $ref -> its rule
    std::set<std::string> inlining_;          // refs all_of() is taking in now
    std::set<std::string> names_;

    [[noreturn]] static void refuse(const std::string& where, const std::string& what) {
        fail(Exit::usage, "JSON schema: at {}: {}", where, what);
    }

    std::string fresh(const std::string& hint) {
        // Every subschema compiled takes a name: this bounds the work a
        // hostile schema can ask for (type lists and allOf copy schemas).
        if (names_.size() > kMaxRules)
            fail(Exit::usage, "JSON schema: too large (over {} subschemas)", kMaxRules);
        std::string base;
        for (char c : hint) base += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
        std::string name = base;
        for (int k = 2; names_.count(name); k++) name = base + "-" + std::to_string(k);
        names_.insert(name);
        return name;
    }
    void add(const std::string& name, const std::string& body) { rules_.emplace_back(name, body); }

    // The rule for a subschema: its name (a new rule, or a shared one).
    std::string rule(const std::string& hint, const json& s, const std::string& where) {
        if (!s.is_object() || s.contains("$ref"))
            return body(hint, s, where); // true: any value; false refused; a $ref: its rule
        const std::string name = fresh(hint);
        add(name, body(name, s, where));
        return name;
    }

    // The local definition a $ref names (#/$defs/NAME, #/definitions/NAME),
    // or null.
    const json* definition(const std::string& r) const {
        for (const std::string section : {"$defs", "definitions"}) {
            const std::string prefix = "#/" + section + "/";
            if (r.rfind(prefix, 0) != 0) continue;
            const std::string key = r.substr(prefix.size());
            if (root_.contains(section) && root_[section].is_object() &&
                root_[section].contains(key))
                return &root_[section][key];
        }
        return nullptr;
    }

    std::string ref(const json& s, const std::string& where) {
        for (const auto& [k, v] : s.items())
            if (k != "$ref" && !kAnnotations.count(k))
                refuse(where, "\"" + k + "\" beside \"$ref\" is not supported");
        if (!s["$ref"].is_string()) refuse(where, "\"$ref\" must be a string");
        const std::string r = s["$ref"].get<std::string>();
        if (auto it = refs_.find(r); it != refs_.end()) return it->second;
        if (r == "#") {
            refs_[r] = "root";
            return "root";
        }
        const json* def = definition(r);
        if (!def) {
            if (r.rfind("#/$defs/", 0) == 0 || r.rfind("#/definitions/", 0) == 0)
                refuse(where, "\"$ref\": \"" + r + "\" is not defined");
            refuse(where,
                   "\"$ref\": only #, #/$defs/NAME and #/definitions/NAME are supported, not \"" +
                       r + "\"");
        }
        const std::string key = r.substr(r.rfind('/') + 1);
        // Named before its body is written, so a recursive reference finds it.
        const std::string name = fresh("def-" + key);
        refs_[r] = name;
        const std::string b = body(name, *def, r);
        add(name, b);
        return name;
    }

    static void only(const json& s, const std::string& where,
                     std::initializer_list<const char*> allowed) {
        for (const auto& item : s.items()) {
            const std::string& k = item.key(); // a lambda below uses it: not a structured binding
            if (kAnnotations.count(k)) continue;
            if (std::find_if(allowed.begin(), allowed.end(),
                             [&](const char* a) { return k == a; }) == allowed.end())
                refuse(where, "\"" + k + "\" is not supported" +
                                  (k == "type" || k == "enum" || k == "const" ? " here" : ""));
        }
    }

    std::string body(const std::string& name, const json& s, const std::string& where) {
        if (s.is_boolean()) {
            if (!s.get<bool>()) refuse(where, "false (no value is allowed)");
            return "json-value";
        }
        if (!s.is_object()) refuse(where, "a schema must be an object or a boolean");
        if (s.contains("$ref")) return ref(s, where);
        for (const char* k : {"not",
                              "if",
                              "then",
                              "else",
                              "dependentRequired",
                              "dependentSchemas",
                              "patternProperties",
                              "propertyNames",
                              "contains",
                              "minContains",
                              "maxContains",
                              "uniqueItems",
                              "multipleOf",
                              "minProperties",
                              "maxProperties",
                              "unevaluatedProperties",
                              "unevaluatedItems",
                              "dependencies",
                              "nullable",
                              "$dynamicRef",
                              "contentSchema"})
            if (s.contains(k)) refuse(where, fmt::format("\"{}\" is not supported", k));
        if (s.contains("const")) {
            only(s, where, {"const"});
            return literal(s["const"].dump());
        }
        if (s.contains("enum")) {
            only(s, where, {"enum", "type"});
            if (!s["enum"].is_array() || s["enum"].empty())
                refuse(where, "\"enum\" must be a non-empty array");
            std::string alts;
            for (const json& v : s["enum"]) {
                if (s.contains("type") && !type_allows(s["type"], v)) continue;
                alts += (alts.empty() ? "" : " | ") + literal(v.dump());
            }
            if (alts.empty()) refuse(where, "no value of \"enum\" has the \"type\"");
            return "(" + alts + ")";
        }
        for (const char* k : {"anyOf", "oneOf"})
            if (s.contains(k)) {
                only(s, where, {k});
                if (!s[k].is_array() || s[k].empty())
                    refuse(where, fmt::format("\"{}\" must be a non-empty array", k));
                std::string alts;
                for (size_t i = 0; i < s[k].size(); i++)
                    alts += (i ? " | " : "") + rule(name + "-" + std::to_string(i), s[k][i],
                                                    fmt::format("{}/{}/{}", where, k, i));
                return alts;
            }
        if (s.contains("allOf")) return all_of(name, s, where);
        if (!s.contains("type")) {
            // No type: what the other keywords imply, else any value.
            if (s.contains("properties") || s.contains("required") ||
                s.contains("additionalProperties"))
                return object(name, s, where);
            if (s.contains("items") || s.contains("prefixItems")) return array(name, s, where);
            only(s, where, {});
            return "json-value";
        }
        const json& t = s["type"];
        if (t.is_array()) {
            if (t.empty()) refuse(where, "\"type\" is an empty list");
            for (size_t i = 0; i < t.size(); i++)
                for (size_t k = 0; k < i; k++)
                    if (t[i] == t[k]) refuse(where, "\"type\" lists a type twice");
            std::string alts;
            for (size_t i = 0; i < t.size(); i++) {
                if (!t[i].is_string()) refuse(where, "\"type\" must list type names");
                json one = for_type(s, t[i].get<std::string>());
                alts += (i ? " | " : "") +
                        rule(name + "-" + (t[i].is_string() ? t[i].get<std::string>() : "t"), one,
                             where);
            }
            return alts;
        }
        if (!t.is_string()) refuse(where, "\"type\" must be a string or a list of them");
        const std::string type = t.get<std::string>();
        if (type == "object") return object(name, s, where);
        if (type == "array") return array(name, s, where);
        if (type == "string") return string(s, where);
        if (type == "integer") return integer(s, where);
        if (type == "number") {
            only(s, where, {"type"});
            return "json-number";
        }
        if (type == "boolean") {
            only(s, where, {"type"});
            return "json-boolean";
        }
        if (type == "null") {
            only(s, where, {"type"});
            return "json-null";
        }
        refuse(where, "unknown \"type\" \"" + type + "\"");
    }

    // The keywords of s that apply to values of one type (the others do not
    // constrain them), with that type.
    static json for_type(const json& s, const std::string& type) {
        static const std::map<std::string, std::set<std::string>> kOwn = {
            {"object", {"properties", "required", "additionalProperties"}},
            {"array", {"items", "prefixItems", "minItems", "maxItems"}},
            {"string", {"minLength", "maxLength", "pattern", "format"}},
            {"integer", {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}},
        };
        static const std::set<std::string> kTyped = {
            "properties", "required",         "additionalProperties",
            "items",      "prefixItems",      "minItems",
            "maxItems",   "minLength",        "maxLength",
            "pattern",    "format",           "minimum",
            "maximum",    "exclusiveMinimum", "exclusiveMaximum"};
        const auto own = kOwn.find(type);
        json out = json::object();
        for (const auto& [k, v] : s.items())
            if (!kTyped.count(k) || (own != kOwn.end() && own->second.count(k))) out[k] = v;
        // number takes the bounds too (and refuses them, as it does alone)
        if (type == "number")
            for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
                if (s.contains(k)) out[k] = s[k];
        out["type"] = type;
        return out;
    }

    static bool type_allows(const json& t, const json& v) {
        auto one = [&](const std::string& type) {
            return (type == "string" && v.is_string()) ||
                   (type == "integer" && v.is_number_integer()) ||
                   (type == "number" && v.is_number()) || (type == "boolean" && v.is_boolean()) ||
                   (type == "null" && v.is_null()) || (type == "object" && v.is_object()) ||
                   (type == "array" && v.is_array());
        };
        if (t.is_string()) return one(t.get<std::string>());
        if (t.is_array())
            for (const json& x : t)
                if (x.is_string() && one(x.get<std::string>())) return true;
        return false;
    }

    // allOf: a lone part (Pydantic's wrapper of a $ref) is that part;
    // several are object schemas (refs followed) whose properties and
    // requirements are put together. A property in two parts, or an
    // additionalProperties inside a part, would need an intersection of
    // schemas: refused.
    std::string all_of(const std::string& name, const json& s, const std::string& where) {
        only(s, where, {"allOf", "type", "properties", "required", "additionalProperties"});
        const json& parts = s["allOf"];
        if (!parts.is_array() || parts.empty())
            refuse(where, "\"allOf\" must be a non-empty array");
        json own = json::object();
        for (const auto& [k, v] : s.items())
            if (k != "allOf" && !kAnnotations.count(k)) own[k] = v;
        if (parts.size() == 1 && (own.empty() || own == json{{"type", "object"}}))
            return body(name, parts[0], where + "/allOf/0");
        json merged = {
            {"type", "object"}, {"properties", json::object()}, {"required", json::array()}};
        std::vector<std::string> inlined; // definitions taken in, while this one compiles
        auto take = [&](const json& part, const std::string& at, bool outer) {
            const json* p = &part;
            for (int hops = 0; p->is_object() && p->contains("$ref"); hops++) {
                if (!(*p)["$ref"].is_string()) refuse(at, "\"$ref\" must be a string");
                const std::string r = (*p)["$ref"].get<std::string>();
                const json* def = definition(r);
                if (!def) refuse(at, "\"allOf\": a \"$ref\" that is not a local definition");
                if (hops > 32 || inlining_.count(r))
                    refuse(at, "\"allOf\" through a recursive \"$ref\" is not supported");
                inlining_.insert(r);
                inlined.push_back(r);
                p = def;
            }
            if (!p->is_object()) refuse(at, "\"allOf\" is supported for object schemas only");
            only(*p, at, {"type", "properties", "required", "additionalProperties"});
            if (p->contains("type") && (*p)["type"] != "object")
                refuse(at, "\"allOf\" is supported for object schemas only");
            if (p->contains("additionalProperties") && !outer)
                refuse(at, "\"additionalProperties\" inside a part of \"allOf\" is not supported");
            if (p->contains("properties")) {
                if (!(*p)["properties"].is_object()) refuse(at, "\"properties\" must be an object");
                for (const auto& [k, v] : (*p)["properties"].items()) {
                    if (merged["properties"].contains(k))
                        refuse(at, "property \"" + k + "\" in more than one part of \"allOf\"");
                    merged["properties"][k] = v;
                }
            }
            if (p->contains("required")) {
                if (!(*p)["required"].is_array()) refuse(at, "\"required\" must be an array");
                for (const json& r : (*p)["required"]) merged["required"].push_back(r);
            }
            if (p->contains("additionalProperties"))
                merged["additionalProperties"] = (*p)["additionalProperties"];
        };
        for (size_t i = 0; i < parts.size(); i++)
            take(parts[i], fmt::format("{}/allOf/{}", where, i), false);
        take(own, where, true);
        const std::string out = object(name, merged, where);
        for (const std::string& r : inlined) inlining_.erase(r);
        return out;
    }

    std::string object(const std::string& name, const json& s, const std::string& where) {
        only(s, where, {"type", "properties", "required", "additionalProperties"});
        const json props = s.contains("properties") ? s["properties"] : json::object();
        if (!props.is_object()) refuse(where, "\"properties\" must be an object");
        std::set<std::string> required;
        if (s.contains("required")) {
            if (!s["required"].is_array()) refuse(where, "\"required\" must be an array");
            for (const json& r : s["required"]) {
                if (!r.is_string()) refuse(where, "\"required\" must list property names");
                if (!props.contains(r.get<std::string>()))
                    refuse(where, "\"required\" names \"" + r.get<std::string>() +
                                      "\", which is not in \"properties\" (give its schema)");
                required.insert(r.get<std::string>());
            }
        }
        // Other keys: only when additionalProperties says so (true or a
        // schema); absent, none are written (every schema accepts that).
        // With listed properties, others could repeat a listed key with
        // another value: refused rather than risk it.
        std::string extra;
        if (s.contains("additionalProperties")) {
            const json& a = s["additionalProperties"];
            if (!(a.is_boolean() && !a.get<bool>())) {
                if (!props.empty())
                    refuse(where,
                           "\"additionalProperties\" other than false beside \"properties\" is "
                           "not supported");
                extra = "json-string ws \":\" ws " +
                        rule(name + "-additional", a, where + "/additionalProperties") + " ws";
            }
        }
        if (props.empty() && !s.contains("additionalProperties") && !s.contains("properties") &&
            !s.contains("required"))
            return "json-object";
        std::vector<std::pair<std::string, bool>> kv; // rule of "key": value, required
        for (const auto& [k, v] : props.items()) {
            const std::string value = rule(name + "-" + k, v, where + "/properties/" + k);
            const std::string r = fresh(name + "-" + k + "-kv");
            add(r, literal(json(k).dump()) + " ws \":\" ws " + value + " ws");
            kv.emplace_back(r, required.count(k) > 0);
        }
        // after(i): what may follow once a property is written, from the
        // i-th on: each later one with its comma, the optional ones left out.
        const size_t n = kv.size();
        std::vector<std::string> after(n + 1), first(n + 1);
        after[n] = fresh(name + "-after-" + std::to_string(n));
        add(after[n], extra.empty() ? "\"\"" : "(\",\" ws " + extra + ")*");
        for (size_t i = n; i-- > 0;) {
            after[i] = fresh(name + "-after-" + std::to_string(i));
            add(after[i], "\",\" ws " + kv[i].first + " " + after[i + 1] +
                              (kv[i].second ? "" : " | " + after[i + 1]));
        }
        first[n] = fresh(name + "-first-" + std::to_string(n));
        add(first[n], extra.empty() ? "\"\"" : "(" + extra + " (\",\" ws " + extra + ")*)?");
        for (size_t i = n; i-- > 0;) {
            first[i] = fresh(name + "-first-" + std::to_string(i));
            add(first[i],
                kv[i].first + " " + after[i + 1] + (kv[i].second ? "" : " | " + first[i + 1]));
        }
        return "\"{\" ws " + first[0] + " \"}\"";
    }

    static uint64_t count(const json& s, const char* key, const std::string& where) {
        const json& v = s[key];
        if (!v.is_number_integer() || v.get<int64_t>() < 0)
            refuse(where, fmt::format("\"{}\" must be a whole number, at least 0", key));
        if (v.get<int64_t>() > 100000) refuse(where, fmt::format("\"{}\" over 100000", key));
        return v.get<uint64_t>();
    }

    // {lo,hi} or {lo,} in GBNF.
    static std::string repeat(uint64_t lo, bool bounded, uint64_t hi) {
        return bounded ? fmt::format("{{{},{}}}", lo, hi) : fmt::format("{{{},}}", lo);
    }

    std::string array(const std::string& name, const json& s, const std::string& where) {
        only(s, where, {"type", "items", "prefixItems", "minItems", "maxItems"});
        const uint64_t lo = s.contains("minItems") ? count(s, "minItems", where) : 0;
        const bool bounded = s.contains("maxItems");
        const uint64_t hi = bounded ? count(s, "maxItems", where) : 0;
        if (bounded && hi < lo) refuse(where, "\"maxItems\" is less than \"minItems\"");
        std::vector<std::string> head; // prefixItems' rules
        if (s.contains("prefixItems")) {
            if (!s["prefixItems"].is_array()) refuse(where, "\"prefixItems\" must be an array");
            for (size_t i = 0; i < s["prefixItems"].size(); i++)
                head.push_back(rule(name + "-" + std::to_string(i), s["prefixItems"][i],
                                    fmt::format("{}/prefixItems/{}", where, i)));
        }
        bool more = true; // items past the prefix
        std::string item = "json-value";
        if (s.contains("items")) {
            if (s["items"].is_boolean() && !s["items"].get<bool>())
                more = false;
            else
                item = rule(name + "-item", s["items"], where + "/items");
        }
        // The prefix as far as the bounds let it go, then the rest.
        const size_t np = head.size();
        if (bounded && hi < np) head.resize(hi);
        if (!more && lo > np) refuse(where, "\"minItems\" is more than \"prefixItems\" allow");
        std::string body = "\"[\" ws ";
        item = "(" + item + " ws)"; // an element, then what may follow it
        for (std::string& h : head) h = "(" + h + " ws)";
        if (np == 0) {
            const bool any = more && (!bounded || hi > 0);
            if (!any) return body + "\"]\"";
            const std::string rest = repeat(lo > 0 ? lo - 1 : 0, bounded, bounded ? hi - 1 : 0);
            const std::string list = item + " (\",\" ws " + item + ")" + rest;
            return body + (lo > 0 ? list : "(" + list + ")?") + " \"]\"";
        }
        // Prefix items in order; the first `lo` of them required; beyond the
        // prefix, `item`s up to the bounds.
        std::string tail;
        if (more && (!bounded || hi > head.size())) {
            const uint64_t need = lo > head.size() ? lo - head.size() : 0;
            tail =
                "(\",\" ws " + item + ")" + repeat(need, bounded, bounded ? hi - head.size() : 0);
        }
        // Nested optionals: p0 ("," p1 ("," p2 ...)?)? with the required ones plain.
        std::string seq = tail;
        for (size_t i = head.size(); i-- > 0;) {
            const std::string here =
                (i ? "\",\" ws " : "") + head[i] + (seq.empty() ? "" : " " + seq);
            seq = i < lo ? here : "(" + here + ")?";
        }
        return body + seq + " \"]\"";
    }

    std::string string(const json& s, const std::string& where) {
        only(s, where, {"type", "minLength", "maxLength", "pattern", "format"});
        const bool has_len = s.contains("minLength") || s.contains("maxLength");
        if (s.contains("format")) {
            if (has_len || s.contains("pattern"))
                refuse(where,
                       "\"format\" together with a length or a \"pattern\" is not supported");
            if (!s["format"].is_string()) refuse(where, "\"format\" must be a string");
            const std::string f = s["format"].get<std::string>();
            static const std::string date =
                R"g([0-9]{4} "-" (("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]) | ("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30") | "02" "-" ("0" [1-9] | "1" [0-9] | "2" [0-8])))g";
            static const std::string time =
                R"g(([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9]))g";
            if (f == "date") return "\"\\\"\" " + date + " \"\\\"\"";
            if (f == "time") return "\"\\\"\" " + time + " \"\\\"\"";
            if (f == "date-time") return "\"\\\"\" " + date + " \"T\" " + time + " \"\\\"\"";
            if (f == "uuid")
                return R"g("\"" [0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12} "\"")g";
            refuse(where,
                   "\"format\": \"" + f + "\" is not supported (date, time, date-time, uuid are)");
        }
        if (s.contains("pattern")) {
            if (has_len) refuse(where, "\"pattern\" together with a length is not supported");
            if (!s["pattern"].is_string()) refuse(where, "\"pattern\" must be a string");
            return "\"\\\"\" " + pattern(s["pattern"].get<std::string>(), where + "/pattern") +
                   " \"\\\"\"";
        }
        if (!has_len) return "json-string";
        const uint64_t lo = s.contains("minLength") ? count(s, "minLength", where) : 0;
        const bool bounded = s.contains("maxLength");
        const uint64_t hi = bounded ? count(s, "maxLength", where) : 0;
        if (bounded && hi < lo) refuse(where, "\"maxLength\" is less than \"minLength\"");
        return "\"\\\"\" json-char" + repeat(lo, bounded, hi) + " \"\\\"\"";
    }

    std::string integer(const json& s, const std::string& where) {
        only(s, where, {"type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"});
        int64_t lo = 0, hi = std::numeric_limits<int64_t>::max();
        bool has_lo = false, has_hi = false;
        auto bound = [&](const char* key, int64_t shift, bool upper) {
            if (!s.contains(key)) return;
            const json& v = s[key];
            if (!v.is_number()) refuse(where, fmt::format("\"{}\" must be a number", key));
            const double d = v.get<double>();
            if (std::abs(d) > 1e15) refuse(where, fmt::format("\"{}\" beyond 10^15", key));
            int64_t x =
                upper ? static_cast<int64_t>(std::floor(d)) : static_cast<int64_t>(std::ceil(d));
            if (shift && static_cast<double>(x) == d) x += shift; // exclusive
            if (upper) {
                hi = has_hi ? std::min(hi, x) : x;
                has_hi = true;
            } else {
                lo = has_lo ? std::max(lo, x) : x;
                has_lo = true;
            }
        };
        bound("minimum", 0, false);
        bound("exclusiveMinimum", 1, false);
        bound("maximum", 0, true);
        bound("exclusiveMaximum", -1, true);
        if (!has_lo && !has_hi) return "json-integer";
        if (has_lo && has_hi && hi < lo) refuse(where, "no integer lies within the bounds");
        std::vector<std::string> alts;
        // Negative side: "-" then the magnitudes.
        if (!has_lo || lo < 0) {
            const int64_t top = has_hi ? std::min<int64_t>(hi, -1) : -1; // the largest negative
            if (!has_lo)
                alts.push_back("\"-\" (" + at_least(static_cast<uint64_t>(-top)) + ")");
            else if (top >= lo)
                alts.push_back(
                    "\"-\" (" +
                    nonneg_range(static_cast<uint64_t>(-top), static_cast<uint64_t>(-lo)) + ")");
        }
        if (!has_hi || hi >= 0) {
            const uint64_t from = has_lo && lo > 0 ? static_cast<uint64_t>(lo) : 0;
            if (!has_hi)
                alts.push_back("(" + at_least(from) + ")");
            else
                alts.push_back("(" + nonneg_range(from, static_cast<uint64_t>(hi)) + ")");
        }
        std::string out = "(";
        for (size_t i = 0; i < alts.size(); i++) out += (i ? " | " : "") + alts[i];
        return out + ")";
    }

    // A regular expression (the subset grammars express) as GBNF over the
    // characters of a JSON string: quotes and backslashes escaped, control
    // characters left out of classes.
    std::string pattern(const std::string& re, const std::string& where) {
        size_t i = 0;
        const bool anchored_start = !re.empty() && re[0] == '^';
        if (anchored_start) i = 1;
        const bool anchored_end =
            re.size() > i && re.back() == '$' && (re.size() < 2 || re[re.size() - 2] != '\\');
        const size_t stop = anchored_end ? re.size() - 1 : re.size();
        int depth = 0;
        std::string body = alternation(re, i, stop, where, depth);
        if (i != stop) refuse(where, fmt::format("unexpected '{}' in the pattern", re[i]));
        // An unanchored side matches anything there.
        if (!anchored_start) body = "json-char* " + body;
        if (!anchored_end) body += " json-char*";
        return "(" + body + ")";
    }

    std::string alternation(const std::string& re, size_t& i, size_t stop, const std::string& where,
                            int& depth) {
        std::string out = "(" + sequence(re, i, stop, where, depth);
        while (i < stop && re[i] == '|') {
            i++;
            out += " | " + sequence(re, i, stop, where, depth);
        }
        return out + ")";
    }

    std::string sequence(const std::string& re, size_t& i, size_t stop, const std::string& where,
                         int& depth) {
        std::string out = "\"\"";
        while (i < stop && re[i] != '|' && re[i] != ')') {
            std::string atom = this->atom(re, i, stop, where, depth);
            if (i < stop) {
                const char q = re[i];
                if (q == '*' || q == '+' || q == '?') {
                    atom += q;
                    i++;
                } else if (q == '{') {
                    const size_t close = re.find('}', i);
                    if (close == std::string::npos || close >= stop)
                        refuse(where, "an unclosed { in the pattern");
                    atom += re.substr(i, close - i + 1);
                    i = close + 1;
                }
                if (i < stop && (re[i] == '?' || re[i] == '+'))
                    refuse(where, "lazy and possessive quantifiers are not supported in a pattern");
            }
            out += " " + atom;
        }
        return out;
    }

    // One character as a GBNF element of a JSON string's content.
    static std::string json_char(uint32_t c) {
        if (c == '"') return R"g("\\\"")g";
        if (c == '\\') return R"g("\\\\")g";
        if (c < 0x20) return fmt::format("\"\\\\u{:04x}\"", c);
        std::string s;
        if (c < 0x80) s = std::string(1, static_cast<char>(c));
        return literal(s);
    }

    std::string atom(const std::string& re, size_t& i, size_t stop, const std::string& where,
                     int& depth) {
        const char c = re[i];
        if (c == '(') {
            if (++depth > 64) refuse(where, "groups nested deeper than 64 in the pattern");
            i++;
            if (re.compare(i, 2, "?:") == 0)
                i += 2;
            else if (i < stop && re[i] == '?')
                refuse(where, "lookaround and named groups are not supported in a pattern");
            std::string inner = alternation(re, i, stop, where, depth);
            if (i >= stop || re[i] != ')') refuse(where, "an unclosed ( in the pattern");
            i++;
            depth--;
            return inner;
        }
        if (c == '[') return char_class(re, i, stop, where);
        if (c == '.') {
            i++;
            return "json-char-plain";
        }
        if (c == '\\') return escape(re, i, stop, where, false);
        if (c == '^' || c == '$')
            refuse(where, "^ and $ are supported only at the ends of a pattern");
        if (c == '*' || c == '+' || c == '?' || c == '{')
            refuse(where, fmt::format("'{}' follows nothing in the pattern", c));
        // A literal character (a whole UTF-8 sequence).
        size_t n = 1;
        while (i + n < stop && (static_cast<unsigned char>(re[i + n]) & 0xC0) == 0x80) n++;
        const std::string ch = re.substr(i, n);
        i += n;
        if (n == 1) return json_char(static_cast<unsigned char>(ch[0]));
        return literal(ch);
    }

    // \d \w \s and their negations as GBNF classes; other escapes as the character.
    std::string escape(const std::string& re, size_t& i, size_t stop, const std::string& where,
                       bool in_class) {
        if (i + 1 >= stop) refuse(where, "a \\ at the end of the pattern");
        const char e = re[i + 1];
        i += 2;
        switch (e) {
        // In a JSON string a tab or a line break is written escaped: \s
        // outside a class is a space or one of those escapes, inside one a
        // space (the escapes are two characters, not one of a class).
        case 'd':
            return in_class ? "0-9" : "[0-9]";
        case 'w':
            return in_class ? "a-zA-Z0-9_" : "[a-zA-Z0-9_]";
        case 's':
            return in_class ? " " : R"g((" " | "\\t" | "\\n" | "\\r"))g";
        case 'D':
        case 'W':
        case 'S':
            if (in_class)
                refuse(where, "\\D, \\W and \\S inside [ ] are not supported in a pattern");
            return e == 'D'   ? "[^0-9\"\\\\\\x00-\\x1F\\x7F]"
                   : e == 'W' ? "[^a-zA-Z0-9_\"\\\\\\x00-\\x1F\\x7F]"
                              : "[^ \\t\\n\\r\"\\\\\\x00-\\x1F\\x7F]";
        case 'n':
        case 't':
            if (in_class) refuse(where, "\\n and \\t inside [ ] are not supported in a pattern");
            return e == 'n' ? R"g("\\n")g" : R"g("\\t")g";
        case 'b':
        case 'B':
            refuse(where, "\\b and \\B are not supported in a pattern");
        default:
            if (static_cast<unsigned char>(e) >= 0x80)
                refuse(where, "a \\ before a non-ASCII character in a pattern");
            if (std::isalnum(static_cast<unsigned char>(e)))
                refuse(where, fmt::format("\\{} is not supported in a pattern", e));
            if (in_class)
                return std::string(e == ']' || e == '\\' || e == '^' || e == '-' ? "\\" : "") + e;
            return json_char(static_cast<unsigned char>(e));
        }
    }

    // [...] over the characters a JSON string may hold unescaped; a class
    // with " or \ in it gets them as escapes.
    std::string char_class(const std::string& re, size_t& i, size_t stop,
                           const std::string& where) {
        i++;
        bool negate = false;
        if (i < stop && re[i] == '^') negate = true, i++;
        std::string items;
        bool quote = false, backslash = false;
        bool first = true;
        while (i < stop && (re[i] != ']' || first)) {
            first = false;
            if (re[i] == '\\') {
                const char e = re[i + 1];
                if (e == '"')
                    quote = true, i += 2;
                else if (e == '\\')
                    backslash = true, i += 2;
                else
                    items += escape(re, i, stop, where, true);
                continue;
            }
            if (re[i] == '"') {
                quote = true;
                i++;
                continue;
            }
            if (re[i] == '[') refuse(where, "nested classes are not supported in a pattern");
            if (static_cast<unsigned char>(re[i]) < 0x20)
                refuse(where, "a control character in a pattern's class");
            if (re[i] == ']' || (re[i] == '^' && items.empty())) items += '\\';
            items += re[i++];
        }
        if (i >= stop) refuse(where, "an unclosed [ in the pattern");
        i++;
        if (negate) // never a quote, a backslash or a control character
            return "[^" + items + "\"\\\\\\x00-\\x1F\\x7F]";
        std::string out = items.empty() ? "" : "[" + items + "]";
        auto alt = [&](const std::string& a) {
            out = out.empty() ? a : "(" + out + " | " + a + ")";
        };
        if (quote) alt(R"g("\\\"")g");
        if (backslash) alt(R"g("\\\\")g");
        if (out.empty()) refuse(where, "an empty class in the pattern");
        return out;
    }
};

} // namespace

std::string json_schema_to_gbnf(std::string_view schema) {
    json s;
    try {
        s = json::parse(schema);
    } catch (const json::exception& e) {
        fail(Exit::usage, "JSON schema: not JSON: {}", e.what());
    }
    std::string g = SchemaCompiler(s).compile();
    // A pattern's "." is any character a JSON string holds unescaped.
    g += "json-char-plain ::= [^\"\\\\\\x00-\\x1F\\x7F]\n";
    return g;
}

} // namespace kvrun
