"""Convert a real machine's `nvidia-smi -q -x` (or `-q`) output into record.py's JSON form."""

from __future__ import annotations

import argparse
import json
import re
import sys
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NOT_SUPPORTED = {"nvml_error": 3}  # NVML_ERROR_NOT_SUPPORTED
# What nvidia-smi prints where NVML answered Not Supported (or nvidia-smi has no value).
UNSUPPORTED = {"N/A", "[N/A]", "Not Supported", "[Not Supported]"}
MIB = 1 << 20

# Compute capability by product name (NVIDIA's CUDA GPUs table), for captures whose
# nvidia-smi does not print it: the first entry whose name the product name contains.
CAPABILITY = [
    ("A100", (8, 0)),
    ("H100", (9, 0)),
    ("H200", (9, 0)),
    ("RTX 4090", (8, 9)),
    ("L40", (8, 9)),
    ("RTX A6000", (8, 6)),
    ("A40", (8, 6)),
    ("V100", (7, 0)),
]
# Cards NVML splits into up to 7 MIG devices, and for each family the compute slices a MIG
# device has by its SM count (NVIDIA's MIG user guide profiles), to name profiles that an
# XML capture does not name.
MIG_SLICES = {
    "A100": {14: 1, 28: 2, 42: 3, 56: 4, 98: 7},
    "H100": {16: 1, 26: 1, 32: 2, 60: 3, 64: 4, 132: 7},
    "H200": {16: 1, 26: 1, 32: 2, 60: 3, 64: 4, 132: 7},
}
MAX_MIG_DEVICES = 7


@dataclass
class Node:
    """One element of nvidia-smi's report: an XML element, or a text line and its block."""

    name: str
    text: str = ""
    children: list[Node] = field(default_factory=list)

    def all(self, *path: str) -> list[Node]:
        """Every node at path below this one."""
        nodes = [self]
        for step in path:
            nodes = [c for n in nodes for c in n.children if c.name == step]
        return nodes

    def get(self, *paths: tuple[str, ...]) -> str | None:
        """The text at the first of paths that is present."""
        for path in paths:
            found = self.all(*path)
            if found:
                return found[0].text
        return None


def from_xml(text: str) -> Node:
    def convert(e: ET.Element) -> Node:
        return Node(e.tag, (e.text or "").strip(), [convert(c) for c in e])

    return convert(ET.fromstring(text))


_LINE = re.compile(r"^(?P<key>.*?)\s+:(?: (?P<value>.*))?$")


def from_text(text: str) -> Node:
    """nvidia-smi -q's indented "Key : Value" lines as a tree; each "GPU <bus id>" is a gpu."""
    root = Node("nvidia_smi_log")
    stack: list[tuple[int, Node]] = [(-1, root)]
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("====="):
            continue
        indent = len(line) - len(line.lstrip())
        m = _LINE.match(stripped)
        node = Node(m["key"].strip(), (m["value"] or "").strip()) if m else Node(stripped)
        while stack[-1][0] >= indent:
            stack.pop()
        if stack[-1][1] is root and node.name.startswith("GPU ") and not m:
            node = Node("gpu", node.name[4:])
        stack[-1][1].children.append(node)
        stack.append((indent, node))
    return root


@dataclass(frozen=True)
class Keys:
    """Where a format keeps each figure: alternative paths below the root or a gpu."""

    driver: tuple[tuple[str, ...], ...]
    cuda: tuple[tuple[str, ...], ...]
    attached: tuple[tuple[str, ...], ...]
    name: tuple[tuple[str, ...], ...]
    uuid: tuple[tuple[str, ...], ...]
    minor: tuple[tuple[str, ...], ...]
    capability: tuple[tuple[str, ...], ...]
    mig_current: tuple[tuple[str, ...], ...]
    mig_pending: tuple[tuple[str, ...], ...]
    memory: tuple[tuple[str, ...], ...]
    total: tuple[tuple[str, ...], ...]
    free: tuple[tuple[str, ...], ...]
    util_gpu: tuple[tuple[str, ...], ...]
    util_memory: tuple[tuple[str, ...], ...]
    power: tuple[tuple[str, ...], ...]
    limit: tuple[tuple[str, ...], ...]
    mig_devices: tuple[tuple[str, ...], ...]
    mig_index: tuple[tuple[str, ...], ...]
    gpu_instance: tuple[tuple[str, ...], ...]
    compute_instance: tuple[tuple[str, ...], ...]
    mig_sms: tuple[tuple[str, ...], ...]
    mig_memory: tuple[tuple[str, ...], ...]


