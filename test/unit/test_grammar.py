"""Grammar-constrained decoding parts: the xgrammar backend on a real tokenizer, the
compile manager (cache, errors, time-out, abort) and the sampler's mask."""

from __future__ import annotations

import json
import re
import threading
import time
from types import SimpleNamespace

import jsonschema
import pytest
import torch
from transformers import PreTrainedTokenizerFast

from sglang.srt.constrained.backends import GrammarBackendUnavailable
from sglang.srt.constrained.base import (
    ANY_JSON_OBJECT,
    GrammarBackend,
    GrammarKey,
    InvalidGrammarError,
    key_of,
)
from sglang.srt.constrained.grammar_manager import GrammarManager
from sglang.srt.constrained.reasoning_gate import ReasoningGate
from sglang.srt.constrained.xgrammar_backend import MAX_JSON_WHITESPACE, XGrammarBackend
from sglang.srt.layers.sampler import Sampler
from sglang.srt.managers.scheduler_parts import grammar as grammar_part
from sglang.srt.managers.scheduler_parts.grammar import SchedulerGrammarMixin
from sglang.srt.managers.scheduler_parts.tensor_parallel import TpSync
from sglang.srt.parser.function_call import tool_call_schema
from sglang.srt.parser.function_call.strict_calls import strict_tools_tag
from sglang.srt.runtime_context import get_exec, publish
from sglang.srt.sampling.param_types import InvalidParamError
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.test.corpus import EOS_TOKEN
from sglang.test.make_tiny_model import VOCAB_SIZE, cached_tokenizer

MODEL_VOCAB = VOCAB_SIZE + 64  # logits wider than the tokenizer, as padded models have
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2},
    },
    "required": ["name", "n", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer():
    tok = PreTrainedTokenizerFast(tokenizer_object=cached_tokenizer(), eos_token=EOS_TOKEN)
    return tok


@pytest.fixture(scope="module")
def backend(tokenizer) -> XGrammarBackend:
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    return XGrammarBackend(tokenizer, MODEL_VOCAB, [eos], any_whitespace=False)


def run_constrained(backend, tokenizer, key: GrammarKey, seed: int, max_tokens: int = 200):
    """Sample random logits under the grammar until it terminates; the text."""
    grammar = backend.new_grammar(backend.compile(key))
    gen = torch.Generator().manual_seed(seed)
    out: list[int] = []
    for _ in range(max_tokens):
        bitmask = backend.allocate_bitmask(1)
        grammar.fill_bitmask(bitmask, 0)
        logits = torch.randn(1, MODEL_VOCAB, generator=gen)
        backend.apply_bitmask(logits, bitmask, [0])
        token = int(logits.argmax())
        assert grammar.accept_token(token)
        if grammar.is_terminated():
            return tokenizer.decode(out)  # the stop token is not part of the text
        out.append(token)
    raise AssertionError(f"grammar did not terminate in {max_tokens} tokens")


@pytest.mark.parametrize("seed", range(5))
def test_json_schema_output_validates(backend, tokenizer, seed):
    text = run_constrained(backend, tokenizer, GrammarKey("json_schema", json.dumps(SCHEMA)), seed)
    value = json.loads(text)
    assert set(value) == {"name", "n", "tags"}
    assert 0 <= value["n"] <= 99 and len(value["name"]) <= 6
    assert set(value["tags"]) <= {"x", "y"} and len(value["tags"]) <= 2


@pytest.mark.parametrize("seed", range(3))
def test_forced_tool_calls_keep_the_tools_definitions(backend, tokenizer, seed):
    # pydantic writes nested models as "$defs" + "#/$defs/..." refs, and a recursive
    # one as "#": inside the calls' array they must still point at the tool's own schema
    loc = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Rome"]}},
           "required": ["city"], "additionalProperties": False}  # fmt: skip
    tree = {"type": "object", "properties": {"kids": {"type": "array", "maxItems": 1,
            "items": {"$ref": "#"}}}, "required": ["kids"], "additionalProperties": False}  # fmt: skip
    tools = [
        {"type": "function", "function": {"name": "go", "parameters": {
            "$defs": {"Loc": loc}, "type": "object", "properties": {"to": {"$ref": "#/$defs/Loc"}},
            "required": ["to"], "additionalProperties": False}}},  # fmt: skip
        {"type": "function", "function": {"name": "tree", "parameters": tree}},
    ]
    schema = tool_call_schema(tools, "required")
    text = run_constrained(backend, tokenizer, GrammarKey("json_schema", json.dumps(schema)),
                           seed, max_tokens=400)  # fmt: skip
    calls = json.loads(text)
    jsonschema.validate(calls, schema)
    for call in calls:
        expected = tools[0 if call["name"] == "go" else 1]["function"]["parameters"]
        jsonschema.validate(call["parameters"], expected)  # the tool's own schema


