"""A model's profiles: the ways it runs (on cards, on CPUs), with engine, args and replicas."""

from __future__ import annotations

# Defined with the API's answers (GET /models shows them), for llmgwd and the llmgw command.
from llmgw.api_types import Engine as Engine
from llmgw.api_types import Kind as Kind
from llmgw.api_types import Profile as Profile

DEFAULT = "default"  # the name of the one profile of a model without profiles


def problems(profiles: list[Profile]) -> list[str]:
    """What is wrong with a model's profiles, one sentence each ([] when nothing is)."""
    out: list[str] = []
    seen: set[str] = set()
    for p in profiles:
        if p.name in seen:
            out.append(f"two profiles are named {p.name!r}")
        seen.add(p.name)
        if p.replicas < 0:
            out.append(f"profile {p.name!r}: replicas cannot be negative")
        if p.kind == "gpu" and p.gpus < 1:
            out.append(f"profile {p.name!r}: a GPU replica needs at least one card")
        if p.kind == "cpu" and p.cores < 0:
            out.append(f"profile {p.name!r}: cores cannot be negative")
        if p.context and p.min_context > p.context:
            out.append(f"profile {p.name!r}: min_context is above context")
        if p.min_compute_capability and not _is_capability(p.min_compute_capability):
            out.append(f"profile {p.name!r}: compute capability is written like 8.0")
        if p.engine == "freetoken" and (p.kind != "gpu" or p.gpus != 1):
            out.append(f"profile {p.name!r}: FreeToken runs a replica on one card (gpus 1)")
    return out


def _is_capability(s: str) -> bool:
    major, dot, minor = s.partition(".")
    return bool(dot) and major.isdigit() and minor.isdigit()


def capability(s: str) -> tuple[int, int]:
    """ "8.6" as (8, 6); "" as (0, 0)."""
    major, _, minor = s.partition(".")
    return (int(major), int(minor or 0)) if major.isdigit() else (0, 0)


def replicas(profiles: list[Profile]) -> int:
    """The model's replicas: the sum of its profiles'."""
    return sum(max(p.replicas, 0) for p in profiles)


def by_priority(profiles: list[Profile]) -> list[Profile]:
    """Profiles in the order the router fills them: highest priority first, then by name."""
    return sorted(profiles, key=lambda p: (-p.priority, p.name))


def single(engine: Engine, args: list[str], replicas: int, context: int = 0) -> list[Profile]:
    """The one profile a model without profiles has: the single-node slice's llama.cpp on
    CPUs, with the model's own engine, arguments, replicas and context, one core reserved
    for each replica (so a node takes as many as it has cores, as before profiles).
    FreeToken runs on cards only: its one profile is a card a replica."""
    on_cards = engine == "freetoken"
    return [
        Profile(
            name=DEFAULT,
            kind="gpu" if on_cards else "cpu",
            engine=engine,
            args=args,
            replicas=replicas,
            context=context,
            cores=0 if on_cards else 1,
        )
    ]
