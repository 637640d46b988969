"""Messages between the runtime's processes: one dataclass per message.

Grouped by the process that receives them. Every message is plain picklable
data (lists, ints, strings, small dataclasses); tensors never cross ZMQ.

    TokenizerManager -> Scheduler : TokenizedGenerateReqInput,
                                    TokenizedEmbeddingReqInput, AbortReq,
                                    FlushCacheReqInput, GetInternalStateReq,
                                    UpdateWeightFromDiskReqInput
    Scheduler -> Detokenizer       : BatchTokenIDOutput
    Detokenizer -> TokenizerManager: BatchStrOutput
    Scheduler -> DP controller     : LoadReport (dp_size > 1: the controller takes the
                                    TokenizerManager's messages, a new request to one
                                    DP rank, every other message to all of them)
    Scheduler -> TokenizerManager  : FlushCacheReqOutput, GetInternalStateReqOutput,
                                    UpdateWeightFromDiskReqOutput (one per DP rank)
    any child -> launcher (pipe)   : ChildReady, ChildFailed
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, fields
from typing import Any

# ----------------------------------------------------------------------------
# API-level input (built by the Engine or the HTTP layer)
# ----------------------------------------------------------------------------


# The rids of the server's own health probes (/health_generate), as SGLang names them
HEALTH_PROBE_RID_PREFIX = "HEALTH_CHECK_"


def is_health_probe(rid: str) -> bool:
    return rid.startswith(HEALTH_PROBE_RID_PREFIX)


# The most logprob entries (a position's logprob, or one of its top-k or token_ids_logprob
# alternatives) one request may ask for, over all its choices: the answer is built and
# serialized in the HTTP process (a few hundred bytes an entry there, and seconds of its
# event loop at millions). A request within every field's own limit (4,000 input
# positions x 1,124 alternatives x n=8) took the launcher past 5.8 GB and /health 17 s.
MAX_LOGPROB_ENTRIES_PER_REQUEST = 1 << 21


@dataclass
class LogprobBudget:
    """The logprob entries a request's choices may still ask for; shared by them."""

    left: int = MAX_LOGPROB_ENTRIES_PER_REQUEST


@dataclass
class GenerateReqInput:
    """One generation request: a single prompt (text or ids), n = 1."""

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: dict[str, Any] | None = None
    rid: str | None = None
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    # token ids whose logprobs every position reports (SGLang's token_ids_logprob)
    token_ids_logprob: list[int] | None = None
    # First prompt position whose input logprob is returned; -1 = none.
    logprob_start_len: int = -1
    return_text_in_logprobs: bool = False
    # Set by a fan-out (n > 1, a prompt list): the whole request's rid, which
    # abort_request(parent) reaches and a new request may not take while this runs.
    parent_rid: str | None = None
    # SGLang's: the request's constraint applies after the reasoning (--reasoning-parser)
    require_reasoning: bool = False
    # A route's own default for max_new_tokens when the caller set none (the legacy
    # completions' 16); cut to the room the context leaves, as the server's 128 is
    default_max_new_tokens: int | None = None
    # shared by the choices of one request (a fan-out sets it); None: this choice's own
    logprob_budget: LogprobBudget | None = None

    def __post_init__(self) -> None:
        if self.rid is None:
            self.rid = uuid.uuid4().hex
        if self.sampling_params is None:
            self.sampling_params = {}


def share_logprob_budget(objs: list[GenerateReqInput]) -> None:
    """One logprob budget (MAX_LOGPROB_ENTRIES_PER_REQUEST) for a request's choices."""
    budget = LogprobBudget()
    for obj in objs:
        obj.logprob_budget = budget


@dataclass
class EmbeddingReqInput:
    """One embedding request (`--is-embedding` servers): a single prompt, text or ids."""

    text: str | None = None
    input_ids: list[int] | None = None
    rid: str | None = None
    # OpenAI's `dimensions`: cut the vector to this many values and renormalise
    # (models that declare Matryoshka training only; see tokenizer_embedding.py)
    dimensions: int | None = None
    parent_rid: str | None = None  # as GenerateReqInput's

    def __post_init__(self) -> None:
        if self.rid is None:
            self.rid = uuid.uuid4().hex


