#!/usr/bin/env python3
"""Constrained answers are valid: for each schema below, N sampled answers of
SmolLM2 (temperature 1.0, seeds 1..N, through `kvrun batch` with a
"json_schema" per request) are parsed with json.loads and validated with the
`jsonschema` package (formats checked). Prints the validity rate per schema
and exits 1 unless every answer of every schema is valid. Every schema here
bounds its strings and arrays, and max_tokens is above the longest text it
allows in one-byte tokens, so no answer is cut by the length limit.

tests/grammar/run.sh KVRUN [--n 50]   (ctest: kvrun_grammar_validity)
"""
import argparse
import json
import subprocess
import sys
import time

import jsonschema

SCHEMAS = {
    "nested objects": (
        "Give the name, age and address of a made-up person as JSON.",
        {"type": "object",
         "properties": {
             "name": {"type": "string", "maxLength": 30},
             "age": {"type": "integer", "minimum": 0, "maximum": 120},
             "address": {"type": "object",
                         "properties": {"street": {"type": "string", "maxLength": 40},
                                        "city": {"type": "string", "maxLength": 30},
                                        "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                         "required": ["city", "zip"], "additionalProperties": False}},
         "required": ["name", "age", "address"], "additionalProperties": False}),
    "arrays with bounds": (
        "List a few tasks for today as JSON.",
        {"type": "object",
         "properties": {"tasks": {"type": "array", "minItems": 1, "maxItems": 5,
                                  "items": {"type": "object",
                                            "properties": {"title": {"type": "string", "maxLength": 40},
                                                           "done": {"type": "boolean"}},
                                            "required": ["title", "done"],
                                            "additionalProperties": False}}},
         "required": ["tasks"], "additionalProperties": False}),
    "enums": (
        "Classify the sentiment of 'I love this phone' as JSON.",
        {"type": "object",
         "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]},
                        "confidence": {"type": "integer", "minimum": 0, "maximum": 100}},
         "required": ["sentiment", "confidence"], "additionalProperties": False}),
    "optional properties": (
        "Describe a book as JSON.",
        {"type": "object",
         "properties": {"title": {"type": "string", "maxLength": 40},
                        "subtitle": {"type": "string", "maxLength": 40},
                        "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
                        "tags": {"type": "array", "maxItems": 4,
                                 "items": {"type": "string", "maxLength": 15}}},
         "required": ["title"], "additionalProperties": False}),
    "$ref and formats": (
        "Describe a trip between two points as JSON.",
        {"$defs": {"point": {"type": "object",
                             "properties": {"x": {"type": "integer", "minimum": -100, "maximum": 100},
                                            "y": {"type": "integer", "minimum": -100, "maximum": 100}},
                             "required": ["x", "y"], "additionalProperties": False}},
         "type": "object",
         "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"},
                        "date": {"type": "string", "format": "date"},
                        "id": {"type": "string", "format": "uuid"}},
         "required": ["from", "to", "date"], "additionalProperties": False}),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvrun", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--n", type=int, default=50)
    a = ap.parse_args()
    lines = []
    for name, (prompt, schema) in SCHEMAS.items():
        jsonschema.Draft202012Validator.check_schema(schema)
        for seed in range(1, a.n + 1):
            lines.append(json.dumps({"id": f"{name}/{seed}", "messages": [{"role": "user", "content": prompt}],
                                     "temperature": 1.0, "seed": seed, "max_tokens": 2000,
                                     "json_schema": schema}))
    t0 = time.time()
    p = subprocess.run([a.kvrun, "batch", "-m", a.model, "--parallel", "8", "-c", "8192", "--ordered"],
                       input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=1500)
    if p.returncode != 0:
        sys.exit(f"kvrun batch failed ({p.returncode}): {p.stderr[-2000:]}")
    results = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    ok_all = True
    print(f"{len(results)} answers in {time.time() - t0:.1f} s")
    for name, (_, schema) in SCHEMAS.items():
        mine = [r for r in results if r["id"].startswith(name + "/")]
        valid, bad = 0, []
        for r in mine:
            try:
                doc = json.loads(r["text"])
                jsonschema.validate(doc, schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
                valid += 1
            except Exception as e:  # not JSON, or not what the schema accepts
                bad.append((r["id"], r.get("finish_reason"), r.get("error"), r.get("text", "")[:200], str(e)[:200]))
        ok = len(mine) == a.n and valid == a.n
        ok_all &= ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {valid}/{len(mine)} valid")
        for b in bad[:3]:
            print("     ", b)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
