"""llama.cpp's rule for objects that list properties and say nothing of others: no undeclared key,
wherever the object sits in the schema; an explicit additionalProperties is kept as written."""

import json

import jsonschema
import pytest

from llogos_cli.engine.closed_schema import closed
from llogos_cli.engine.grammar import Grammar, Matcher
from llogos_cli.engine.sampling import SamplingParams
from llogos_cli.errors import LlogosError
from tests.test_grammar import generate, tiny_model

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def accepts(schema, text: str) -> bool:
    """Whether the schema's grammar takes `text` whole and may end there."""
    _, tok = tiny_model()
    matcher = Matcher(Grammar.json_schema(schema), tok)
    try:
        for token_id in tok.encode(text, add_bos=False):
            matcher.consume(token_id)
        return bool(matcher.allowed(tok.n_vocab)[list(tok.eog_ids)].any())
    except LlogosError:
        return False


def test_an_undeclared_key_is_refused_where_additional_properties_is_absent():
    assert accepts(CITY, '{"city": "Paris"}')
    assert not accepts(CITY, '{"city": "Paris", "country": "France"}')
    assert not accepts(CITY, '{"city": "Paris", "properties": {}}')


def test_an_explicit_true_or_schema_is_kept_as_written():
    assert accepts({**CITY, "additionalProperties": True}, '{"city": "Paris", "country": "France"}')
    numbers = {**CITY, "additionalProperties": {"type": "integer"}}
    assert accepts(numbers, '{"city": "Paris", "people": 2}')
    assert not accepts(numbers, '{"city": "Paris", "country": "France"}')


def test_an_object_without_properties_stays_open():
    assert accepts({"type": "object"}, '{"anything": 1}')


@pytest.mark.parametrize("schema, good, extra", [
    ({"type": "object", "properties": {"where": CITY}},
     '{"where": {"city": "Paris"}}', '{"where": {"city": "Paris", "zip": 1}}'),
    ({"type": "array", "items": CITY}, '[{"city": "Paris"}]', '[{"city": "Paris", "zip": 1}]'),
    ({"$defs": {"City": CITY}, "type": "object", "properties": {"c": {"$ref": "#/$defs/City"}}},
     '{"c": {"city": "Paris"}}', '{"c": {"city": "Paris", "zip": 1}}'),
    ({"anyOf": [CITY, {"type": "integer"}]}, '{"city": "Paris"}', '{"city": "Paris", "zip": 1}'),
    ({"type": "object", "properties": {"k": {"type": "string"}},
      "allOf": [CITY, {"type": "object", "properties": {"zip": {"type": "integer"}}}]},
     '{"k": "a", "city": "Paris", "zip": 1}', '{"city": "Paris", "zip": 1, "x": 2}'),
    ({"$defs": {"City": CITY}, "allOf": [{"$ref": "#/$defs/City"},
                                         {"type": "object", "properties": {"zip": {"type": "integer"}}}]},
     '{"city": "Paris", "zip": 1}', '{"city": "Paris", "zip": 1, "x": 2}'),
], ids=["property", "items", "defs", "anyOf", "allOf", "allOf-ref"])
def test_nested_objects_are_closed_too(schema, good, extra):
    assert accepts(schema, good) and not accepts(schema, extra)


def test_the_schema_given_is_not_changed():
    schema = {"type": "object", "properties": {"where": dict(CITY)}}
    assert closed(schema)["properties"]["where"]["additionalProperties"] is False
    assert "additionalProperties" not in schema and "additionalProperties" not in schema["properties"]["where"]


def test_data_that_looks_like_a_schema_is_left_alone():
    schema = {"type": "object", "properties": {"properties": {"const": {"properties": {"a": 1}}}}}
    assert closed(schema)["properties"]["properties"]["const"] == {"properties": {"a": 1}}


@pytest.mark.parametrize("seed", range(4))
def test_a_random_model_sampled_writes_no_undeclared_key(seed):
    """What a batch line's or a request's schema gets: a random model, sampled, would wander into
    other keys wherever the grammar let it."""
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}}
    m, tok = tiny_model()
    text, stop = generate(m, tok, Grammar.json_schema(schema), SamplingParams(temp=1.5, seed=seed))
    assert stop == "eos", text
    jsonschema.validate(json.loads(text), {**schema, "additionalProperties": False})