XML = Keys(
    driver=(("driver_version",),),
    cuda=(("cuda_version",),),
    attached=(("attached_gpus",),),
    name=(("product_name",),),
    uuid=(("uuid",),),
    minor=(("minor_number",),),
    capability=(("cuda_compute_capability",), ("compute_cap",)),
    mig_current=(("mig_mode", "current_mig"),),
    mig_pending=(("mig_mode", "pending_mig"),),
    memory=(("fb_memory_usage",),),
    total=(("total",),),
    free=(("free",),),
    util_gpu=(("utilization", "gpu_util"),),
    util_memory=(("utilization", "memory_util"),),
    power=(
        ("gpu_power_readings", "power_draw"),
        ("gpu_power_readings", "average_power_draw"),
        ("power_readings", "power_draw"),
    ),
    limit=(
        ("gpu_power_readings", "enforced_power_limit"),
        ("gpu_power_readings", "current_power_limit"),
        ("power_readings", "enforced_power_limit"),
    ),
    mig_devices=(("mig_devices", "mig_device"),),
    mig_index=(("index",),),
    gpu_instance=(("gpu_instance_id",),),
    compute_instance=(("compute_instance_id",),),
    mig_sms=(("device_attributes", "shared", "multiprocessor_count"),),
    mig_memory=(("fb_memory_usage",),),
)
TEXT = Keys(
    driver=(("Driver Version",),),
    cuda=(("CUDA Version",),),
    attached=(("Attached GPUs",),),
    name=(("Product Name",),),
    uuid=(("GPU UUID",),),
    minor=(("Minor Number",),),
    capability=(),
    mig_current=(("MIG Mode", "Current"),),
    mig_pending=(("MIG Mode", "Pending"),),
    memory=(("FB Memory Usage",),),
    total=(("Total",),),
    free=(("Free",),),
    util_gpu=(("Utilization", "Gpu"), ("Utilization", "GPU")),
    util_memory=(("Utilization", "Memory"),),
    power=(
        ("GPU Power Readings", "Power Draw"),
        ("GPU Power Readings", "Average Power Draw"),
        ("Power Readings", "Power Draw"),
    ),
    limit=(
        ("GPU Power Readings", "Enforced Power Limit"),
        ("GPU Power Readings", "Current Power Limit"),
        ("Power Readings", "Enforced Power Limit"),
    ),
    mig_devices=(("MIG Device",), ("MIG Devices", "MIG Device")),
    mig_index=(("Index",),),
    gpu_instance=(("GPU Instance ID",),),
    compute_instance=(("Compute Instance ID",),),
    mig_sms=(("Device Attributes", "Shared", "Multiprocessor count"),),
    mig_memory=(("Shared FB Memory Usage",), ("FB Memory Usage",)),
)


def _required(node: Node, paths: tuple[tuple[str, ...], ...], what: str) -> str:
    value = node.get(*paths)
    if value is None:
        raise SystemExit(f"the capture has no {what}")
    return value


def _number(value: str, unit: str) -> float:
    m = re.fullmatch(rf"(-?[0-9.]+) ?{re.escape(unit)}", value)
    if not m:
        raise SystemExit(f"cannot read {value!r} as {unit}")
    return float(m[1])