def _accepts(backend, tokenizer, key: GrammarKey, text: str) -> bool:
    grammar = backend.new_grammar(backend.compile(key))
    return all(grammar.accept_token(t) for t in tokenizer.encode(text, add_special_tokens=False))


def test_a_strict_tools_tag_holds_a_started_call_to_its_schema(backend, tokenizer):
    params = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}  # fmt: skip
    tools = [{"type": "function", "function": {"name": "f", "strict": True, "parameters": params}}]
    key = GrammarKey("structural_tag", json.dumps(strict_tools_tag(tools, "qwen25")))
    assert _accepts(backend, tokenizer, key, "Sure, no tool needed here.")  # text is free
    assert _accepts(backend, tokenizer, key, 'Ok <tool_call>\n{"name": "f", "arguments": {"n": 3}}')
    assert not _accepts(backend, tokenizer, key, '<tool_call>\n{"name": "f", "arguments": {"n": "x"')
    assert not _accepts(backend, tokenizer, key, '<tool_call>\n{"name": "g"')
    unenforceable = [{"type": "function", "function": {"name": "f", "strict": True,
                      "parameters": {"type": "array", "uniqueItems": True}}}]  # fmt: skip
    with pytest.raises(InvalidGrammarError, match="uniqueItems"):
        backend.compile(GrammarKey("structural_tag",
                                   json.dumps(strict_tools_tag(unenforceable, "qwen25"))))  # fmt: skip


@pytest.mark.parametrize("length", [{"maxLength": 6}, {"minLength": 1}, {}])
def test_json_strings_admit_no_raw_control_characters(backend, tokenizer, length):
    # JSON allows U+0000-U+001F in a string only escaped (json.loads refuses them raw);
    # xgrammar 0.2.9 lets them into length-limited strings unless held back
    schema = {"type": "object", "properties": {"s": {"type": "string", **length}},
              "required": ["s"]}  # fmt: skip
    tag = {"structures": [{"begin": "<f>", "schema": schema, "end": "</f>"}], "triggers": ["<f>"]}
    for key, opening in ((GrammarKey("json_schema", json.dumps(schema)), ""),
                         (GrammarKey("structural_tag", json.dumps(tag)), "x <f>")):  # fmt: skip
        compiled = backend.compile(key)
        for char in ("\x1e", "\t", "\n", "\x00"):
            grammar = backend.new_grammar(compiled)
            ids = tokenizer.encode(opening + '{"s": "a' + char, add_special_tokens=False)
            assert not all(grammar.accept_token(t) for t in ids), (key.kind, repr(char))
        grammar = backend.new_grammar(compiled)
        ids = tokenizer.encode(opening + '{"s": "a b"}', add_special_tokens=False)
        assert all(grammar.accept_token(t) for t in ids), key.kind


@pytest.mark.parametrize("seed", range(5))
def test_regex_ebnf_and_any_json(backend, tokenizer, seed):
    regex = r"(cat|dog)s? [0-9]{1,3}"
    assert re.fullmatch(
        regex, run_constrained(backend, tokenizer, GrammarKey("regex", regex), seed)
    )
    ebnf = 'root ::= "yes" | "no" | "maybe " [0-9]'
    text = run_constrained(backend, tokenizer, GrammarKey("ebnf", ebnf), seed)
    assert re.fullmatch(r"yes|no|maybe [0-9]", text)
    text = run_constrained(
        backend, tokenizer, GrammarKey("json_schema", ANY_JSON_OBJECT), seed, 2000
    )
    assert isinstance(json.loads(text), dict)  # an object, not any JSON value