# ----------------------------------------------------------------------------
# Received by the scheduler
# ----------------------------------------------------------------------------


@dataclass
class TokenizedGenerateReqInput:
    rid: str
    input_text: str | None
    input_ids: list[int]
    # sglang.srt.sampling.sampling_params.SamplingParams, normalized (stop_strs set).
    sampling_params: Any
    return_logprob: bool = False
    top_logprobs_num: int = 0
    token_ids_logprob: list[int] | None = None
    logprob_start_len: int = -1
    stream: bool = False
    parent_rid: str | None = None  # as GenerateReqInput's
    # require_reasoning: the constraint starts after this token (the think block's end)
    reasoning_end_token_id: int | None = None


@dataclass
class TokenizedEmbeddingReqInput:
    """An embedding request: one prefill, then it finishes with its pooled vector."""

    rid: str
    input_text: str | None
    input_ids: list[int]


@dataclass
class AbortReq:
    rid: str
    message: str = "Aborted by request."


@dataclass
class FlushCacheReqInput:
    pass


@dataclass
class GetInternalStateReq:
    pass


@dataclass
class UpdateWeightFromDiskReqInput:
    model_path: str
    load_format: str | None = None


# ----------------------------------------------------------------------------
# Received by the data-parallel controller from each DP rank's first TP rank
# ----------------------------------------------------------------------------


@dataclass
class LoadReport:
    """A DP rank's load after a scheduler step (sent when a figure changed)."""

    dp_rank: int
    num_running_reqs: int
    num_queued_reqs: int
    num_free_kv_tokens: int
    max_total_num_tokens: int
    # new requests this rank has taken off its input queue, ever
    num_received_reqs: int


# ----------------------------------------------------------------------------
# Received by the tokenizer manager from the scheduler (control replies)
# ----------------------------------------------------------------------------

# Each control reply names the DP rank that sent it: with dp_size > 1 every rank
# answers, and the tokenizer manager collects one reply per rank.


@dataclass
class FlushCacheReqOutput:
    success: bool
    message: str = ""
    dp_rank: int = 0


@dataclass
class GetInternalStateReqOutput:
    internal_state: dict[str, Any]
    dp_rank: int = 0


@dataclass
class UpdateWeightFromDiskReqOutput:
    success: bool
    message: str
    model_path: str = ""
    load_format: str | None = None
    dp_rank: int = 0


# ----------------------------------------------------------------------------
# Received by the detokenizer
# ----------------------------------------------------------------------------


@dataclass
class TokenizerHandoff:
    """The scheduler's tokenizer (as AutoTokenizer loaded it, with torch), sent once
    before any output so the detokenizer rebuilds it by unpickling, without torch or
    AutoTokenizer's class choice (which imports torch). None with skip_tokenizer_init.
    Each DP rank's scheduler sends one; the detokenizer keeps the first."""

    tokenizer: Any


@dataclass
class DecodeParams:
    """Per-request text options, sent once with a request's first output."""

    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    stop_strs: tuple[str, ...] = ()
    stream: bool = False


# The logprob lists BatchTokenIDOutput and BatchStrOutput carry per request: the output
# ones hold the entries new since the request's last message, the input ones the whole
# prompt's, once. The scheduler's LogprobState, the TokenizerManager's ReqState and
# meta_info keep them under the same names.
OUTPUT_LOGPROB_FIELDS = (
    "output_token_logprobs",
    "output_top_logprobs",
    "output_token_ids_logprobs",
)
INPUT_LOGPROB_FIELDS = ("input_token_logprobs", "input_top_logprobs", "input_token_ids_logprobs")
LOGPROB_FIELDS = OUTPUT_LOGPROB_FIELDS + INPUT_LOGPROB_FIELDS


