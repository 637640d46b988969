"""ModelRunner: owns the model, the KV memory and the attention backend of one runner.

Per-runner facts (draft or target, context length, load format, attention
backend) are constructor arguments; everything else comes from the published
config bags, read once in `RunnerSettings.from_bags`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from sglang.srt.arg_groups.exec_ import FP8_KV_DTYPES
from sglang.srt.arg_groups.parallel import check_tp_split
from sglang.srt.arg_groups.validation import MIN_POOL_TOKENS
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers import cpu_threads
from sglang.srt.layers.attention.base_attn_backend import create_attention_backend
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.sampler import SampleOutput, Sampler
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.cuda_graph_runner import (
    CudaGraphRunner,
    cuda_graph_skip_reason,
    default_cuda_graph_max_bs,
)
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_loader.loader import get_model
from sglang.srt.runtime_context import get_spec

logger = logging.getLogger(__name__)

_KV_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
_MAX_RUNNING_REQUESTS_CAP = 2048
_REQ_TABLE_BUDGET = 0.1  # share of the KV budget the req_to_token table may take

# The CPU default KV pool, used when neither --max-total-tokens nor --mem-fraction-static
# is given (see cpu_default_pool_size). A radix cache keeps finished requests' KV until the
# pool is full, so RSS grows toward the pool's size: on CPU it must be what a laptop accepts.
CPU_KV_BUDGET_BYTES = 4 * 2**30  # like vLLM's default CPU KV space (VLLM_CPU_KVCACHE_SPACE)
CPU_KV_CONTEXTS = 64  # full contexts the pool holds when --max-running-requests is unset
CPU_MEM_FRACTION = 0.3  # of available RAM: the old default, still an upper bound


@dataclass
class RunnerSettings:
    """The config a ModelRunner reads, gathered from the bags in one place."""

    device: str
    attention_backend: str | None
    load_format: str
    page_size: int = 1
    max_total_tokens: int | None = None
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    num_threads: int | None = None
    random_seed: int | None = None
    kv_cache_dtype: str = "auto"
    tp_size: int = 1
    ep_size: int = 1
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int | None = None
    is_embedding: bool = False

    @classmethod
    def from_bags(cls) -> RunnerSettings:
        from sglang.srt.runtime_context import (
            get_device,
            get_exec,
            get_memory,
            get_model,
            get_parallel,
            get_schedule,
        )

        exec_, memory, model = get_exec(), get_memory(), get_model()
        return cls(
            device=str(get_device().device),
            attention_backend=exec_.kernel.attention_backend,
            load_format=model.load_format,
            page_size=memory.page_size,
            max_total_tokens=memory.max_total_tokens,
            mem_fraction_static=memory.mem_fraction_static,
            max_running_requests=get_schedule().max_running_requests,
            num_threads=exec_.features.num_threads,
            random_seed=exec_.random_seed,
            kv_cache_dtype=exec_.kernel.kv_cache_dtype,
            tp_size=get_parallel().tp_size,
            ep_size=get_parallel().ep_size,
            disable_cuda_graph=exec_.graph.disable_cuda_graph,
            cuda_graph_max_bs=exec_.graph.cuda_graph_max_bs,
            is_embedding=model.is_embedding,
        )


class ModelRunner:
    def __init__(
        self,
        model_config: ModelConfig,
        *,
        tp_rank: int = 0,
        is_draft_worker: bool = False,
        context_length: int | None = None,
        load_format: str | None = None,
        attention_backend: str | None = None,
        settings: RunnerSettings | None = None,
    ) -> None:
        self.settings = settings or RunnerSettings.from_bags()
        self.model_config = model_config
        self.is_draft_worker = is_draft_worker
        self.tp_rank, self.tp_size = tp_rank, self.settings.tp_size
        self.device = torch.device(self.settings.device)
        self.context_len = context_length or model_config.context_len
        self.load_format = load_format or self._draft_load_format() or self.settings.load_format
        self.attention_backend_name = (
            attention_backend
            or self.resolve_draft_attention_backend()
            or self.settings.attention_backend
        )
        self.page_size = self.settings.page_size
        check_tp_split(model_config.raw, self.tp_size, self.settings.ep_size)  # hub ids too
        self._init_torch()
        self.model = self._load_model(model_config, self.load_format)
        self._init_memory_pool()
        self.attn_backend = create_attention_backend(self.attention_backend_name, self)
        self.sampler = Sampler()
        self.graph_runner = self._init_cuda_graphs()
        # {kv slot of a chunk's last token: (seq_len, logprobs of what follows)}: input
        # logprobs across a chunked-prefill boundary (see logits_processor._carried_head)
        self.logprob_carry: dict[int, tuple[int, torch.Tensor]] = {}

    def resolve_draft_attention_backend(self) -> str | None:
        """A draft runner's backend: --speculative-draft-attention-backend (resolved to the
        target's when unset); None for a target runner."""
        if not self.is_draft_worker:
            return None
        return get_spec().speculative_draft_attention_backend

    def _draft_load_format(self) -> str | None:
        """A draft runner's weight format: --speculative-draft-load-format; None for a
        target runner (or when unset: then the model's)."""
        if not self.is_draft_worker:
            return None
        return get_spec().speculative_draft_load_format

    def _init_torch(self) -> None:
        threads = self.settings.num_threads
        if not threads and self.device.type == "cpu":
            threads = default_cpu_threads()
        if self.device.type == "cpu":
            cpu_threads.configure(threads or torch.get_num_threads())
        elif threads:
            torch.set_num_threads(threads)
        if self.settings.random_seed is not None:
            torch.manual_seed(self.settings.random_seed)

    def _load_model(self, config: ModelConfig, load_format: str) -> torch.nn.Module:
        """The model of `config` (its checkpoint decides, e.g., the weights' storage dtype)."""
        if self.settings.ep_size > 1 and not self.model_config.num_experts:
            raise ValueError(
                f"ep_size={self.settings.ep_size} needs a mixture-of-experts model; "
                f"{self.model_config.architecture} has no experts (leave ep_size at 1)"
            )
        model = get_model(config, self.device, load_format, self.tp_rank, self.tp_size)
        logger.info("loaded %s (%s) on %s", config.model_path, config.architecture, self.device)
        return model

    # -- memory -------------------------------------------------------------------------

    @property
    def kv_cache_dtype(self) -> torch.dtype:
        name = self.settings.kv_cache_dtype
        if name in (None, "auto"):
            return self.model_config.dtype
        if name not in _KV_DTYPES:
            raise ValueError(
                f"kv_cache_dtype {name!r} is not supported by "
                f"{self.attention_backend_name}; use auto, {', '.join(_KV_DTYPES)}"
            )
        if name in FP8_KV_DTYPES:
            self._check_fp8_kv_runs_here(name)
        return _KV_DTYPES[name]

    def _check_fp8_kv_runs_here(self, name: str) -> None:
        """Only the CPU torch_native attention reads fp8 K/V. Launch validation refuses
        the rest where it can; --device auto (and a draft runner's own backend) are
        known only here."""
        if self.device.type != "cpu":
            raise ValueError(
                f"kv_cache_dtype={name!r} is not accepted on {self.device.type}: an fp8 KV "
                "cache runs on cpu only; use auto, bfloat16 or float16"
            )
        if self.attention_backend_name != "torch_native":
            raise ValueError(
                f"kv_cache_dtype={name!r} is not accepted with attention backend "
                f"{self.attention_backend_name!r}: only torch_native reads an fp8 KV cache"
            )

    def _init_memory_pool(self) -> None:
        cfg = self.model_config
        kv_heads = cfg.get_num_kv_heads(self.tp_size)
        per_token = MHATokenToKVPool.bytes_per_token(
            self.kv_cache_dtype, kv_heads, cfg.head_dim, cfg.num_hidden_layers
        )
        self.max_total_num_tokens, self.kv_pool_rule = self._pool_size(per_token)
        self.max_running_requests = self._max_running_requests(per_token)
        self.req_to_token_pool = ReqToTokenPool(
            self.max_running_requests, self.context_len + 4, self.device
        )
        self.token_to_kv_pool = MHATokenToKVPool(
            self.max_total_num_tokens,
            self.kv_cache_dtype,
            kv_heads,
            cfg.head_dim,
            cfg.num_hidden_layers,
            self.device,
            page_size=self.page_size,
        )
        self.token_to_kv_pool_allocator = TokenToKVPoolAllocator(
            self.max_total_num_tokens, self.page_size, self.device
        )
        logger.info(
            "KV pool: %d tokens (%.2f GiB, %d bytes/token), %d request slots; %s",
            self.max_total_num_tokens,
            self.max_total_num_tokens * per_token / 2**30,
            per_token,
            self.max_running_requests,
            self.kv_pool_rule,
        )

    def _pool_size(self, bytes_per_token: int) -> tuple[int, str]:
        """The pool's size in tokens and the rule that decided it (logged)."""
        if self.settings.max_total_tokens:
            size, rule = int(self.settings.max_total_tokens), "set by --max-total-tokens"
            self._check_pool_fits(size, bytes_per_token)
        elif self.device.type == "cpu" and self.settings.mem_fraction_static is None:
            size, rule = cpu_default_pool_size(
                bytes_per_token,
                available_memory_bytes(self.device),
                self.context_len,
                self.settings.max_running_requests or CPU_KV_CONTEXTS,
                self.page_size,
            )
        else:
            size = int(self._kv_budget_bytes() // bytes_per_token)
            rule = f"mem_fraction_static {self._mem_fraction()} of free {self.device.type} memory"
        size -= size % self.page_size
        if size < max(self.page_size, MIN_POOL_TOKENS):
            raise RuntimeError(
                f"not enough memory for the KV cache ({size} tokens); raise "
                "--mem-fraction-static or set --max-total-tokens"
            )
        return size, rule

    def _check_pool_fits(self, num_tokens: int, bytes_per_token: int) -> None:
        """RuntimeError naming --max-total-tokens when its pool exceeds the device's
        available memory (the allocator's bare ENOMEM said nothing of the flag)."""
        pool_bytes = num_tokens * bytes_per_token
        available = available_memory_bytes(self.device)
        if pool_bytes > available:
            raise RuntimeError(
                f"--max-total-tokens {num_tokens}: a KV pool of {pool_bytes / 2**30:.1f} GiB "
                f"({bytes_per_token} bytes/token) does not fit the {available / 2**30:.1f} "
                f"GiB of {self.device.type} memory available"
            )

    def _mem_fraction(self) -> float:
        fraction = self.settings.mem_fraction_static
        return 0.85 if fraction is None else fraction  # None here: not cpu (see _pool_size)

    def _kv_budget_bytes(self) -> float:
        """mem_fraction_static of the memory left after loading the weights."""
        return self._mem_fraction() * available_memory_bytes(self.device)

    def _max_running_requests(self, bytes_per_token: int) -> int:
        if self.settings.max_running_requests:
            return self._pool_bounded(int(self.settings.max_running_requests))
        row_bytes = (self.context_len + 4) * 4  # one int32 row of req_to_token
        table_cap = int(
            self.max_total_num_tokens * bytes_per_token * _REQ_TABLE_BUDGET // row_bytes
        )
        by_tokens = self.max_total_num_tokens // 2
        return max(1, min(_MAX_RUNNING_REQUESTS_CAP, by_tokens, max(table_cap, 32)))

    def _pool_bounded(self, max_running: int) -> int:
        """--max-running-requests, at most one request per page of the KV pool (each
        running request holds a page): the req_to_token table has a row per request,
        and 10^7 rows of a 4k context asked the allocator for 164 GB."""
        pool_pages = max(1, self.max_total_num_tokens // self.page_size)
        if max_running > pool_pages:
            logger.warning(
                "--max-running-requests %d: the KV pool holds %d pages, so at most %d "
                "requests can run at once; using %d",
                max_running, pool_pages, pool_pages, pool_pages,
            )  # fmt: skip
        return min(max_running, pool_pages)

    # -- CUDA graphs ----------------------------------------------------------------------

    def _init_cuda_graphs(self) -> CudaGraphRunner | None:
        """Capture the decode graphs (cuda only; see cuda_graph_runner), or None."""
        reason = cuda_graph_skip_reason(
            self.device.type,
            self.settings.disable_cuda_graph,
            self.attn_backend.supports_cuda_graph,
            self.attention_backend_name,
            self.tp_size,
            self.is_draft_worker,
            self.settings.is_embedding,
        )
        if reason is not None:
            if self.device.type == "cuda":
                logger.info("decode runs without CUDA graphs: %s", reason)
            return None
        max_bs = self.settings.cuda_graph_max_bs
        max_bs = min(
            max_bs or default_cuda_graph_max_bs(self.max_running_requests),
            self.max_running_requests,
        )
        return CudaGraphRunner(self, max_bs)

    def replays_cuda_graph(self, forward_batch: ForwardBatch) -> bool:
        """Whether `forward` replays a graph for this batch (its metadata is built there)."""
        return self.graph_runner is not None and self.graph_runner.can_run(forward_batch)

    # -- forward ------------------------------------------------------------------------

    def forward(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        """Run the model on a batch built by ForwardBatch.init_new: a decode batch that fits
        a captured CUDA graph replays it, anything else runs eagerly."""
        if self.replays_cuda_graph(forward_batch):
            return self.graph_runner.replay(forward_batch)
        if self.device.type == "cpu":
            cpu_threads.before_forward(forward_batch.input_ids.shape[0])
        return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)

    def sample(
        self, logits_output: LogitsProcessorOutput, forward_batch: ForwardBatch
    ) -> SampleOutput:
        return self.sampler(
            logits_output.next_token_logits,
            forward_batch.sampling_info,
            forward_batch.return_logprob,
            forward_batch.top_logprobs_nums,
            forward_batch.logprob_token_ids,
        )

    def update_weights_from_disk(self, model_path: str, load_format: str | None = None) -> None:
        """Replace the weights with those at `model_path`: the same architecture and
        the shapes the KV pool and vocabulary were sized for (_check_same_shape); the
        rest (MLP width, tied embeddings) is built from the new config.

        The new model is built fully before it replaces the old one, so a failure
        leaves the running weights untouched. Raises on any mismatch. The running
        dtype stays: a float32 checkpoint loaded into a bfloat16 server runs in bfloat16.
        """
        new_config = ModelConfig(
            model_path, context_length=self.context_len, dtype=self.model_config.dtype
        )
        _check_same_shape(self.model_config, new_config)
        _check_context_kept(self.context_len, new_config)
        check_tp_split(new_config.raw, self.tp_size, self.settings.ep_size)  # as at start-up
        model = self._load_model(new_config, load_format or "auto")
        if not self.settings.is_embedding and getattr(model, "has_lm_head", True) is False:
            raise ValueError(
                "the new checkpoint has no lm_head weights (an embedding model's "
                "checkpoint); this server generates"
            )
        self.model = model
        self.model_config = new_config
        if self.graph_runner is not None:  # its graphs read the old weights: capture again
            self.graph_runner = None
            self.graph_runner = self._init_cuda_graphs()


def _check_same_shape(old: ModelConfig, new: ModelConfig) -> None:
    keys = (
        "architecture",
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
    )
    diff = [k for k in keys if getattr(old, k) != getattr(new, k)]
    if diff:
        raise ValueError(f"new weights differ from the running model in: {', '.join(diff)}")


def _check_context_kept(running_context_len: int, new: ModelConfig) -> None:
    """The scheduler and the tokenizer keep the running context length: new weights that
    cap it lower (a sliding window a model type's attention here runs as a cap) would run
    past their window, silently wrong."""
    if new.context_len < running_context_len:
        raise ValueError(
            f"the new checkpoint's context length is {new.context_len} tokens (its config "
            f"caps it), below the {running_context_len} this server runs with; start a "
            "server on it instead"
        )


def cpu_default_pool_size(
    bytes_per_token: int,
    available_bytes: float,
    context_len: int,
    running_requests: int,
    page_size: int = 1,
) -> tuple[int, str]:
    """Tokens of the CPU KV pool when the operator sized neither it nor its memory fraction.

        min(CPU_KV_BUDGET_BYTES, running_requests x context_len tokens), at least one full
        context (rounded up to a page), and never more than CPU_MEM_FRACTION of available RAM

    `running_requests` is --max-running-requests when set, else CPU_KV_CONTEXTS. Returns the
    size and a sentence naming the bound that decided it and how to change it.
    """
    budget = int(CPU_KV_BUDGET_BYTES // bytes_per_token)
    contexts = context_len * running_requests
    one_context = -(-context_len // page_size) * page_size
    by_fraction = int(CPU_MEM_FRACTION * available_bytes // bytes_per_token)
    if contexts <= budget:
        size, bound = contexts, f"{running_requests} full contexts of {context_len} tokens"
    else:
        size, bound = budget, f"the {CPU_KV_BUDGET_BYTES / 2**30:g} GiB CPU KV budget"
    if size < one_context:
        size, bound = one_context, f"one full context of {context_len} tokens"
    if by_fraction < size:
        size, bound = by_fraction, f"{CPU_MEM_FRACTION:g} of available RAM"
    rule = (
        f"CPU default, bound by {bound} (min({CPU_KV_BUDGET_BYTES / 2**30:g} GiB, "
        f"{running_requests} contexts), at least one context, at most {CPU_MEM_FRACTION:g} "
        "of available RAM); change it with --max-total-tokens or --mem-fraction-static"
    )
    return size, rule


def default_cpu_threads() -> int:
    """Torch threads for a CPU runner when --num-threads is unset: the physical cores this
    process may use (on 2 idle cores, 2 threads: 1.45x the output tok/s of 1 end to end).

    An OpenMP team waits at every op for its slowest thread, so a thread sharing a core
    with another CPU-bound process stalls them all (batch-64 decode step: 727 ms at 2
    threads vs 26 ms at 1 with the other core busy): set --num-threads on a shared machine.
    """
    import os

    import psutil

    usable = len(os.sched_getaffinity(0))
    physical = psutil.cpu_count(logical=False) or usable
    logical = psutil.cpu_count(logical=True) or usable
    return max(1, usable * physical // logical)  # SMT siblings share a core's FMA units


def available_memory_bytes(device: torch.device) -> float:
    """Free memory on `device`: free GPU memory, or available RAM on CPU."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return float(free)
    import psutil

    return float(psutil.virtual_memory().available)