def test_structural_tag_constrains_the_tagged_part(backend, tokenizer):
    spec = {
        "structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>"}],
        "triggers": ["<f>"],
    }
    grammar = backend.new_grammar(backend.compile(GrammarKey("structural_tag", json.dumps(spec))))
    for token in tokenizer.encode('<f>{"name": "ab", "n": 3, "tags": []}</f>'):
        assert grammar.accept_token(token)
    inside = backend.new_grammar(backend.compile(GrammarKey("structural_tag", json.dumps(spec))))
    ids = tokenizer.encode('<f>{"nope": 1}')
    assert not all(inside.accept_token(t) for t in ids)


@pytest.mark.parametrize(
    "kind, text",
    [("regex", "a(b"), ("ebnf", "root ::= undefined_rule"), ("json_schema", '{"type": "bogus"}')],
)
def test_invalid_constraint_names_its_field(backend, kind, text):
    with pytest.raises(InvalidGrammarError) as info:
        backend.compile(GrammarKey(kind, text))
    assert info.value.param == kind and str(info.value).startswith(f"invalid {kind}: ")
    assert ".cc:" not in str(info.value)  # the library's source location is stripped


def test_json_constraints_must_be_json_and_exclusive():
    with pytest.raises(InvalidParamError, match="json_schema is not valid JSON"):
        SamplingParams.from_dict({"json_schema": "{x"}).verify()
    with pytest.raises(InvalidParamError, match="mutually exclusive") as info:
        SamplingParams.from_dict({"regex": "a", "ebnf": 'root ::= "a"'}).verify()
    assert info.value.param == "ebnf"
    for kind in ("json_schema", "structural_tag"):  # `null` parsed is no "too deep"
        with pytest.raises(InvalidParamError, match=f"{kind} must be a JSON object"):
            SamplingParams.from_dict({kind: "null"}).verify()
    with pytest.raises(InvalidParamError, match="nests more than"):
        SamplingParams.from_dict({"json_schema": "[" * 5000 + "]" * 5000}).verify()
    assert key_of(SamplingParams.from_dict({"regex": "a+"})) == GrammarKey("regex", "a+")
    assert key_of(SamplingParams.from_dict({})) is None


def test_rollback_restores_the_matcher(backend, tokenizer):
    grammar = backend.new_grammar(backend.compile(GrammarKey("regex", "abc|abd")))
    ids = tokenizer.encode("abc")
    for t in ids:
        assert grammar.accept_token(t)
    grammar.rollback(len(ids))
    for t in tokenizer.encode("abd"):
        assert grammar.accept_token(t)


# --- the manager ---------------------------------------------------------------------------


class CountingBackend(GrammarBackend):
    """Wraps the real backend: counts compiles, can hold a compile until released."""

    name = "counting"

    def __init__(self, inner: XGrammarBackend) -> None:
        self.inner, self.compiles, self.release = inner, 0, threading.Event()
        self.release.set()
        self.hold_text: str | None = None  # only this constraint is held (None: all)

    def compile(self, key):
        self.compiles += 1
        if self.hold_text is None or key.text == self.hold_text:
            self.release.wait(10)
        return self.inner.compile(key)

    def new_grammar(self, compiled):
        return self.inner.new_grammar(compiled)

    def allocate_bitmask(self, rows):
        return self.inner.allocate_bitmask(rows)

    def apply_bitmask(self, logits, bitmask, rows):
        self.inner.apply_bitmask(logits, bitmask, rows)


def req(rid: str, **params) -> SimpleNamespace:
    return SimpleNamespace(rid=rid, grammar=None, sampling_params=SamplingParams.from_dict(params))


def drain(manager: GrammarManager, timeout_s: float = 10.0):
    ready, failed = [], []
    deadline = time.monotonic() + timeout_s
    while len(manager) and time.monotonic() < deadline:
        manager.wait(0.05)
        got, bad = manager.pop_ready()
        ready += got
        failed += bad
    return ready, failed


def test_manager_compiles_once_per_constraint_and_reports_errors(backend):
    counting = CountingBackend(backend)
    manager = GrammarManager(lambda: counting, timeout_s=30)
    reqs = [req(f"r{i}", regex="[a-c]{2}") for i in range(4)] + [req("bad", regex="(")]
    for r in reqs:
        manager.submit(r, key_of(r.sampling_params))
    ready, failed = drain(manager)
    assert sorted(r.rid for r in ready) == ["r0", "r1", "r2", "r3"]
    assert all(r.grammar is not None for r in ready)
    assert len({id(r.grammar) for r in ready}) == 4  # one matcher per request
    assert [(r.rid, e.param) for r, e in failed] == [("bad", "regex")]
    assert counting.compiles == 2  # the four equal constraints compiled once
    manager.shutdown()