def _memory(node: Node, keys: Keys, paths: tuple[tuple[str, ...], ...]) -> dict[str, int]:
    """NVML's v1 memory structure: nvidia-smi's MiB as bytes; used is total - free, as
    NVML's v1 call counts the driver's reserved memory as used."""
    blocks = next((node.all(*p) for p in paths if node.all(*p)), None)
    if not blocks:
        raise SystemExit("the capture has no memory figures")
    block = blocks[0]
    total = int(_number(_required(block, keys.total, "memory total"), "MiB")) * MIB
    free = int(_number(_required(block, keys.free, "memory free"), "MiB")) * MIB
    return {"total": total, "free": free, "used": total - free}


def _mode(value: str | None) -> int | None:
    return {"Enabled": 1, "Disabled": 0}.get(value or "")


class Converter:
    """Builds record.py's answers for one capture, noting what is derived, not captured."""

    def __init__(self, root: Node, keys: Keys, command: str) -> None:
        self.root = root
        self.keys = keys
        self.command = command
        self.derived: set[str] = set()

    def card(self, gpu: Node) -> dict[str, Any]:
        k = self.keys
        name = _required(gpu, k.name, "product name")
        mig = [_mode(gpu.get(*k.mig_current)), _mode(gpu.get(*k.mig_pending))]
        gpu_util, mem_util = gpu.get(*k.util_gpu), gpu.get(*k.util_memory)
        power, limit = gpu.get(*k.power), gpu.get(*k.limit)
        out: dict[str, Any] = {
            "nvmlDeviceGetUUID": _required(gpu, k.uuid, "GPU UUID"),
            "nvmlDeviceGetName": name,
            "nvmlDeviceGetMemoryInfo": _memory(gpu, k, k.memory),
            "nvmlDeviceGetCudaComputeCapability": self.capability(gpu, name),
            "nvmlDeviceGetMigMode": NOT_SUPPORTED if None in mig else mig,
            "nvmlDeviceGetUtilizationRates": (
                NOT_SUPPORTED
                if gpu_util is None or mem_util is None or {gpu_util, mem_util} & UNSUPPORTED
                else {"gpu": int(_number(gpu_util, "%")), "memory": int(_number(mem_util, "%"))}
            ),
            "nvmlDeviceGetPowerUsage": self.milliwatts(power),
            "nvmlDeviceGetEnforcedPowerLimit": self.milliwatts(limit),
            "nvmlDeviceGetMaxMigDeviceCount": self.max_mig(name),
            "nvmlDeviceGetMinorNumber": self.minor(gpu),
            "mig_devices": [],
        }
        if mig[0] == 1:
            out["mig_devices"] = self.mig_devices(gpu, name, out["nvmlDeviceGetUUID"])
        return out

    def minor(self, gpu: Node) -> int | dict[str, int]:
        """The card's minor number (its /dev/nvidiaN), Not Supported where not printed."""
        value = gpu.get(*self.keys.minor)
        return int(value) if value is not None and value.isdigit() else NOT_SUPPORTED

    def capability(self, gpu: Node, name: str) -> list[int]:
        value = gpu.get(*self.keys.capability) if self.keys.capability else None
        if value and value not in UNSUPPORTED:
            return [int(part) for part in value.split(".")]
        for part, (major, minor) in CAPABILITY:
            if part in name:
                self.derived.add(
                    "compute capability from the product name (NVIDIA's CUDA GPUs table; "
                    "this nvidia-smi does not print it)"
                )
                return [major, minor]
        raise SystemExit(f"no compute capability known for {name!r}")

    def milliwatts(self, value: str | None) -> int | dict[str, int]:
        if value is None or value in UNSUPPORTED:
            return NOT_SUPPORTED
        return round(_number(value, "W") * 1000)

    def max_mig(self, name: str) -> int | dict[str, int]:
        self.derived.add(
            f"nvmlDeviceGetMaxMigDeviceCount ({MAX_MIG_DEVICES} for A100/H100-class cards, "
            f"else Not Supported; {self.command} does not print it)"
        )
        return MAX_MIG_DEVICES if any(f in name for f in MIG_SLICES) else NOT_SUPPORTED

    def mig_devices(self, gpu: Node, name: str, parent: str) -> list[dict[str, Any] | None]:
        k = self.keys
        slots: list[dict[str, Any] | None] = [None] * MAX_MIG_DEVICES
        devices = next((gpu.all(*p) for p in k.mig_devices if gpu.all(*p)), [])
        for dev in devices:
            index = int(_required(dev, k.mig_index, "MIG device index"))
            gi = int(_required(dev, k.gpu_instance, "GPU instance ID"))
            ci = int(_required(dev, k.compute_instance, "compute instance ID"))
            memory = _memory(dev, k, k.mig_memory)
            sms = int(_required(dev, k.mig_sms, "MIG device SM count"))
            slots[index] = {
                "nvmlDeviceGetUUID": f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, f'{parent}/{gi}/{ci}')}",
                "nvmlDeviceGetName": f"{name} MIG {self.profile(name, sms, memory['total'])}",
                "nvmlDeviceGetMemoryInfo": memory,
                "nvmlDeviceGetGpuInstanceId": gi,
                "nvmlDeviceGetComputeInstanceId": ci,
            }
        self.derived.add(
            "MIG device UUIDs (synthesized, stable: uuid5 of the card's UUID and the instance "
            f"IDs; {self.command} does not print them)"
        )
        return slots

    def profile(self, name: str, sms: int, total: int) -> str:
        """A MIG profile's name, "<compute slices>g.<memory GB>gb", from an instance's SM count
        and memory: nvidia-smi -q (-x) names no profile."""
        family = next(f for f in MIG_SLICES if f in name)
        slices = MIG_SLICES[family].get(sms)
        if slices is None:
            raise SystemExit(f"no {family} MIG profile has {sms} SMs")
        self.derived.add(
            "MIG profile names from each instance's SM count and memory "
            f"(NVIDIA's MIG profiles; {self.command} names none)"
        )
        return f"{slices}g.{5 * round(total / MIB / 1024 / 5)}gb"

    def recording(self, source: str) -> dict[str, Any]:
        k = self.keys
        cuda = _required(self.root, k.cuda, "CUDA version")
        major, minor = cuda.split(".")
        gpus = self.root.all("gpu")
        devices = [self.card(g) for g in gpus]
        notes = [
            "Converted by tests/llmgw_agentd/nvml/from_nvidia_smi.py from the output of "
            f"`{self.command}` on a real machine: {source}. Names, UUIDs, memory (MiB as "
            "bytes), MIG mode and "
            "instances, utilization and power (W as mW) are the capture's; N/A is NVML's "
            "Not Supported."
        ]
        attached = self.root.get(*k.attached)
        if attached is not None and int(attached) != len(gpus):
            notes.append(
                f"The capture says {attached} attached GPUs but holds the figures of only "
                f"{len(gpus)}: this recording has {len(gpus)} card(s), where NVML on that "
                f"machine would list {attached}."
            )
        memory = "memory used is total - free (NVML's v1 memory call counts reserved as used)"
        notes.append("Derived, not in the capture: " + "; ".join([memory, *sorted(self.derived)]))
        return {
            "provenance": " ".join(notes),
            "system": {
                "nvmlSystemGetDriverVersion": _required(self.root, k.driver, "driver version"),
                "nvmlSystemGetCudaDriverVersion": int(major) * 1000 + int(minor) * 10,
            },
            "devices": devices,
        }


def convert(capture: Path, source: str) -> dict[str, Any]:
    """The recording for one nvidia-smi capture (-q -x if it is XML, else -q)."""
    text = capture.read_text()
    if text.lstrip().startswith("<"):
        return Converter(from_xml(text), XML, "nvidia-smi -q -x").recording(source)
    return Converter(from_text(text), TEXT, "nvidia-smi -q").recording(source)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("capture", type=Path, help="nvidia-smi -q -x or -q output")
    parser.add_argument("source", help="where the capture comes from: repository, path, commit")
    args = parser.parse_args()
    json.dump(convert(args.capture, args.source), sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
