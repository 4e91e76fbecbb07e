"""FreeToken's `ft serve` (PyPI's freetoken): a replica's argv on its one card, its arguments
and settings checked, and where it runs from.

FreeToken serves a mixture of experts several times a card's size from one card, its experts
in RAM; it compiles its kernels for the card when loaded, with the CUDA 13 toolkit. What was
read of freetoken 0.2.1 to write this (its CLI, its arguments, its /health) is named in
tests/llmgw_agentd/freetoken/README.md."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from llmgw import engine_args
from llmgw.config import AgentConfig
from llmgw.wire import ReplicaSpec
from llmgw_agentd.engines import EngineError

# `ft serve` as the `ft` script runs it (freetoken.cli:main), after the key is read from
# systemd's credential file into FREETOKEN_API_KEY (FreeToken's --api-key default): never on
# the command line, seen in /proc by every user. No `$` in it: systemd expands variables.
LAUNCH = (
    "import os, sys; key = sys.argv.pop(1)\n"
    "if key: os.environ['FREETOKEN_API_KEY'] = open(key).read().strip()\n"
    "from freetoken.cli import main\n"
    "sys.exit(main(sys.argv[1:]))"
)
CUDA_HOME = "/usr/local/cuda"  # the toolkit it compiles kernels with (inventory's too)
# The unit's dynamic user has no home: caches under its private /tmp; nothing is fetched (the
# set is whole in the cache).
ENVIRONMENT = (
    "HOME=/tmp",
    "XDG_CACHE_HOME=/tmp/cache",
    "HF_HOME=/tmp/hf",
    "HF_HUB_OFFLINE=1",
    "TRANSFORMERS_OFFLINE=1",
    "TRITON_CACHE_DIR=/tmp/triton",
    "FREETOKEN_KERNEL_CACHE_DIR=/tmp/freetoken-kernels",
    f"CUDA_HOME={CUDA_HOME}",
    f"PATH={CUDA_HOME}/bin:/usr/local/bin:/usr/bin:/bin",
    "DO_NOT_TRACK=1",
)


def validate_args(args: Sequence[str]) -> list[str]:
    """The replica's own arguments (and FREETOKEN_ settings) in canonical form, or
    EngineError naming the first that may not pass (llmgw.engine_args, as llmgwd checks)."""
    try:
        return engine_args.check("freetoken", args)
    except engine_args.EngineArgError as e:
        raise EngineError(str(e)) from None


def check_source(spec: ReplicaSpec) -> None:
    """Refuse what FreeToken cannot serve here: a source other than an hf: set of safetensors
    weights with its config.json, or more than one card (it has no tensor parallelism)."""
    paths = {f.path for f in spec.files}
    if not any(p.endswith(".safetensors") for p in paths) or "config.json" not in paths:
        raise EngineError(
            f"source {spec.source!r}: FreeToken serves a safetensors set with its config.json"
            " from the mirror (hf:ORG/REPO)"
        )
    if len(spec.devices) > 1:
        raise EngineError("FreeToken runs a replica on one card (a profile's gpus: 1)")


def env_dir(config: AgentConfig) -> Path:
    """The environment FreeToken runs from: engines.freetoken.env, else the one the agent
    installs (engines.dir/freetoken-VERSION)."""
    site = config.engines.freetoken
    if site.env:
        return Path(site.env)
    return Path(config.engines.dir) / f"freetoken-{site.version}"


def command(
    spec: ReplicaSpec, *, python: str, host: str, port: int, key_file: str | None
) -> list[str]:
    """`ft serve`'s argv for spec: its environment (the agent's, then the model's FREETOKEN_
    settings), the launcher, the model, address, card and served name, the context
    (--max-seq-len-override) and slots, the spec's checked options, and where accounts'
    prompts are kept apart (client.cache_isolation) FreeToken's naive cache: it has no
    per-request salt, and its radix cache would share one account's prefix with another's.
    spec.source is the set's directory in the cache (file:DIR)."""
    if not spec.source.startswith("file:/"):
        raise EngineError(f"source {spec.source!r}: FreeToken needs the set's directory")
    if not spec.devices:
        raise EngineError("FreeToken runs on a card: the replica was given none")
    if spec.cache_type not in ("", "f16", "bf16"):
        raise EngineError(f"cache type {spec.cache_type!r}: FreeToken keeps its own (f16/bf16)")
    settings, options = engine_args.environment("freetoken", validate_args(spec.args))
    argv = ["/usr/bin/env", *ENVIRONMENT, *settings, python, "-c", LAUNCH, key_file or ""]
    argv += ["serve", "--model", spec.source.removeprefix("file:")]
    argv += ["--host", host, "--port", str(port), "--gpu", spec.devices[0]]
    argv += ["--served-model-name", spec.model]
    if spec.context:
        argv += ["--max-seq-len-override", str(spec.context)]
    if spec.slots:  # the placement's: that many contexts' KV cache is what it was given
        argv += ["--max-running-requests", str(spec.slots)]
    argv += options
    if spec.isolated_cache:  # no salt: no request reuses another's prompt (last flag wins)
        argv += ["--cache-type", "naive"]
    return argv
