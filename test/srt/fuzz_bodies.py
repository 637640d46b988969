"""Hypothesis strategies for request bodies: half are valid (cheap to serve: a few
tokens), half are mutated: wrong types, out-of-range numbers, unicode, huge lists,
missing and unknown fields.
"""

from __future__ import annotations

from hypothesis import strategies as st

SMALL_INT = st.integers(min_value=0, max_value=6)
BAD_NUMBER = st.one_of(
    st.integers(max_value=-1),
    st.integers(min_value=10**6),
    st.floats(allow_nan=True, allow_infinity=True),
)
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
TEXT = st.text(min_size=1, max_size=40)  # any unicode
HUGE_LIST = st.lists(st.text(max_size=2), min_size=100, max_size=400)
TOKEN_IDS = st.lists(st.integers(1, 300), min_size=1, max_size=12)

# Good values per field (the range a client may send).
SAMPLING = {
    "max_new_tokens": SMALL_INT,
    "min_new_tokens": st.just(0),
    "temperature": st.floats(min_value=0, max_value=2),
    "top_p": st.floats(min_value=0.01, max_value=1),
    "top_k": st.integers(min_value=-1, max_value=50),
    "min_p": st.floats(min_value=0, max_value=1),
    "frequency_penalty": st.floats(min_value=-2, max_value=2),
    "repetition_penalty": st.floats(min_value=0.5, max_value=2),
    "stop": st.one_of(TEXT, st.lists(TEXT, max_size=3)),
    "stop_token_ids": st.lists(st.integers(0, 200), max_size=3),
    "n": st.integers(min_value=1, max_value=3),
    "seed": st.integers(min_value=0, max_value=2**32),
    "ignore_eos": st.booleans(),
    "skip_special_tokens": st.booleans(),
    "logit_bias": st.dictionaries(st.sampled_from(["1", "5"]), st.floats(-100, 100), max_size=2),
}
OPENAI_SAMPLING = {
    "max_tokens": SMALL_INT,
    "temperature": SAMPLING["temperature"],
    "top_p": SAMPLING["top_p"],
    "n": SAMPLING["n"],
    "stop": SAMPLING["stop"],
    "seed": SAMPLING["seed"],
    "stream": st.booleans(),
    "logit_bias": SAMPLING["logit_bias"],
    "presence_penalty": st.floats(min_value=-2, max_value=2),
    "top_k": SAMPLING["top_k"],
}
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant"]), "content": TEXT}
)


def _mutated(good: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(good, BAD_NUMBER, JUNK, HUGE_LIST)


def _bodies(
    required: dict, optional: dict, budget: tuple[str, st.SearchStrategy] | None = None
) -> st.SearchStrategy[dict]:
    """Valid bodies, or mutated ones. `budget` = (field, its good values): that field
    is always present, good or invalid (never missing), so that no body asks for a
    long generation by leaving its token budget at the default."""
    kept: dict = {}
    if budget is not None:
        key, good = budget
        required = {**required, key: good}
        optional = {k: v for k, v in optional.items() if k != key}
        kept = {key: st.one_of(good, BAD_NUMBER, st.booleans(), st.text(max_size=4))}
    valid = st.fixed_dictionaries(required, optional=optional)
    mutated = {k: _mutated(v) for k, v in {**required, **optional}.items() if k not in kept}
    fuzzed = st.builds(
        lambda body, extra: {**body, **extra},
        st.fixed_dictionaries(kept, optional=mutated),
        st.dictionaries(st.text(min_size=1, max_size=6), JUNK, max_size=1),
    )
    return st.one_of(valid, fuzzed)


def generate_bodies() -> st.SearchStrategy[dict]:
    sampling = _bodies({}, SAMPLING, budget=("max_new_tokens", SMALL_INT))
    optional = {
        "stream": st.booleans(),
        "return_logprob": st.booleans(),
        "top_logprobs_num": SMALL_INT,
        "logprob_start_len": st.integers(-1, 4),
        "rid": st.uuids().map(str),
    }
    prompt = st.one_of(
        st.fixed_dictionaries({"text": st.one_of(TEXT, st.lists(TEXT, min_size=1, max_size=3))}),
        st.fixed_dictionaries(
            {"input_ids": st.one_of(TOKEN_IDS, st.lists(TOKEN_IDS, min_size=1, max_size=2))}
        ),
    )
    rest = _bodies({}, optional, budget=("sampling_params", sampling))
    return st.builds(lambda p, r: {**p, **r}, prompt, rest)


def completion_bodies() -> st.SearchStrategy[dict]:
    required = {
        "model": st.just("default"),
        "prompt": st.one_of(TEXT, st.lists(TEXT, min_size=1, max_size=2), TOKEN_IDS),
    }
    optional = {**OPENAI_SAMPLING, "echo": st.booleans(), "logprobs": SMALL_INT}
    return _bodies(required, optional, budget=("max_tokens", SMALL_INT))


def chat_bodies() -> st.SearchStrategy[dict]:
    required = {"model": st.just("default"), "messages": st.lists(MESSAGE, min_size=1, max_size=3)}
    optional = {**OPENAI_SAMPLING, "logprobs": st.booleans(), "top_logprobs": SMALL_INT}
    return _bodies(required, optional, budget=("max_tokens", SMALL_INT))
