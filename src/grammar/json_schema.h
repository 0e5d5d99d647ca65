// JSON Schema -> GBNF: the grammar of the JSON texts a schema accepts, for
// --json-schema and response_format json_schema. What it cannot express is
// refused naming the keyword, never ignored: an answer that silently broke
// a constraint the user wrote would be worse than an error.
//
// Supported: type (one or a list), properties, required (the others may be
// left out), additionalProperties (false, true or a schema; absent: no
// others, which every schema accepts), items, prefixItems, minItems,
// maxItems, enum, const, minLength, maxLength, pattern (a regular
// expression subset: literals, classes, ., groups, |, quantifiers, ^ $),
// format (date, time, date-time, uuid), minimum, maximum and the exclusive
// ones for integers, $ref to #/$defs/... or #/definitions/... (recursion
// too), anyOf, oneOf (as anyOf: the branches should not overlap), allOf of
// objects. Annotations (title, description, default, examples, $schema,
// $id, $comment, ...) are read past.
#pragma once

#include <string>
#include <string_view>

namespace kvrun {

// The GBNF text of `schema` (JSON text). Error(Exit::usage, "JSON schema:
// ...") for bad JSON, an unsupported keyword (named, with where it is) or
// a schema no value can satisfy.
std::string json_schema_to_gbnf(std::string_view schema);

} // namespace kvrun