@dataclass
class BatchTokenIDOutput:
    """New tokens for a batch of requests since each one's previous output.

    Parallel lists, one entry per request. `new_output_ids[i]` are the tokens
    generated since the last message for `rids[i]`; a request appears at most
    once per message. `decode_params[i]` is set on a request's first message
    only (None afterwards). Logprob lists are None unless some request asked.
    """

    rids: list[str]
    new_output_ids: list[list[int]]
    # None while running; else {"type": "stop"|"length"|"abort", "matched": ..., "message"?}
    finished_reasons: list[dict[str, Any] | None]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]
    # Seconds from arrival at the scheduler to the first prefill; None before it.
    queue_times: list[float | None]
    decode_params: list[DecodeParams | None]
    # speculative decoding on: decode rounds per request (meta_info spec_verify_ct)
    spec_verify_ct: list[int] | None = None
    output_token_logprobs: list[list[tuple[float, int]]] | None = None
    output_top_logprobs: list[list[list[tuple[float, int]]]] | None = None
    input_token_logprobs: list[list[tuple[float | None, int]]] | None = None
    input_top_logprobs: list[list[list[tuple[float, int]] | None]] | None = None
    # the logprobs of each request's asked token ids (token_ids_logprob), per position
    output_token_ids_logprobs: list[list[list[tuple[float, int]]]] | None = None
    input_token_ids_logprobs: list[list[list[tuple[float, int]] | None]] | None = None
    # embedding servers: each finished request's pooled vector (float32 values, L2-normalised)
    embeddings: list[list[float] | None] | None = None


# ----------------------------------------------------------------------------
# Received by the tokenizer manager from the detokenizer
# ----------------------------------------------------------------------------


@dataclass
class BatchStrOutput:
    """Incremental text for a batch of requests (parallel lists, as above).

    `new_texts[i]` is the text decoded since the previous message (stop strings
    trimmed, incomplete UTF-8 held back); `new_output_ids[i]` the new tokens.
    """

    rids: list[str]
    new_texts: list[str]
    new_output_ids: list[list[int]]
    finished_reasons: list[dict[str, Any] | None]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]
    queue_times: list[float | None]
    spec_verify_ct: list[int] | None = None
    output_token_logprobs: list[list[tuple[float, int]]] | None = None
    output_top_logprobs: list[list[list[tuple[float, int]]]] | None = None
    input_token_logprobs: list[list[tuple[float | None, int]]] | None = None
    input_top_logprobs: list[list[list[tuple[float, int]] | None]] | None = None
    # the logprobs of each request's asked token ids (token_ids_logprob), per position
    output_token_ids_logprobs: list[list[list[tuple[float, int]]]] | None = None
    input_token_ids_logprobs: list[list[list[tuple[float, int]] | None]] | None = None
    embeddings: list[list[float] | None] | None = None

    @classmethod
    def from_token_output(cls, msg: BatchTokenIDOutput, new_texts: list[str]) -> BatchStrOutput:
        """The detokenizer's reply: `msg`'s per-request fields passed through, plus the text.

        Every field but `new_texts` has a namesake on BatchTokenIDOutput, so a field
        added to both messages travels without touching the detokenizer.
        """
        shared = {name: getattr(msg, name) for name in _STR_OUTPUT_SHARED_FIELDS}
        return cls(new_texts=new_texts, **shared)


# BatchStrOutput's fields copied from BatchTokenIDOutput (read once, not per message)
_STR_OUTPUT_SHARED_FIELDS = tuple(f.name for f in fields(BatchStrOutput) if f.name != "new_texts")


# ----------------------------------------------------------------------------
# Child process -> launcher, over the ready pipe
# ----------------------------------------------------------------------------


@dataclass
class ChildReady:
    role: str
    pid: int
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class ChildFailed:
    role: str
    pid: int
    traceback_text: str
