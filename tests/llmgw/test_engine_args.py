"""Engine arguments: what may pass to llama-server, read in every spelling it reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmgw import engine_args
from llmgw.engine_args import EngineArgError, check

CONTEXT_SPELLINGS = [
    ["--ctx_size", "99"],
    ["--ctx-size=99"],
    ["--ctx_size=99"],
    ["-c", "99"],
    ["-c=99"],
    ["--ctx-size", "99"],
]


@pytest.mark.parametrize("args", CONTEXT_SPELLINGS)
def test_every_spelling_of_the_context_is_refused_naming_it(args: list[str]) -> None:
    with pytest.raises(EngineArgError) as e:
        check("llama.cpp", ["--temp", "0.5", *args])
    written = args[0].partition("=")[0]
    assert f"argument {written}" in str(e.value)
    assert "--ctx-size" in str(e.value) and "scheduler sets the context" in str(e.value)


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--host", "0.0.0.0"], "agent sets it"),
        (["--host=0.0.0.0"], "agent sets it"),
        (["--port", "1"], "port range"),
        (["--api_key", "k"], "key"),
        (["-m", "/etc/passwd"], "model's source"),
        (["-t", "64"], "agent sets it"),
        (["-cram", "-1"], "memory limit"),
        (["-dev", "none"], "cards"),
        (["-n", "-1"], "router"),
        (["--ignore-eos"], "router"),
        (["--lora", "/x"], "files"),
        (["--grammar-file", "/etc/shadow"], "files"),
        (["--log-file", "/tmp/x"], "files"),
        (["--slot-save-path", "/tmp"], "files"),
        (["--chat-template-file", "/x"], "files"),
        (["-hf", "org/repo"], "network"),
        (["--model-url", "http://x"], "network"),
        (["--gpt-oss-20b-default"], "network"),
        (["--rpc", "10.0.0.1:50052"], "network"),
        (["--props"], "settings"),
        (["--cors-origins", "*"], "not on the list"),
        (["--some-option-of-the-future"], "not on the list"),
    ],
)
def test_what_is_not_on_the_list_is_refused_with_why(args: list[str], why: str) -> None:
    with pytest.raises(EngineArgError, match="is not allowed") as e:
        check("llama.cpp", args)
    assert args[0].partition("=")[0] in str(e.value) and why in str(e.value)


def test_tuning_passes_in_canonical_form() -> None:
    args = [
        "-fa", "on", "--temp=0.7", "--top_k", "40", "-ngl", "auto", "-np", "4",
        "--cache-type-k", "q8_0", "-ctv", "q8_0", "--no-mmproj", "--jinja",
        "--grammar", "root ::= \"-c\"", "--reverse-prompt", "--host", "--metrics",
        "-ot", "exps=CPU", "--rope-scaling", "yarn", "-kvu",
    ]  # fmt: skip
    assert check("llama.cpp", args) == [
        "--flash-attn", "on", "--temp", "0.7", "--top-k", "40", "--n-gpu-layers", "auto",
        "--parallel", "4", "--cache-type-k", "q8_0", "--cache-type-v", "q8_0", "--no-mmproj",
        "--jinja", "--grammar", "root ::= \"-c\"", "--reverse-prompt", "--host", "--metrics",
        "--override-tensor", "exps=CPU", "--rope-scaling", "yarn", "--kv-unified",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--temp", "hot"], "'hot' is not a number"),
        (["--temp", "nan"], "out of range"),
        (["--temp", "-1"], "out of range (at least 0)"),
        (["-np", "1e3"], "not an integer"),
        (["--parallel", "100000"], "out of range (-1 to 1024)"),
        (["-ngl", "most"], "not an integer (or auto, all)"),
        (["-fa", "yes"], "'yes' is not one of on, off, auto"),
        (["-ctk", "q2_k"], "is not one of"),
        (["--top-p", "1.5"], "out of range (0 to 1)"),
        (["--temp"], "--temp needs a value"),
        (["--metrics=1"], "--metrics takes no value"),
        (["0.7"], "is not an option"),
        (["--temp", "0.5", "0.7"], "'0.7' is not an option"),
        (["--grammar", "x" * (65 * 1024)], "over 65536 characters"),
        (["--grammar", "a\0b"], "NUL"),
    ],
)
def test_values_are_checked_and_the_error_names_the_argument(args: list[str], why: str) -> None:
    with pytest.raises(EngineArgError) as e:
        check("llama.cpp", args)
    assert why in str(e.value)


def test_an_engine_without_a_list_takes_no_arguments() -> None:
    assert check("strata", []) == []  # Strata: the seed's other engine, not published
    with pytest.raises(EngineArgError, match="takes no arguments"):
        check("strata", ["--max-model-len", "9"])


# vLLM: the list read against the real server's --help=all (tests/llmgw_agentd/vllm/README.md)
VLLM_HELP = Path(__file__).parents[1] / "llmgw_agentd" / "vllm" / "help-0.32.0.txt"
_OPTION = re.compile(r"^  (-[^ ].*?)(?:  +|$)")


def vllm_help() -> dict[str, bool]:
    """Every spelling in vLLM's --help=all -> whether it takes a value."""
    found: dict[str, bool] = {}
    for line in VLLM_HELP.read_text().splitlines():
        m = _OPTION.match(line)
        if m is None:
            continue
        for spelling in re.split(r", (?=-)", m.group(1)):
            name, _, value = spelling.partition(" ")
            found[name] = bool(value)
    return found