def test_manager_times_out_and_aborts(backend):
    counting = CountingBackend(backend)
    counting.release.clear()  # the compile hangs
    manager = GrammarManager(lambda: counting, timeout_s=0.2)
    slow, gone = req("slow", regex="x+"), req("gone", regex="y+")
    manager.submit(slow, key_of(slow.sampling_params))
    manager.submit(gone, key_of(gone.sampling_params))
    assert manager.remove("gone") is gone and manager.remove("gone") is None
    ready, failed = drain(manager)
    assert ready == [] and [r.rid for r, _ in failed] == ["slow"]
    assert "took longer than 0.2 s" in str(failed[0][1]) and failed[0][1].param == "regex"
    counting.release.set()
    manager.shutdown()


def test_a_slow_compile_fails_alone_and_its_result_is_kept(backend):
    """A constraint queued behind one that runs past the timeout is compiled (it does not
    fail with it); a retry of the slow one joins its compile, and once that ends a
    retry is served from the cache."""
    counting = CountingBackend(backend)
    counting.release.clear()
    counting.hold_text = "x+"
    manager = GrammarManager(lambda: counting, timeout_s=0.3)
    slow, quick = req("slow", regex="x+"), req("quick", regex="[0-9]{2}q")
    for r in (slow, quick):
        manager.submit(r, key_of(r.sampling_params))
    ready, failed = drain(manager)
    assert [r.rid for r in ready] == ["quick"] and [r.rid for r, _ in failed] == ["slow"]
    retry = req("retry", regex="x+")
    manager.submit(retry, key_of(retry.sampling_params))
    ready, failed = drain(manager)
    assert ready == [] and [r.rid for r, _ in failed] == ["retry"]
    assert counting.compiles == 2  # the retry joined the running compile
    counting.release.set()
    again = req("again", regex="x+")
    deadline = time.monotonic() + 10
    while manager._cache[key_of(again.sampling_params)].future.done() is False:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    manager.submit(again, key_of(again.sampling_params))
    ready, failed = drain(manager)
    assert [r.rid for r in ready] == ["again"] and counting.compiles == 2
    manager.shutdown()


def test_an_aborted_request_drops_its_queued_compile(backend):
    counting = CountingBackend(backend)
    counting.release.clear()
    manager = GrammarManager(lambda: counting, timeout_s=30)
    first, dropped = req("first", regex="a+"), req("dropped", regex="b+")
    for r in (first, dropped):
        manager.submit(r, key_of(r.sampling_params))
    assert manager.remove("dropped") is dropped
    counting.release.set()
    ready, failed = drain(manager)
    assert [r.rid for r in ready] == ["first"] and failed == []
    assert counting.compiles == 1  # "b+" never compiled
    manager.shutdown()


def test_manager_builds_its_backend_once_on_the_first_constraint(backend):
    """No constraint, no backend: a server that never sees one never imports xgrammar."""
    built = []
    manager = GrammarManager(lambda: built.append(1) or backend, timeout_s=30)
    assert built == [] and manager.mask_for([req("free")]) is None
    reqs = [req("a", regex="[a-c]{2}"), req("b", regex="x+"), req("c", regex="[a-c]{2}")]
    for r in reqs:
        manager.submit(r, key_of(r.sampling_params))
    ready, failed = drain(manager)
    assert sorted(r.rid for r in ready) == ["a", "b", "c"] and failed == []
    assert built == [1] and manager.backend is backend
    manager.shutdown()


def test_a_backend_that_cannot_be_built_fails_every_waiting_request():
    def unbuildable():
        raise GrammarBackendUnavailable("RuntimeError: vocabulary unreadable")

    manager = GrammarManager(unbuildable, timeout_s=30)
    reqs = [req("a", regex="x+"), req("b", json_schema=json.dumps(SCHEMA))]
    for r in reqs:
        manager.submit(r, key_of(r.sampling_params))
    ready, failed = drain(manager)
    assert ready == [] and sorted(r.rid for r, _ in failed) == ["a", "b"]
    assert all(isinstance(e, GrammarBackendUnavailable) for _, e in failed)
    assert "vocabulary unreadable" in str(manager.backend_error)
    manager.shutdown()


