"""Placement on recorded NVML inventories: fit, spread, MIG instances, failures, cordon, reasons."""

from __future__ import annotations

import itertools
from pathlib import Path

import msgspec

from llmgw.wire import Inventory
from llmgw_agentd.gpus import GpuReader
from llmgwd.placement.estimate import GIB, ModelShape, gib, memory_bytes
from llmgwd.placement.gguf_meta import shape_of
from llmgwd.placement.profiles import Profile
from llmgwd.placement.scheduler import Demand, Node, Placement, explain, schedule
from tests.llmgw_agentd.fake_nvml import FakeNvml

GGUF = Path(__file__).parent / "gguf"
SMOL = shape_of(GGUF / "smollm2-135m-instruct-q4_1.copied.gguf")
LLAMA = shape_of(GGUF / "llama-3.1-8b-instruct-q4_k_m.synth.gguf")
QWEN = shape_of(GGUF / "qwen2.5-72b-instruct-q4_k_m.synth.gguf")
MIB = 1 << 20


def node(name: str, recording: str | None, cores: int = 64, ram: int = 512 * GIB) -> Node:
    """A node whose GPUs are what NVML answered on a recorded machine (None: no GPU)."""
    gpus = GpuReader(FakeNvml.load(recording)).read().gpus if recording else []
    inv = Inventory(
        cores=cores,
        memory_bytes=ram,
        memory_free_bytes=ram - 8 * GIB,
        gpus=gpus,
        memory_bandwidth_bytes_s=200_000_000_000,
        memory_bandwidth_one_core_bytes_s=20_000_000_000,
    )
    return Node(name=name, inventory=inv)


DGX = node("dgx", "dgx-h100-8x80gb")
MIG = node("mig", "a100-80gb-mig")
WS = node("ws", "rtx4090-8x24gb", cores=16, ram=128 * GIB)
CPU = node("cpu", None, cores=32, ram=256 * GIB)
ALL = [DGX, MIG, WS, CPU]
_ids = itertools.count()


def ids(model: str) -> str:
    return f"{model}-{next(_ids)}"


def gpu(model: str, shape: ModelShape, replicas: int, context: int = 0, **kw: object) -> Demand:
    profile = msgspec.structs.replace(
        Profile(name="gpu", kind="gpu", replicas=replicas, context=context), **kw
    )
    return Demand(model=model, profile=profile, shape=shape)


def uuids(n: Node) -> dict[str, tuple[str, int]]:
    """Every place of a node by UUID: (what it is, its free memory)."""
    out: dict[str, tuple[str, int]] = {}
    for g in n.inventory.gpus:
        out[g.uuid] = ("mig-card" if g.mig else "card", g.memory_free_bytes)
        for i in g.instances:
            out[i.uuid] = (i.profile, i.memory_free_bytes)
    return out


def test_a_replica_goes_to_a_card_it_fits_on_with_its_whole_context() -> None:
    plan = schedule([gpu("llama", LLAMA, 1)], [DGX], [], new_id=ids)
    (p,) = plan.add
    kind, free = uuids(DGX)[p.devices[0]]
    assert kind == "card" and p.memory_bytes <= free
    assert p.context == LLAMA.context_length == 131072
    # 80 GiB hold four requests of the whole context at once: 4 x 16 GiB of KV cache
    assert p.slots == 4 and p.memory_bytes == memory_bytes(LLAMA, 4 * 131072)
    # Every card of the captured node was idle, 81106 MiB free: any of them holds it.
    assert free == 81106 * MIB


def test_slots_are_the_whole_contexts_the_room_left_on_its_card_holds() -> None:
    # An RTX 4090 (24 GiB) holds Llama 3.1 8B (4.6 GiB) and 18 GiB of KV cache: four
    # requests of 32768 tokens (4 GiB each), two of 65536 (8 GiB), one of 131072 (16 GiB).
    for ctx, slots in ((32768, 4), (65536, 2), (131072, 1)):
        (p,) = schedule([gpu("llama", LLAMA, 1, context=ctx)], [WS], [], new_id=ids).add
        assert (p.context, p.slots) == (ctx, slots)
        assert p.memory_bytes == memory_bytes(LLAMA, ctx * slots)
        assert p.memory_bytes <= uuids(WS)[p.devices[0]][1]
        verdicts = explain(gpu("llama", LLAMA, 1, context=ctx), [WS], [])
        assert {(v.fits, v.context, v.slots) for v in verdicts} == {(True, ctx, slots)}
    # A card with a replica already has less room left: the next one there gets fewer.
    two = [msgspec.structs.replace(WS.inventory.gpus[0], memory_free_bytes=14 * GIB)]
    small = msgspec.structs.replace(WS, inventory=msgspec.structs.replace(WS.inventory, gpus=two))
    (p,) = schedule([gpu("llama", LLAMA, 1, context=32768)], [small], [], new_id=ids).add
    assert p.slots == 2 and p.memory_bytes == memory_bytes(LLAMA, 2 * 32768)


