"""Constrained decoding: schemas and grammars checked up front, masks over the GGUF vocabulary,
and outputs that parse and validate, from one sequence and from rows of a batch side by side."""

import json

import jsonschema
import numpy as np
import pytest

from llogos_cli.backends.cpu.numpy_backend import NumpyBackend
from llogos_cli.engine.batch import BatchEngine, Request
from llogos_cli.engine.generation import Generation
from llogos_cli.engine.grammar import Grammar, Matcher
from llogos_cli.engine.sampling import Sampler, SamplingParams
from llogos_cli.engine.stops import StopCriteria
from llogos_cli.errors import LlogosError
from llogos_cli.gguf.file import GGUFFile
from llogos_cli.model.forward import Model
from llogos_cli.tokenizer.tokenizer import Tokenizer
from tests.conftest import FIXTURES, need

# Schemas a random-weight model must still satisfy: every one bounds its own length.
BOUNDED = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 2, "maxItems": 4},
    {"anyOf": [{"type": "boolean"}, {"const": "none"}]},
    {"type": "object", "properties": {"point": {"$ref": "#/$defs/point"}}, "required": ["point"],
     "additionalProperties": False,
     "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                                          "y": {"type": "integer", "minimum": -9, "maximum": 9}},
                         "required": ["x", "y"], "additionalProperties": False}}},
    {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
    {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}}, "required": ["id"],
     "additionalProperties": False},
    {"oneOf": [{"type": "object", "properties": {"kind": {"const": "cat"},
                                                 "lives": {"type": "integer", "minimum": 1, "maximum": 9}},
                "required": ["kind", "lives"], "additionalProperties": False},
               {"type": "object", "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"}},
                "required": ["kind", "good"], "additionalProperties": False}],
     "discriminator": {"propertyName": "kind"}},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "integer", "minimum": 1, "maximum": 5}},
                "required": ["a"]}, {"type": "object", "additionalProperties": False,
                                     "properties": {"a": {"type": "integer"}}}]},
]


def tiny_model() -> tuple[Model, Tokenizer]:
    f = GGUFFile(need(FIXTURES / "tiny-llama-f32.gguf"))
    return Model(f, NumpyBackend()), Tokenizer.from_gguf(f)


def generate(m: Model, tok: Tokenizer, grammar: Grammar, params: SamplingParams, n: int = 400):
    gen = Generation.alone(m, tok, 512, Request(0, tok.encode("x"), params, StopCriteria(n), grammar=grammar))
    text = "".join(t.text for t in gen) + gen.tail
    return text, gen.stop


# ------------------------------------------------------------------------------- checked up front

@pytest.mark.parametrize("make, fragment", [
    (lambda: Grammar.json_schema("{not json"), "not valid JSON"),
    (lambda: Grammar.json_schema("[1, 2]"), "must be a JSON object"),
    (lambda: Grammar.json_schema({"type": "array", "uniqueItems": True}), "uniqueItems"),
    (lambda: Grammar.json_schema({"not": {"type": "string"}}), "not"),
    (lambda: Grammar.json_schema({"$ref": "#/$defs/missing"}), "/$defs/missing"),
    (lambda: Grammar.json_schema({"type": "string", "pattern": "[a-z"}), "unclosed character class"),
    (lambda: Grammar.json_schema({"type": "string", "format": "no-such-format"}), "no-such-format"),
    (lambda: Grammar.gbnf('root ::= "a" | undefined'), "undefined"),
    (lambda: Grammar.gbnf("   "), "empty"),
])
def test_what_cannot_be_compiled_is_one_line_naming_it(make, fragment):
    with pytest.raises(LlogosError) as e:
        make()
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_a_grammar_is_plain_data_that_travels():
    import pickle
    g = Grammar.json_schema('{"type": "integer"}')
    assert pickle.loads(pickle.dumps(g)) == g and g.what == "JSON schema"


# ------------------------------------------------------------------------------------------ masks

def allowed_texts(matcher: Matcher, tok: Tokenizer) -> set[bytes]:
    return {tok.token_bytes(int(i), special=True) for i in np.flatnonzero(matcher.allowed(tok.n_vocab))}


def test_end_of_generation_only_where_the_grammar_accepts():
    _, tok = tiny_model()
    matcher = Matcher(Grammar.gbnf('root ::= "ab" "c"?'), tok)
    mask = matcher.allowed(tok.n_vocab + 7)   # logits padded past the vocabulary
    assert not mask[tok.n_vocab:].any() and not mask[list(tok.eog_ids)].any()
    assert all(b"ab".startswith(t) for t in allowed_texts(matcher, tok))
    for token_id in tok.encode("ab", add_bos=False):
        matcher.consume(token_id)
    mask = matcher.allowed(tok.n_vocab)
    assert mask[list(tok.eog_ids)].all() and not matcher.done    # "ab" may end, or take "c"
    matcher.consume(tok.encode("c", add_bos=False)[0])
    assert matcher.done