class GrammarOnlyScheduler(SchedulerGrammarMixin):
    """The scheduler's grammar part alone, over a real tokenizer."""

    def __init__(self, tokenizer) -> None:
        self.tp_sync = TpSync(1)
        self.waiting_queue, self.pending_outputs = [], []
        self.tokenizer, self.vocab_size = tokenizer, MODEL_VOCAB
        self.eos_token_ids = {tokenizer.convert_tokens_to_ids(EOS_TOKEN)}
        self._init_grammar("xgrammar", any_whitespace=False, blocking=True)


def test_scheduler_falls_back_when_the_first_constraint_cannot_build_the_backend(
    clean_context, tokenizer, monkeypatch
):
    """A backend that passed the start-up check but fails to build on first use: that
    request and later ones get a 400 saying why, the readback says "none"."""
    publish(ServerArgs(model_path="org/model", device="cpu"), role="test")

    def unbuildable(*args):
        raise GrammarBackendUnavailable("RuntimeError: vocabulary unreadable")

    monkeypatch.setattr(grammar_part, "create_grammar_backend", unbuildable)
    sched = GrammarOnlyScheduler(tokenizer)
    assert sched.grammar_manager is not None  # checked, not built
    first, later, free = req("first", regex="x+"), req("later", regex="y+"), req("free")
    assert sched.submit_if_constrained(first) and not sched.submit_if_constrained(free)
    sched.admit_compiled_grammars(block_s=5.0)
    assert sched.grammar_manager is None and sched.waiting_queue == []
    assert sched.submit_if_constrained(later)
    assert [r.rid for r in sched.pending_outputs] == ["first", "later"]
    for r in sched.pending_outputs:
        reason = r.finished_reason
        assert reason["status_code"] == 400 and reason["param"] == "sampling_params.regex"
        assert "xgrammar is unavailable (RuntimeError: vocabulary unreadable)" in reason["message"]
    assert get_exec().features.grammar_backend == "none"


class OtherRankEnded:
    """A TpSync of 2 ranks whose other rank ended each queued compile as `ready` says."""

    tp_size = 2

    def __init__(self, ready: list[int]) -> None:
        self.ready = ready

    def agree_min(self, values: list[int]) -> list[int]:
        return [min(mine, other) for mine, other in zip(values, self.ready)]


def test_tp_ranks_admit_a_constraint_only_where_every_rank_compiled_it(clean_context, tokenizer):
    """Each rank compiles and times out on its own clock: one rank admitting a request
    the other had failed ran a batch the other did not (its collectives hung for
    SGLANG_DIST_TIMEOUT, then the server died). It fails on both, as a timeout."""
    publish(ServerArgs(model_path="org/model", device="cpu"), role="test")
    sched = GrammarOnlyScheduler(tokenizer)
    sched.tp_sync = OtherRankEnded([0, 1])  # the other rank timed out on the first
    first, second = req("first", regex="x+"), req("second", regex="y+")
    second.reasoning_end_token_id = None
    assert sched.submit_if_constrained(first) and sched.submit_if_constrained(second)
    sched.admit_compiled_grammars(block_s=5.0)
    assert sched.waiting_queue == [second] and first.grammar is None
    (failed,) = sched.pending_outputs
    assert failed is first and failed.finished_reason["status_code"] == 400
    assert "SGLANG_GRAMMAR_TIMEOUT" in failed.finished_reason["message"]


def test_mask_covers_constrained_rows_only_in_the_sampler(backend, tokenizer):
    manager = GrammarManager(lambda: backend, timeout_s=30)
    free, fixed = req("free"), req("fixed", regex="hello")
    manager.submit(fixed, key_of(fixed.sampling_params))
    drain(manager)
    batch = [free, fixed, free]
    assert manager.mask_for([free]) is None  # an unconstrained batch pays nothing
    mask = manager.mask_for(batch)
    assert mask.rows == [1]
    logits = torch.randn(3, MODEL_VOCAB, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams.from_dict({"temperature": t}) for t in (0.0, 1.0, 0.0)]
    info = SamplingBatchInfo.from_requests(params, [[], [], []], MODEL_VOCAB)
    info.grammar_mask = mask
    for seed in range(5):
        torch.manual_seed(seed)
        ids = Sampler()(logits, info).next_token_ids.tolist()
        assert ids[0] == int(logits[0].argmax()) and ids[2] == int(logits[2].argmax())
        assert "hello".startswith(tokenizer.decode([ids[1]]))  # the regex allows no other
    manager.shutdown()