def test_slots_named_in_the_args_are_the_slots_and_the_context_leaves_room_for_them() -> None:
    d = gpu("llama", LLAMA, 1, context=32768, args=["--parallel", "3"])
    (p,) = schedule([d], [WS], [], new_id=ids).add
    assert (p.context, p.slots) == (32768, 3)
    assert p.memory_bytes == memory_bytes(LLAMA, 3 * 32768)
    # Three of the whole 131072 tokens fit on no 4090: each gets the longest third.
    d = gpu("llama", LLAMA, 1, args=["-np", "3"])
    (p,) = schedule([d], [WS], [], new_id=ids).add
    assert p.slots == 3 and 2048 <= p.context < 131072 // 2
    assert memory_bytes(LLAMA, 3 * p.context) == p.memory_bytes <= uuids(WS)[p.devices[0]][1]


def test_vllm_holds_one_contexts_kv_cache_and_its_slots_are_its_own_max_num_seqs() -> None:
    # vLLM's requests share a paged KV cache: one 32768-token context's, 256 requests at once.
    d = gpu("llama", LLAMA, 1, context=32768, engine="vllm")
    (p,) = schedule([d], [WS], [], new_id=ids).add
    assert (p.context, p.slots) == (32768, 256)
    assert p.memory_bytes == memory_bytes(LLAMA, 32768)
    (v, *_) = explain(d, [WS], [])
    assert (v.fits, v.slots, v.memory_bytes) == (True, 256, memory_bytes(LLAMA, 32768))
    named = gpu("llama", LLAMA, 1, context=32768, engine="vllm", args=["--max-num-seqs", "64"])
    (p,) = schedule([named], [WS], [], new_id=ids).add
    assert p.slots == 64 and p.memory_bytes == memory_bytes(LLAMA, 32768)


def test_a_mig_instance_is_a_place_and_the_smallest_that_fits_is_taken() -> None:
    # The captured A100 is split into four alike 1g.20gb instances: the one already holding
    # a small replica is the smallest that still fits the next; a second replica of the same
    # model spreads to another instance.
    first = schedule([gpu("smol", SMOL, 1)], [MIG], [], new_id=ids).add
    plan = schedule([gpu("llama", LLAMA, 2, context=8192)], [MIG], first, new_id=ids)
    places = uuids(MIG)
    assert [places[p.devices[0]][0] for p in plan.add] == ["1g.20gb", "1g.20gb"]
    assert plan.add[0].devices == first[0].devices
    assert len({p.devices[0] for p in plan.add}) == 2
    assert all(p.memory_bytes <= places[p.devices[0]][1] for p in plan.add)


def test_a_card_in_mig_mode_is_never_offered_whole() -> None:
    # Qwen2.5-72B Q4_K_M (47 GB) fits no 1g.20gb instance; the A100 has room for it whole,
    # but a card in MIG mode is no place of its own.
    (card,) = MIG.inventory.gpus
    assert card.memory_free_bytes > memory_bytes(QWEN, 32768)
    plan = schedule([gpu("qwen", QWEN, 2, min_context=32768)], [MIG], [], new_id=ids)
    assert plan.add == []
    (out,) = plan.outcomes
    assert out.unplaced == 2
    why = {v.place: v.reason for v in out.refusals}
    assert why["card 0 (NVIDIA A100-SXM4-80GB)"].startswith("in MIG mode")
    mig = [v for v in out.refusals if " MIG " in v.place]
    assert len(mig) == 4 and not any(v.fits for v in mig)
    # Each instance's refusal shows its own memory, never the card's 80 GB.
    for v in mig:
        (inst,) = [i for g in MIG.inventory.gpus for i in g.instances if i.uuid in v.place]
        assert f"of {gib(inst.memory_total_bytes)}" in v.reason


def test_replicas_of_one_model_spread_across_nodes() -> None:
    plan = schedule([gpu("smol", SMOL, 3)], [DGX, MIG, WS], [], new_id=ids)
    assert sorted(p.node for p in plan.add) == ["dgx", "mig", "ws"]
    more = schedule([gpu("smol", SMOL, 5)], [DGX, MIG, WS], plan.add, new_id=ids)
    assert len(more.add) == 2 and len({p.node for p in more.add}) == 2


