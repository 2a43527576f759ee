"""Structured output from the command line: `generate -j/--json-schema(-file)/--grammar(-file)` and
`batch` lines with "json_schema" or "grammar", on the real SmolLM2 model; bad schemas fail up front."""

import json

import jsonschema
import pytest

from tests.conftest import FIXTURES, need
from tests.test_cli import assert_one_line_error, env, llogos  # noqa: F401  (env is a fixture)

# Schemas of the kind applications send: extraction records, enums, nested objects, $defs, formats.
REAL = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email", "maxLength": 64}},   # bounded: -n 120 closes the object
        "required": ["name", "age"], "additionalProperties": False},
    "sentiment": {"type": "object", "properties": {
        "label": {"enum": ["positive", "negative", "neutral"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["label", "confidence"], "additionalProperties": False},
    "order": {"type": "object", "$defs": {"item": {"type": "object", "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 99}},
        "required": ["sku", "quantity"], "additionalProperties": False}},
        "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 3},
                       "express": {"type": "boolean"},
                       "date": {"type": "string", "format": "date"}},
        "required": ["items", "express", "date"], "additionalProperties": False},
    "answer": {"oneOf": [{"type": "object", "properties": {"answer": {"type": "string", "maxLength": 60}},
                          "required": ["answer"], "additionalProperties": False},
                         {"type": "object", "properties": {"error": {"const": "unknown"}},
                          "required": ["error"], "additionalProperties": False}]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 2, "maxItems": 4},
}
PROMPTS = {"person": "Extract the person: Alice Smith is 34 and writes from alice@example.com.\nJSON:",
           "sentiment": "Review: I loved this film, the acting was superb.\nSentiment as JSON:",
           "order": "Order: two of ABC-1234 and one XYZ-0001, express, on 2024-05-01.\nJSON:",
           "answer": "Question: What is the capital of France?\nJSON:",
           "tags": "Tags for a post about baking bread, as a JSON list:"}


def valid(text: str, schema: dict):
    value = json.loads(text)
    jsonschema.validate(value, schema, format_checker=jsonschema.FormatChecker())
    return value


def test_generate_json_schema_inline_and_from_a_file(env, smollm_path, tmp_path):
    schema = REAL["person"]
    r = llogos(env, "generate", "-m", "smollm2-135m", "-p", PROMPTS["person"], "--temp", "0", "-n", "120",
               "-j", json.dumps(schema))
    assert r.returncode == 0, r.stderr
    assert valid(r.stdout, schema)["age"] == 34
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    again = llogos(env, "generate", "-m", "smollm2-135m", "-p", PROMPTS["person"], "--temp", "0", "-n", "120",
                   "--json-schema-file", str(tmp_path / "schema.json"))
    assert again.stdout == r.stdout


def test_generate_sampled_output_validates_too(env, smollm_path):
    schema = REAL["order"]
    r = llogos(env, "generate", "-m", "smollm2-135m", "-p", PROMPTS["order"], "--temp", "1.0", "--seed", "5",
               "-n", "200", "--json-schema", json.dumps(schema), "--json")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert lines[-1]["stop"] == "eos"            # the grammar completed the output
    valid("".join(line.get("text", "") for line in lines), schema)


def test_generate_gbnf_grammar_inline_and_from_a_file(env, smollm_path, tmp_path):
    gbnf = 'root ::= "The answer is " ("yes" | "no") "."'
    r = llogos(env, "generate", "-m", "smollm2-135m", "-p", "Is water wet?", "--temp", "0.7", "--seed", "1",
               "--grammar", gbnf)
    assert r.returncode == 0, r.stderr
    assert r.stdout in ("The answer is yes.", "The answer is no.")
    (tmp_path / "list.gbnf").write_text('root ::= item ("\\n" item){2}\nitem ::= "- " [a-z]+ [a-z ]{0,20}\n')
    r = llogos(env, "generate", "-m", "smollm2-135m", "-p", "Three fruits:\n", "--temp", "0",
               "--grammar-file", str(tmp_path / "list.gbnf"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert len(lines) == 3 and all(line.startswith("- ") for line in lines), r.stdout


@pytest.mark.parametrize("args, fragment", [
    (["-j", '{"type": "array", "uniqueItems": true}'], "uniqueItems"),
    (["-j", "{oops"], "not valid JSON"),
    (["--grammar", 'root ::= "a" rest'], "rest"),
    (["-j", "{}", "--grammar", 'root ::= "a"'], "--json-schema and --grammar"),
    (["--json-schema-file", "/no/such/schema.json"], "/no/such/schema.json"),
])
def test_a_bad_constraint_is_one_line_before_the_model_is_opened(env, args, fragment):
    # The model does not exist: the constraint's error proves it came first.
    assert_one_line_error(llogos(env, "generate", "-m", "no-such-model", "-p", "x", *args), fragment)


def test_batch_lines_each_with_their_own_schema_beside_plain_ones(env, smollm_path, tmp_path):
    lines = [{"id": name, "prompt": PROMPTS[name], "json_schema": schema, "n_predict": 200}
             for name, schema in REAL.items()]
    lines += [{"id": "plain", "prompt": "The capital of France is", "n_predict": 8},
              {"id": "gbnf", "prompt": "Is water wet?", "grammar": 'root ::= ("yes" | "no")'},
              {"id": "bad", "prompt": "x", "json_schema": {"type": "array", "uniqueItems": True}}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = llogos(env, "batch", "-m", "smollm2-135m", "--temp", "0", "-np", "4", "-i", str(tmp_path / "in.jsonl"))
    out = {rec["id"]: rec for rec in map(json.loads, r.stdout.splitlines())}
    for name, schema in REAL.items():
        assert out[name]["stop"] == "eos", out[name]
        valid(out[name]["text"], schema)
    # the batch's weights (auto: the blocks in place, for one sequence and for several alike)
    alone = llogos(env, "generate", "-m", "smollm2-135m", "--temp", "0", "-n", "8", "-p", "The capital of France is")
    assert out["plain"]["text"] == alone.stdout
    assert out["gbnf"]["text"] in ("yes", "no")
    assert "uniqueItems" in out["bad"]["error"]


def test_batch_line_with_both_constraints_is_its_own_error(env, tmp_path):
    model = str(need(FIXTURES / "tiny-llama-f32.gguf"))
    lines = [{"id": 1, "prompt": "a", "json_schema": {}, "grammar": 'root ::= "a"'},
             {"id": 2, "prompt": "a", "json_schema": {"type": "integer", "minimum": 0, "maximum": 9}}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = llogos(env, "batch", "-m", model, "--temp", "0", "-i", str(tmp_path / "in.jsonl"))
    out = {rec["id"]: rec for rec in map(json.loads, r.stdout.splitlines())}
    assert "not both" in out[1]["error"]
    assert 0 <= int(out[2]["text"]) <= 9 and out[2]["stop"] == "eos"