def test_free_json_whitespace_is_bounded(tokenizer):
    """With free whitespace on (the default), a run between JSON tokens is capped, so a weak
    model cannot spend its whole output on newlines; compact mode allows none."""
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    loose = XGrammarBackend(tokenizer, MODEL_VOCAB, [eos], any_whitespace=True)
    grammar = loose.new_grammar(loose.compile(GrammarKey("json_schema", json.dumps(SCHEMA))))
    (brace,) = tokenizer.encode("{")
    (newline,) = tokenizer.encode("\n")
    assert grammar.accept_token(brace)
    accepted = 0
    while accepted <= MAX_JSON_WHITESPACE and grammar.accept_token(newline):
        accepted += 1
    assert accepted == MAX_JSON_WHITESPACE
    compact = XGrammarBackend(tokenizer, MODEL_VOCAB, [eos], any_whitespace=False)
    strict = compact.new_grammar(compact.compile(GrammarKey("json_schema", json.dumps(SCHEMA))))
    assert strict.accept_token(brace) and not strict.accept_token(newline)


# --- schemas the backend would compile but not enforce --------------------------------------

UNENFORCEABLE = {
    "not": {"not": {"type": "string"}},
    "allOf": {"allOf": [{"type": "integer"}, {"minimum": 100}]},
    "if": {"type": "object", "properties": {"a": {"type": "integer"}},
           "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["a"]}},
    "dependentRequired": {"type": "object", "properties": {"a": {}, "b": {}},
                          "dependentRequired": {"a": ["b"]}},
    "uniqueItems": {"type": "object", "properties": {"tags": {
        "type": "array", "items": {"type": "integer"}, "uniqueItems": True}}},
    "contains": {"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}},
    "required": {"type": "object", "required": ["a"]},
    "dependencies": {"type": "object", "properties": {"a": {}, "b": {}},
                     "dependencies": {"a": ["b"]}},  # draft 7
    "multipleOf_number": {"type": "number", "multipleOf": 0.5},
    "multipleOf_untyped": {"multipleOf": 2},
    "remote_ref": {"$ref": "http://example.com/schema.json"},
    "enum_of_another_type": {"type": "string", "enum": ["a", 1]},  # 1 was produced
    "const_of_another_type": {"type": "integer", "const": 1.5},
    "oneOf_overlapping_types": {"oneOf": [{"type": "integer"}, {"type": "number"}]},
    "oneOf_overlapping_objects": {"oneOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}},
        {"type": "object", "properties": {"b": {"type": "integer"}}}]},
    # number ranges are written with 6 decimals: none fits, the value compiled to ""
    "number_range_below_6_decimals": {"type": "number", "minimum": 1e-7, "maximum": 2e-7},
    "open_number_range": {"type": "object", "properties": {"x": {
        "type": "number", "exclusiveMinimum": 0.1, "maximum": 0.1000001}}},
    # length limits next to pattern / format are dropped
    "pattern_with_maxLength": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3},
    "format_with_minLength": {"type": "string", "format": "email", "minLength": 12},
    # literal pattern characters are written raw into the JSON text
    "pattern_with_control_escapes": {"type": "string", "pattern": "^\\n\\t$"},
    "pattern_with_raw_newline": {"type": "string", "pattern": "^\n$"},
    "pattern_with_quote": {"type": "string", "pattern": '^"\\\\$'},
    "pattern_with_control_class": {"type": "string", "pattern": "^[\\x00-\\x1f]{2}$"},
    "number_range_as_type_list": {"type": ["number", "null"], "minimum": 1e-7, "maximum": 2e-7},
    "format_with_tight_maxLength": {"type": "string", "format": "email", "maxLength": 10},
    "pattern_longer_than_maxLength": {"type": "string", "pattern": "^[A-Z]{3,5}$", "maxLength": 4},
}  # fmt: skip
_PETS = {"Cat": {"type": "object", "properties": {"kind": {"const": "cat"}}, "required": ["kind"]},
         "Dog": {"type": "object", "properties": {"kind": {"const": "dog"}}, "required": ["kind"]}}
