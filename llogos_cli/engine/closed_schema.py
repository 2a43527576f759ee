"""llama.cpp's rule for JSON Schema objects: where `properties` is given and `additionalProperties`
is not, no other key is allowed.

JSON Schema itself allows any other key there, and a grammar that does lets a model go on writing
keys nobody declared (a small model copies the schema's own "properties" and "description" into
its arguments). llama.cpp's json-schema conversion closes such objects (faster grammars, fewer
hallucinated keys), and clients written for it send schemas that count on it; llguidance has no
option for it, so the schema is rewritten once before it is compiled. An explicit
`additionalProperties` (true, false or a schema) is kept as written.

The rule applies in every subschema the grammar enforces: properties, items, $defs, anyOf/oneOf
branches. allOf is the one exception, as in llama.cpp: its branches describe one object together,
so the object may have the keys of all of them, and none else.
"""

# Keywords whose value is a schema, a list of schemas, or a map of names to schemas.
_SCHEMA = ("additionalProperties", "items", "additionalItems", "contains", "propertyNames",
           "unevaluatedProperties", "unevaluatedItems")
_SCHEMA_LIST = ("anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def closed(schema):
    """The schema with every object that lists properties, and states nothing about other keys,
    closed to them; the input is left as it was."""
    return _walk(schema, schema, close=True)


def _walk(node, root, close: bool):
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in _SCHEMA_MAP and isinstance(value, dict):
            out[key] = {name: _walk(sub, root, True) for name, sub in value.items()}
        elif key in _SCHEMA_LIST and isinstance(value, list):
            out[key] = [_walk(sub, root, True) for sub in value]
        elif key in _SCHEMA and isinstance(value, dict):
            out[key] = _walk(value, root, True)
        elif key == "allOf" and isinstance(value, list):
            out[key] = [_walk(_inlined(sub, root), root, False) for sub in value]
        else:
            out[key] = value
    if close:
        _close(out)
    return out


def _close(node: dict) -> None:
    """Close the object `node` describes, itself and its allOf branches together."""
    parts = [node, *(b for b in node.get("allOf", ()) if isinstance(b, dict))]
    if any("additionalProperties" in p or "unevaluatedProperties" in p for p in parts):
        return
    named = [p["properties"] for p in parts if isinstance(p.get("properties"), dict)]
    if not named:
        return
    if len(parts) > 1:   # the keys the branches declare are this object's too
        own = node.setdefault("properties", {})
        for properties in named:
            for name in properties:
                own.setdefault(name, {})
    node["additionalProperties"] = False


def _inlined(branch, root):
    """An allOf branch that is only a local $ref, as a copy of what it points at: its keys are
    merged into the object holding the allOf, so it must not be closed on its own."""
    if not (isinstance(branch, dict) and set(branch) == {"$ref"} and isinstance(branch["$ref"], str)
            and branch["$ref"].startswith("#/")):
        return branch
    target = root
    for part in branch["$ref"][2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(target, dict) or part not in target:
            return branch
        target = target[part]
    return target if isinstance(target, dict) else branch