def test_the_vllm_list_matches_the_real_servers_options() -> None:
    real = vllm_help()
    assert len(real) > 300 and real["--max-num-seqs"] and not real["--enforce-eager"]
    for names, value in engine_args.VLLM:
        for name in names:
            assert name in real, f"{name} is not an option of vLLM 0.32.0"
            assert real[name] == (value is not None), f"{name}: value or flag differs"
    for names in engine_args.VLLM_REFUSED:
        for name in names:
            assert name in real, f"{name} (refused) is not an option of vLLM 0.32.0"


def test_every_vllm_option_not_on_the_list_is_refused() -> None:
    allowed = {n for names, _ in engine_args.VLLM for n in names}
    for name, takes in vllm_help().items():
        if name in allowed:
            continue
        with pytest.raises(EngineArgError, match="is not allowed"):
            check("vllm", [name, "1"] if takes else [name])


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--trust-remote-code"], "loads code"),
        (["--trust_remote_code"], "loads code"),
        (["--download-dir", "/tmp"], "files"),
        (["--chat-template", "/etc/passwd"], "not a path"),
        (["--chat-template", "{{ x }}.jinja"], None),
        (["--chat-template", "./{{x}}"], "not a path"),
        (["--tokenizer", "/srv/other"], "model's own"),
        (["--served-model-name", "x"], "agent sets it"),
        (["--api-key", "k"], "never on the command line"),
        (["--ssl-keyfile", "/k"], "files"),
        (["--ssl-ciphers", "ALL"], "plain HTTP"),
        (["--allowed-local-media-path", "/"], "files"),
        (["--allowed-media-domains", "example.com"], "network"),
        (["--config", "/etc/x.yaml"], "files"),
        (["--compilation-config", "{}"], "JSON config"),
        (["--compilation-config.debug_dump_path", "/tmp"], "JSON config"),
        (["--speculative-config.model", "/m"], "JSON config"),
        (["--middleware", "os.system"], "loads code"),
        (["--worker-cls", "x.Y"], "loads code"),
        (["--max-model-len", "99"], "scheduler sets the context"),
        (["--max_model_len=99"], "scheduler sets the context"),
        (["-tp", "8"], "placement"),
        (["--kv-cache-dtype", "fp8"], "profile's cache type"),
        (["--load-format", "pt"], "safetensors only"),
        (["--prefix-caching-hash-algo", "xxhash"], "cache_salt"),
        (["--enable-log-requests"], "prompts"),
        (["--revision", "main"], "network"),
        (["-O3"], "not on the list"),
        (["--help"], "not on the list"),
    ],
)
def test_vllm_refuses_what_reads_files_loads_code_or_fetches(
    args: list[str], why: str | None
) -> None:
    if why is None:
        assert check("vllm", args) == args
        return
    with pytest.raises(EngineArgError) as e:
        check("vllm", args)
    assert args[0].partition("=")[0] in str(e.value) and why in str(e.value)


def test_vllm_tuning_passes_in_canonical_form() -> None:
    args = ["--max_num_seqs=8", "--enforce-eager", "-q", "fp8", "--dtype", "bfloat16",
            "--chat-template", "{% for m in messages %}{{ m.content }}{% endfor %}",
            "--no-enable-prefix-caching", "--tool-call-parser", "hermes"]  # fmt: skip
    assert check("vllm", args) == [
        "--max-num-seqs", "8", "--enforce-eager", "--quantization", "fp8", "--dtype",
        "bfloat16", "--chat-template", "{% for m in messages %}{{ m.content }}{% endfor %}",
        "--no-enable-prefix-caching", "--tool-call-parser", "hermes",
    ]  # fmt: skip
    with pytest.raises(EngineArgError, match="out of range"):
        check("vllm", ["--max-num-seqs", "0"])