ENFORCEABLE = [
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"allOf": [{"$ref": "#/$defs/x"}], "$defs": {"x": {"type": "integer"}}},
    {"type": "array", "items": {"type": "integer"}, "uniqueItems": False},
    {"type": "object", "required": ["a"], "additionalProperties": {"type": "integer"}},
    {"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"if": {"type": "string"}}}]},
    {"type": "integer", "multipleOf": 5},
    {"type": ["string", "null"], "enum": ["a", None]},
    {"type": "integer", "enum": [1, 2.0]},
    {"type": "number", "const": 3},
    {"oneOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]},
    {"oneOf": [{"const": 1}, {"const": True}, {"enum": ["a", 2.5]}]},
    # a discriminated union, as pydantic writes one
    {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}], "$defs": _PETS},
    {"type": "number", "minimum": 1.25, "maximum": 1.2500004},  # 1.25 fits
    {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 0.000002},
    {"type": "string", "pattern": "^[ -~]+$"},  # xgrammar's Regex form: no raw controls
    {"type": "string", "pattern": "^\\d+\\.\\w\\s?$"},
    {"type": "string", "maxLength": 3},
    # limits a pattern or format implies, or a cap that cannot bind (pydantic's HttpUrl)
    {"type": "string", "format": "uri", "minLength": 1, "maxLength": 2083},
    {"type": "string", "pattern": "^[A-Z]{3}$", "maxLength": 3},
    {"type": "string", "format": "uuid", "maxLength": 36},
    # classes that exclude the characters JSON escapes, or name '"' inside a class
    {"type": "string", "pattern": '^[^"]+$'},
    {"type": "string", "pattern": "^[^\\\\/]+$"},
    {"type": "string", "pattern": '^[a-z"]+$'},
]


@pytest.mark.parametrize("name", list(UNENFORCEABLE))
def test_a_schema_the_backend_ignores_part_of_is_refused(backend, name):
    """Compiled as is, xgrammar would accept documents that break these schemas (the
    output would end "stop" and not validate): a 400 naming json_schema instead."""
    key = GrammarKey("json_schema", json.dumps(UNENFORCEABLE[name]))
    with pytest.raises(InvalidGrammarError, match="cannot be enforced") as info:
        backend.compile(key)
    assert info.value.param == "json_schema"


@pytest.mark.parametrize("schema", ENFORCEABLE)
def test_enforceable_schemas_still_compile(backend, schema):
    backend.compile(GrammarKey("json_schema", json.dumps(schema)))


# --- structural tags --------------------------------------------------------------------------

_TAGGED = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
STRUCTURAL_TAG_FORMS = {
    "sglang": {"structures": [{"begin": "<f>", "schema": _TAGGED, "end": "</f>"}],
               "triggers": ["<f>"]},
    "xgrammar": {"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": ["<f>"],
        "tags": [{"type": "tag", "begin": "<f>", "end": "</f>",
                  "content": {"type": "json_schema", "json_schema": _TAGGED}}]}},
}  # fmt: skip


