"""Which JSON Schema keywords xgrammar enforces: each schema is compiled and asked
whether a document that breaks it is accepted ("violating accepted=True": the
keyword compiles to nothing). Feeds constrained/json_schema_support.IGNORED_KEYWORDS.

    python benchmark/xgrammar_keyword_probe.py
"""
import json
import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string as acc
import importlib.metadata as md; print(md.version("xgrammar"))
cases = {
 "not": ({"not": {"type": "string"}}, '"a"'),
 "allOf": ({"allOf": [{"type": "integer"}, {"minimum": 100}]}, '5'),
 "allOf1": ({"allOf": [{"type": "integer"}]}, '"x"'),
 "if": ({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"if":{"properties":{"a":{"const":1}}},"then":{"required":["b"]}}, '{"a": 1}'),
 "dependentRequired": ({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"dependentRequired":{"a":["b"]}}, '{"a": 1}'),
 "dependentSchemas": ({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"dependentSchemas":{"a":{"required":["b"]}}}, '{"a": 1}'),
 "uniqueItems": ({"type":"array","items":{"type":"integer"},"uniqueItems":True}, '[1, 1]'),
 "contains": ({"type":"array","items":{"type":"integer"},"contains":{"const":5}}, '[1]'),
 "minContains": ({"type":"array","items":{"type":"integer"},"contains":{"const":5},"minContains":2}, '[5]'),
 "multipleOf": ({"type":"integer","multipleOf":5}, '3'),
 "propertyNames": ({"type":"object","additionalProperties":{"type":"integer"},"propertyNames":{"pattern":"^a"}}, '{"b": 1}'),
 "patternProperties": ({"type":"object","patternProperties":{"^a":{"type":"integer"}},"additionalProperties":False}, '{"b": 1}'),
 "minProperties": ({"type":"object","additionalProperties":{"type":"integer"},"minProperties":2}, '{"a": 1}'),
 "maxProperties": ({"type":"object","additionalProperties":{"type":"integer"},"maxProperties":1}, '{"a": 1, "b": 2}'),
 "unevaluatedProperties": ({"type":"object","properties":{"a":{"type":"integer"}},"unevaluatedProperties":False}, '{"a": 1, "b": 2}'),
 "oneOf": ({"oneOf":[{"type":"integer"},{"type":"string"}]}, 'true'),
 "minItems": ({"type":"array","items":{"type":"integer"},"minItems":2}, '[1]'),
 "exclusiveMinimum": ({"type":"integer","exclusiveMinimum":5}, '5'),
 "format": ({"type":"string","format":"email"}, '"abc"'),
 "minLength": ({"type":"string","minLength":3}, '"a"'),
 "const": ({"const": 3}, '4'),
 "prefixItems": ({"type":"array","prefixItems":[{"type":"integer"}],"items":False}, '["x"]'),
 "required_noprops": ({"type":"object","required":["a"]}, '{}'),
}
for name, (schema, bad) in cases.items():
    try:
        g = xgr.Grammar.from_json_schema(json.dumps(schema))
        print(f"{name:22s} violating accepted={acc(g, bad)}")
    except Exception as e:
        print(f"{name:22s} compile error {type(e).__name__}: {str(e)[:80]}")