def test_a_node_where_the_model_failed_is_avoided_while_anything_else_fits() -> None:
    demand = gpu("smol", SMOL, 4)
    plan = schedule([demand], [DGX, MIG, WS], [], failures={("dgx", "smol")}, new_id=ids)
    assert len(plan.add) == 4 and "dgx" not in {p.node for p in plan.add}
    llama = gpu("llama", LLAMA, 2, context=8192)
    plan = schedule([llama], [DGX, MIG, WS], [], failures={("mig", "llama")}, new_id=ids)
    assert sorted(p.node for p in plan.add) == ["dgx", "ws"]
    # Qwen with its whole 32k context fits only the H100s: where it failed there, it still
    # goes there rather than nowhere.
    big = gpu("qwen", QWEN, 1, min_context=32768)
    plan = schedule([big], [DGX, MIG, WS], [], failures={("dgx", "qwen")}, new_id=ids)
    assert [p.node for p in plan.add] == ["dgx"]
    verdicts = explain(big, [DGX, MIG, WS], [], failures={("dgx", "qwen")})
    assert {v.node for v in verdicts if v.fits} == {"dgx"}
    assert all("failed to start here" in v.reason for v in verdicts if v.fits)


def test_a_cordoned_node_keeps_its_replicas_and_takes_no_new_ones() -> None:
    first = schedule([gpu("smol", SMOL, 1)], [DGX], [], new_id=ids).add
    cordoned = msgspec.structs.replace(DGX, cordoned=True)
    plan = schedule([gpu("smol", SMOL, 3)], [cordoned, MIG, WS], first, new_id=ids)
    assert plan.remove == [] and sorted(p.node for p in plan.add) == ["mig", "ws"]
    plan = schedule([gpu("smol", SMOL, 2)], [cordoned], first, new_id=ids)
    (out,) = plan.outcomes
    assert out.unplaced == 1 and "cordoned" in out.refusals[0].reason


def test_a_draining_node_has_its_replicas_placed_elsewhere_and_removed() -> None:
    first = schedule([gpu("smol", SMOL, 1)], [DGX], [], new_id=ids).add
    draining = msgspec.structs.replace(DGX, draining=True)
    plan = schedule([gpu("smol", SMOL, 1)], [draining, WS], first, new_id=ids)
    assert [p.node for p in plan.add] == ["ws"]
    assert [(r.placement.id, "draining" in r.reason) for r in plan.remove] == [(first[0].id, True)]


def test_replicas_of_a_gone_node_or_model_are_removed() -> None:
    first = schedule([gpu("smol", SMOL, 1), gpu("llama", LLAMA, 1)], [WS], [], new_id=ids).add
    plan = schedule([gpu("smol", SMOL, 1)], [DGX], first, new_id=ids)
    reasons = {r.placement.model: r.reason for r in plan.remove}
    assert "gone" in reasons["smol"] and "catalog" in reasons["llama"]
    assert [p.node for p in plan.add] == ["dgx"]


def test_placed_replicas_hold_their_memory_until_no_card_has_room() -> None:
    big = gpu("qwen", QWEN, 9, min_context=32768)  # about 56 GiB each: one per H100
    plan = schedule([big], [DGX], [], new_id=ids)
    held = {d: p.memory_bytes for p in plan.add for d in p.devices}
    assert sorted(held) == sorted(g.uuid for g in DGX.inventory.gpus)
    (out,) = plan.outcomes
    assert (out.placed, out.unplaced) == (8, 1)
    # The next pass counts the eight as holding their memory: still no room for a ninth.
    again = schedule([big], [DGX], plan.add, new_id=ids)
    assert again.add == [] and again.outcomes[0].unplaced == 1
    # Why not, card by card, with what each card has left in the text.
    for g in DGX.inventory.gpus:
        (v,) = [v for v in out.refusals if v.place.startswith(f"card {g.index} ")]
        left = gib(g.memory_free_bytes - held[g.uuid])
        assert not v.fits and v.reason.startswith(f"{left} free of {gib(g.memory_total_bytes)}")
        assert "needs" in v.reason


def test_a_context_that_fits_nowhere_whole_is_shortened_where_it_fits_best() -> None:
    # Llama 3.1 8B with all its 131072 tokens needs more than a 1g.20gb instance holds.
    assert memory_bytes(LLAMA, 131072) > max(f for k, f in uuids(MIG).values() if k != "mig-card")
    plan = schedule([gpu("llama", LLAMA, 1)], [MIG], [], new_id=ids)
    (p,) = plan.add
    assert 2048 <= p.context < LLAMA.context_length
    assert p.memory_bytes <= uuids(MIG)[p.devices[0]][1]
    fits = [v for v in explain(gpu("llama", LLAMA, 1), [MIG], []) if v.fits]
    assert len(fits) == 4 and all("of the 131072 tokens wanted" in v.reason for v in fits)


def test_a_replica_split_over_cards_takes_whole_cards_only() -> None:
    split = gpu("qwen", QWEN, 1, gpus=2)
    plan = schedule([split], [DGX], [], new_id=ids)
    (p,) = plan.add
    assert len(set(p.devices)) == 2 and all(uuids(DGX)[d][0] == "card" for d in p.devices)
    assert p.memory_bytes < QWEN.weights_bytes  # each card holds a share
    plan = schedule([split], [MIG], [], new_id=ids)
    (out,) = plan.outcomes
    assert out.unplaced == 1
    assert any("cannot join" in v.reason for v in out.refusals)
    assert any("0 of 0 whole cards" in v.reason for v in out.refusals)


