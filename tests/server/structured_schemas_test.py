#!/usr/bin/env python3
"""Structured output against an independent validator: 500 JSON schemas written for this test
(every keyword structured output enforces, nesting up to 8 deep, all of them finite), each sent
to `xserv serve` on the tiny model's random weights greedy and at temperature 1. Every output
must parse, validate against its schema (Python's jsonschema, formats checked), and end by
itself (finish_reason "stop") before max_tokens: on random weights only the constraint can make
that happen.

usage: structured_schemas_test.py XSERV_BINARY SOURCE_DIR DATA_DIR [COUNT]
Exits 77 (ctest SKIP_RETURN_CODE) when the jsonschema package or the shared data is missing.
With XSERV_SCHEMAS_ENDPOINT=http://HOST:PORT the requests go to that server instead (the
synthetic 20b on a GPU: scripts/device/structured.sh), 64 at once.
"""
import concurrent.futures
import contextlib
import json
import os
import random
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_process import tiny_server  # noqa: E402

SKIP = 77
FORMATS = ["date", "uuid", "ipv4"]  # finite ones (an email address has no longest form)


class Schemas:
    """A seeded generator of finite schemas: strings, arrays and numbers all bounded."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.defs = {}

    def leaf(self):
        r = self.rng
        kind = r.randrange(12)
        if kind == 0:
            return {"type": "boolean"}
        if kind == 1:
            return {"type": "null"}
        if kind == 2:
            lo = r.randrange(-50, 50)
            return {"type": "integer", "minimum": lo, "maximum": lo + r.randrange(0, 500)}
        if kind == 3:
            lo = r.randrange(0, 9)
            return {"type": "integer", "exclusiveMinimum": lo, "exclusiveMaximum": lo + 20}
        if kind == 4:
            lo = r.randrange(0, 3)
            return {"type": "string", "minLength": lo, "maxLength": lo + r.randrange(0, 6)}
        if kind == 5:
            return {"type": "string", "enum": r.sample(["red", "green", "blue", "a b", "ü"], 3)}
        if kind == 6:
            return {"const": r.choice([0, 1, "x", True, None])}
        if kind == 7:
            return {"type": "string", "pattern": r.choice(["[a-c]{1,3}", "[0-9]{2}-[xy]",
                                                           "(ab|cd){1,3}e{0,2}x"])}
        if kind == 8:
            return {"type": "string", "format": r.choice(FORMATS)}
        if kind == 9:
            return {"enum": [1.5, -2, "q", False]}
        if kind == 10:
            return {"type": "integer", "minimum": 0, "maximum": 90, "multipleOf": 3}
        return {"type": ["integer", "null"], "minimum": 1, "maximum": 9}

    def node(self, depth, max_depth):
        r = self.rng
        if depth >= max_depth or r.random() < 0.25:
            return self.leaf()
        kind = r.randrange(6)
        if kind <= 1:
            props = {f"p{i}": self.node(depth + 1, max_depth) for i in range(r.randrange(1, 4))}
            required = [k for k in props if r.random() < 0.6]
            s = {"type": "object", "properties": props, "additionalProperties": False}
            if required:
                s["required"] = required
            return s
        if kind == 2:
            lo = r.randrange(0, 2)
            return {"type": "array", "items": self.node(depth + 1, max_depth),
                    "minItems": lo, "maxItems": lo + r.randrange(0, 3)}
        if kind == 3:
            return {"type": "array", "prefixItems": [self.node(depth + 1, max_depth),
                                                     self.node(depth + 1, max_depth)],
                    "items": False, "minItems": 1}
        if kind == 4:
            return {"anyOf": [self.node(depth + 1, max_depth), self.node(depth + 1, max_depth)]}
        name = f"d{len(self.defs)}"
        self.defs[name] = None  # the name is taken before its schema, which may make others
        self.defs[name] = self.node(depth + 1, max_depth)
        return {"$ref": f"#/$defs/{name}"}

    def schema(self, i):
        self.defs = {}
        max_depth = 1 + i % 8  # 1..8
        root = {"type": "object", "properties": {"v": self.node(1, max_depth),
                                                 "w": self.leaf()},
                "required": ["v"], "additionalProperties": False,
                "title": f"schema {i}", "description": "written for this test"}
        if self.defs:
            root["$defs"] = self.defs
        return root


def post(url, body, timeout=300):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def main() -> int:
    if len(sys.argv) not in (4, 5):
        print(__doc__)
        return 2
    binary, source, data = sys.argv[1:4]
    count = int(sys.argv[4]) if len(sys.argv) == 5 else 500
    try:
        import jsonschema
    except ImportError:
        print("skipped: the jsonschema package is not installed (pip install jsonschema)")
        return SKIP
    tokenizer = os.path.join(os.environ.get("XSERV_DATA", data), "o200k_base.tiktoken")
    if not os.path.exists(tokenizer):
        print(f"skipped: {tokenizer} not found (set XSERV_DATA)")
        return SKIP
    validator = jsonschema.Draft202012Validator
    checker = validator.FORMAT_CHECKER
    gen = Schemas(2026)
    schemas = [gen.schema(i) for i in range(count)]
    for s in schemas:
        validator.check_schema(s)

    failures = []
    endpoint = os.environ.get("XSERV_SCHEMAS_ENDPOINT")
    with tempfile.TemporaryDirectory(prefix="xserv_schemas_") as tmp:
        with (contextlib.nullcontext(endpoint) if endpoint else
              tiny_server(binary, source, tokenizer, tmp,
                          ["--max-seq", "1024", "--max-batch", "16"])) as base:
            url = base + "/v1/completions"

            def one(job):
                i, temperature = job
                body = {"prompt": "Answer in JSON:", "max_tokens": 900,
                        "temperature": temperature, "seed": i}
                if i % 2:
                    body["json_schema"] = schemas[i]
                else:
                    body["response_format"] = {"type": "json_schema", "json_schema": {
                        "name": f"s{i}", "schema": schemas[i], "strict": True}}
                choice = post(url, body)["choices"][0]
                text, finish = choice["text"], choice["finish_reason"]
                try:
                    value = json.loads(text)
                    validator(schemas[i], format_checker=checker).validate(value)
                except Exception as e:  # noqa: BLE001 (any failure is reported with its case)
                    return f"schema {i} at temperature {temperature}: {e}\n  output: {text!r}"
                if finish != "stop":
                    return f"schema {i} at temperature {temperature}: finish {finish}"
                return None

            jobs = [(i, t) for i in range(count) for t in (0, 1)]
            t0 = time.time()
            with concurrent.futures.ThreadPoolExecutor(64 if endpoint else 16) as pool:
                for result in pool.map(one, jobs):
                    if result:
                        failures.append(result)
            elapsed = time.time() - t0
    for f in failures[:10]:
        print(f)
    if failures:
        print(f"FAILED: {len(failures)} of {2 * count} outputs")
        return 1
    print(f"ok: {2 * count} outputs of {count} schemas parse, validate and end by themselves "
          f"({elapsed:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