def test_control_tokens_never_spell_grammar_text():
    _, tok = tiny_model()
    hidden = [i for i in range(tok.n_vocab) if tok.token_bytes(i) == b"" and tok.token_bytes(i, special=True)]
    assert hidden
    matcher = Matcher(Grammar.gbnf("root ::= [^\\n]+"), tok)
    assert not matcher.allowed(tok.n_vocab)[hidden].any()


def sentencepiece_tokenizer() -> Tokenizer:
    words = ["▁a", "▁b", "a", "b", "▁", "{", "}", "\"", ":"]
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *words]
    types = [2, 3, 3, *[6] * 256, *[1] * len(words)]
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.scores": [0.0] * len(tokens), "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2}
    return Tokenizer(meta, "spm-test")


def test_sentencepiece_spaces_and_byte_tokens_are_their_bytes():
    tok = sentencepiece_tokenizer()
    matcher = Matcher(Grammar.gbnf('root ::= "a" (" a" | " b") "\\n"'), tok)
    assert allowed_texts(matcher, tok) == {b"a"}
    matcher.consume(tok.token_id("a"))
    after_a = allowed_texts(matcher, tok)
    assert {b" a", b" b"} <= after_a <= {b" a", b" b", b" "}      # ▁a, ▁b (and ▁) are spaces
    matcher.consume(tok.token_id("▁b"))
    assert allowed_texts(matcher, tok) == {b"\n"}                # only the byte token <0x0A>
    matcher.consume(tok.token_id("<0x0A>"))
    assert matcher.done and matcher.allowed(tok.n_vocab)[tok.eos_id]


def test_forced_text_is_spelled_without_sentencepieces_leading_space():
    tok = sentencepiece_tokenizer()
    matcher = Matcher(Grammar.gbnf('root ::= "a b"'), tok)
    assert allowed_texts(matcher, tok) == {b"a"}


def test_the_sampler_chooses_only_allowed_tokens_greedy_or_sampled():
    logits = np.array([5.0, 1.0, 4.0, 0.5, 3.0], np.float32)
    allowed = np.array([False, True, False, True, True])
    assert Sampler(SamplingParams(temp=0.0), 100).sample(logits, allowed) == 4
    sampler = Sampler(SamplingParams(temp=2.0, top_k=2, top_p=1.0, min_p=0.0, seed=1), 100)
    draws = {sampler.sample(logits, allowed) for _ in range(200)}
    assert draws == {1, 4}   # top-k counts allowed tokens only


# -------------------------------------------------------------------------------------- outputs

@pytest.mark.parametrize("schema", BOUNDED, ids=range(len(BOUNDED)))
@pytest.mark.parametrize("temp", [0.0, 1.0])
def test_a_random_model_still_writes_valid_json(schema, temp):
    m, tok = tiny_model()
    text, stop = generate(m, tok, Grammar.json_schema(schema), SamplingParams(temp=temp, seed=7))
    assert stop == "eos", text
    jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())


def test_a_gbnf_grammar_shapes_the_output():
    m, tok = tiny_model()
    gbnf = 'root ::= item ("," item){2,3}\nitem ::= [a-c] [0-9]'
    text, stop = generate(m, tok, Grammar.gbnf(gbnf), SamplingParams(temp=1.0, seed=3))
    items = text.split(",")
    assert stop == "eos" and 3 <= len(items) <= 4
    assert all(len(i) == 2 and i[0] in "abc" and i[1].isdigit() for i in items), text


def test_the_token_limit_still_ends_a_constrained_row():
    m, tok = tiny_model()
    text, stop = generate(m, tok, Grammar.json_schema({"type": "array", "items": {"type": "integer"}}),
                          SamplingParams(temp=1.0, seed=1), n=5)
    assert stop == "limit" and text.startswith("[")


def test_batch_rows_are_constrained_each_on_its_own():
    m, tok = tiny_model()
    prompt = tok.encode("a b c")
    plain = Request("plain", prompt, SamplingParams(temp=0.0), StopCriteria(12, ignore_eos=True))
    rows = [plain, *(Request(f"s{i}", prompt, SamplingParams(temp=1.0, seed=i), StopCriteria(400),
                             grammar=Grammar.json_schema(schema)) for i, schema in enumerate(BOUNDED[:4]))]
    alone = next(BatchEngine(m, tok, 1, 512).generate([plain]))
    results = {r.id: r for r in BatchEngine(m, tok, 3, 512).generate(rows)}
    assert results["plain"].tokens == alone.tokens
    for i, schema in enumerate(BOUNDED[:4]):
        assert results[f"s{i}"].stop == "eos"
        jsonschema.validate(json.loads(results[f"s{i}"].text), schema)