@pytest.mark.parametrize("form", list(STRUCTURAL_TAG_FORMS))
@pytest.mark.parametrize("any_whitespace", [True, False])
def test_structural_tag_json_whitespace_as_json_schema(tokenizer, form, any_whitespace):
    """A tagged JSON part has json_schema's whitespace rule: runs of at most 16, none in
    compact mode (--constrained-json-disable-any-whitespace); it had no limit at all (the
    demo model wrote 2,422 whitespace characters)."""
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    backend = XGrammarBackend(tokenizer, MODEL_VOCAB, [eos], any_whitespace=any_whitespace)
    compiled = backend.compile(GrammarKey("structural_tag", json.dumps(STRUCTURAL_TAG_FORMS[form])))
    grammar = backend.new_grammar(compiled)
    assert all(grammar.accept_token(t) for t in tokenizer.encode("ok <f>{", add_special_tokens=False))
    (newline,) = tokenizer.encode("\n", add_special_tokens=False)
    accepted = 0
    while accepted <= MAX_JSON_WHITESPACE and grammar.accept_token(newline):
        accepted += 1
    assert accepted == (MAX_JSON_WHITESPACE if any_whitespace else 0)
    compact = backend.new_grammar(compiled)
    text = 'ok <f>{"a": 1}</f> and on'  # compact JSON is json.dumps' (", ", ": ")
    assert all(compact.accept_token(t) for t in tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize(
    "spec, message",
    [({"structures": [{"begin": "<f>", "end": "</f>"}], "triggers": ["<f>"]},
      "structures[0] needs a JSON schema object 'schema'"),
     ({"structures": [{"schema": {}}], "triggers": ["<f>"]},
      "structures[0] needs string 'begin' and 'end'"),
     ({"structures": [], "triggers": ["<f>"]}, "'structures' must be a non-empty list"),
     ({"structures": [{"begin": "<f>", "schema": {}, "end": "</f>"}]}, "'triggers' must be"),
     ({"type": "structural_tag"}, "format: Field required")],
)  # fmt: skip
def test_a_malformed_structural_tag_says_what_is_wrong(backend, spec, message):
    # the messages were Python exceptions' text ("invalid structural_tag: 'schema'")
    with pytest.raises(InvalidGrammarError) as info:
        backend.compile(GrammarKey("structural_tag", json.dumps(spec)))
    assert str(info.value).startswith("invalid structural_tag: ") and message in str(info.value)
    assert info.value.param == "structural_tag"


def test_xgrammars_structural_tag_form_is_checked_and_limited(tokenizer):
    """xgrammar's own form gets the json_schema refusals too (an unenforceable schema
    was served), and an XML-style part the whitespace limit (it wrote 1,923 spaces)."""
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    backend = XGrammarBackend(tokenizer, MODEL_VOCAB, [eos], any_whitespace=True)

    def tag(content: dict) -> GrammarKey:
        spec = {"type": "structural_tag", "format": {"type": "tag", "begin": "<f>", "end": "</f>",
                                                     "content": content}}  # fmt: skip
        return GrammarKey("structural_tag", json.dumps(spec))

    bad = {"type": "json_schema", "json_schema": {"type": "string", "pattern": '^a"b$'}}
    with pytest.raises(InvalidGrammarError, match="cannot be enforced: a 'pattern'"):
        backend.compile(tag(bad))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    xml = {"type": "json_schema", "json_schema": schema, "style": "qwen_xml"}
    grammar = backend.new_grammar(backend.compile(tag(xml)))
    assert all(grammar.accept_token(t) for t in tokenizer.encode("<f>", add_special_tokens=False))
    (newline,) = tokenizer.encode("\n", add_special_tokens=False)
    accepted = 0
    while accepted <= MAX_JSON_WHITESPACE and grammar.accept_token(newline):
        accepted += 1
    assert accepted <= MAX_JSON_WHITESPACE


def test_a_reasoning_gate_frees_every_token_until_the_think_block_ends(backend, tokenizer):
    end, brace = 5, tokenizer.convert_tokens_to_ids("{")
    key = GrammarKey("json_schema", ANY_JSON_OBJECT)
    gate = ReasoningGate(backend.new_grammar(backend.compile(key)), end_token_id=end)

    def allowed() -> torch.Tensor:
        bitmask = backend.allocate_bitmask(1)
        bitmask[0].fill_(0)  # nothing allowed unless the row is written
        gate.fill_bitmask(bitmask, 0)
        logits = torch.zeros(1, MODEL_VOCAB)
        backend.apply_bitmask(logits, bitmask, [0])
        return torch.isfinite(logits[0])

    reasoning = [t for t in range(10, 20)]  # any tokens, the grammar's or not
    for token in reasoning:
        assert allowed().all() and gate.accept_token(token) and not gate.is_terminated()
    assert gate.accept_token(end)  # the think block ends: the JSON starts here
    assert not allowed().all() and allowed()[brace] and gate.accept_token(brace)
    gate.rollback(2)  # speculative rejection across the end: reasoning again
    assert allowed().all()
    assert gate.accept_token(end) and gate.accept_token(brace)
    gate.rollback(1)
    assert allowed()[brace] and not allowed().all()  # past the end, before the brace