def cpu(replicas: int, cores: int = 16) -> Demand:
    profile = Profile(name="cpu", kind="cpu", replicas=replicas, cores=cores)
    return Demand(model="smol", profile=profile, shape=SMOL)


def test_a_cpu_profile_takes_ram_and_cores_and_says_how_fast() -> None:
    plan = schedule([cpu(2)], [CPU], [], new_id=ids)
    assert [(p.devices, p.cores) for p in plan.add] == [([], 16), ([], 16)]
    (out,) = schedule([cpu(3)], [CPU], plan.add, new_id=ids).outcomes
    assert out.unplaced == 1 and "0 of 32 cores free" in out.refusals[0].reason
    (v,) = explain(cpu(1), [CPU], [])
    assert v.fits and v.tokens_per_s > 0 and "tokens/s on 16 cores" in v.reason
    (v,) = explain(cpu(1), [msgspec.structs.replace(CPU, inventory=WS.inventory)], [])
    assert v.fits  # a GPU node's RAM and cores are a CPU place too


def test_a_gpu_profile_has_no_place_on_a_node_without_cards() -> None:
    (out,) = schedule([gpu("smol", SMOL, 1)], [CPU], [], new_id=ids).outcomes
    assert out.unplaced == 1 and out.refusals[0].reason == "no GPU"


def test_a_card_below_the_profiles_compute_capability_is_refused() -> None:
    fp8 = gpu("smol", SMOL, 1, min_compute_capability="9.0")
    plan = schedule([fp8], [MIG, WS, DGX], [], new_id=ids)
    assert [p.node for p in plan.add] == ["dgx"]
    verdicts = explain(fp8, [WS, MIG], [])
    assert {v.reason for v in verdicts} == {
        "compute capability 8.9 is below 9.0",
        "compute capability 8.0 is below 9.0",
        "in MIG mode: only its MIG instances are places",
    }


def test_fewer_replicas_wanted_remove_the_extra_and_keep_the_spread() -> None:
    four = schedule([gpu("smol", SMOL, 4)], [DGX, MIG, WS], [], new_id=ids).add
    plan = schedule([gpu("smol", SMOL, 2)], [DGX, MIG, WS], four, new_id=ids)
    assert plan.add == [] and len(plan.remove) == 2
    gone = {r.placement.id for r in plan.remove}
    left = [p for p in four if p.id not in gone]
    assert len({p.node for p in left}) == 2


def test_old_placement_records_without_memory_still_hold_memory() -> None:
    old = [
        Placement(id=f"q-{g.index}", model="qwen", node="dgx", profile="gpu", devices=[g.uuid])
        for g in DGX.inventory.gpus
    ]
    plan = schedule([gpu("qwen", QWEN, 9, min_context=32768)], [DGX], old, new_id=ids)
    assert plan.add == [] and plan.outcomes[0].unplaced == 1


def test_a_mixed_cluster_is_filled_without_overcommitting_any_place() -> None:
    nodes = [
        msgspec.structs.replace(n, name=f"{n.name}-{i}")
        for i in range(3)
        for n in (DGX, MIG, WS, CPU)
    ]
    wanted = [gpu(f"llama{i}", LLAMA, 4, context=8192) for i in range(20)]
    wanted += [gpu(f"qwen{i}", QWEN, 3, min_context=32768) for i in range(4)]
    wanted += [msgspec.structs.replace(cpu(2, cores=4), model=f"smol{i}") for i in range(10)]
    plan = schedule(wanted, nodes, [], new_id=ids)
    assert all(o.unplaced == 0 for o in plan.outcomes)
    # Each place holds no more than it has free; cores likewise.
    # (The copies of a node share its cards' UUIDs: a place is a node's UUID.)
    free = {(n.name, u): f for n in nodes for u, (_, f) in uuids(n).items()}
    held: dict[tuple[str, str], int] = {}
    for p in plan.add:
        for d in p.devices:
            held[(p.node, d)] = held.get((p.node, d), 0) + p.memory_bytes
    assert held and all(held[k] <= free[k] for k in held)
    mig_cards = {(n.name, g.uuid) for n in nodes for g in n.inventory.gpus if g.mig}
    assert not set(held) & mig_cards
    # Every model's replicas are on different nodes (there are more nodes than replicas).
    by_model: dict[str, list[str]] = {}
    for p in plan.add:
        by_model.setdefault(p.model, []).append(p.node)
    assert all(len(set(ns)) == len(ns) for ns in by_model.values())