def test_greedy_grammar_rows_are_masked_where_the_logits_are():
    """Greedy rows with a grammar send their bitmasks to the backend (mask_logits) and take the
    argmax there, as unconstrained greedy rows do: no logits row crosses to the host, and every
    row chooses what the host's masked sampling chose (asking for logprobs keeps a row on the
    host), beside a plain greedy row in the same steps."""
    m, tok = tiny_model()
    prompt = tok.encode("a b c")

    def rows(n_logprobs: int) -> list:
        return [Request("plain", prompt, SamplingParams(temp=0.0), StopCriteria(12, ignore_eos=True)),
                *(Request(f"s{i}", prompt, SamplingParams(temp=0.0), StopCriteria(400), n_logprobs,
                          Grammar.json_schema(schema)) for i, schema in enumerate(BOUNDED[:3]))]

    crossed = []
    to_host = m.backend.to_host
    m.backend.to_host = lambda x: crossed.append(np.shape(x)) or to_host(x)
    on_device = {r.id: r for r in BatchEngine(m, tok, 4, 512).generate(rows(0))}
    assert not [shape for shape in crossed if shape[-1:] == (m.cfg.n_vocab,)]
    on_host = {r.id: r for r in BatchEngine(m, tok, 4, 512).generate(rows(1))}
    assert [shape for shape in crossed if shape[-1:] == (m.cfg.n_vocab,)]
    for i, schema in enumerate(BOUNDED[:3]):
        assert on_device[f"s{i}"].tokens == on_host[f"s{i}"].tokens
        jsonschema.validate(json.loads(on_device[f"s{i}"].text), schema)
    assert on_device["plain"].tokens == on_host["plain"].tokens


def test_a_mask_s_bits_are_the_allowed_tokens():
    m, tok = tiny_model()
    matcher = Matcher(Grammar.json_schema(BOUNDED[0]), tok)
    logits = np.random.default_rng(2).standard_normal((1, tok.n_vocab + 5)).astype(np.float32)
    masked = m.backend.mask_logits(logits, matcher.bits()[None])
    assert np.array_equal(np.isfinite(masked[0]), matcher.allowed(tok.n_vocab + 5))


def test_a_mask_started_ahead_is_the_mask_computed_in_place():
    """start() computes the next mask on the mask thread; allowed() and consume() wait for it, so a
    matcher walked with masks started ahead matches one walked without, token for token."""
    m, tok = tiny_model()
    grammar = Grammar.json_schema(BOUNDED[3])
    ahead, in_place = Matcher(grammar, tok), Matcher(grammar, tok)
    logits = np.random.default_rng(4).standard_normal(tok.n_vocab).astype(np.float32)
    sampler = Sampler(SamplingParams(temp=1.0, seed=3), 512)
    for step in range(200):
        ahead.start()
        mask = in_place.allowed(tok.n_vocab)
        if step % 5 != 4:   # else advanced while its mask is still in flight: consume waits for it
            assert np.array_equal(ahead.allowed(tok.n_vocab), mask), step
        token_id = sampler.sample(logits, mask)
        ahead.consume(token_id)
        in_place.consume(token_id)
        if in_place.done:
            break
    assert ahead.done and in_place.done


def test_the_batch_engine_starts_masks_before_the_forward_pass():
    m, tok = tiny_model()
    prompt = tok.encode("a b c")
    rows = [Request(f"s{i}", prompt, SamplingParams(temp=1.0, seed=i), StopCriteria(400),
                    grammar=Grammar.json_schema(schema)) for i, schema in enumerate(BOUNDED[:3])]
    engine = BatchEngine(m, tok, 3, 512)
    run, started = engine.runner.run, []

    def run_and_look(work):
        started.extend(w.row.completion.matcher._pending is not None for w in work if w.samples)
        return run(work)

    engine.runner.run = run_and_look
    results = {r.id: r for r in engine.generate(rows)}
    assert len(started) >= 3 * 5 and all(started)
    for i, schema in enumerate(BOUNDED[:3]):
        jsonschema.validate(json.loads(results[f"s{i}"].text), schema)


def test_a_real_sentencepiece_model_writes_valid_json(gemma_path):
    from llogos_cli.model.loader import load
    loaded = load("gemma3-270m", "cpu", n_ctx=512)
    schema = BOUNDED[0]
    text, stop = generate(loaded.model, loaded.tokenizer, Grammar.json_schema(schema), SamplingParams(temp=0.0))
    assert stop == "eos"
    jsonschema.validate(json.loads(text), schema)
    gbnf = 'root ::= "- " word ("\\n- " word){2}\nword ::= [a-z]{1,12}'   # bounded: sampled, a word could run on
    text, stop = generate(loaded.model, loaded.tokenizer, Grammar.gbnf(gbnf), SamplingParams(temp=0.8, seed=3))
    lines = text.split("\n")
    assert stop == "eos" and len(lines) == 3 and all(line.startswith("- ") and line[2:].isalpha() for line in lines)
