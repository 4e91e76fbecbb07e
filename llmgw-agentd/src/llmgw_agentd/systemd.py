"""A small client of systemd's manager (org.freedesktop.systemd1) over D-Bus, led by its signals."""

from __future__ import annotations

import asyncio
import signal
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dbus_fast import BusType, Message, MessageType, Variant
from dbus_fast.aio import MessageBus

BUS_NAME = "org.freedesktop.systemd1"
MANAGER_PATH = "/org/freedesktop/systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"
UNIT = "org.freedesktop.systemd1.Unit"
SERVICE = "org.freedesktop.systemd1.Service"
PROPERTIES = "org.freedesktop.DBus.Properties"
UNIT_PATH_PREFIX = "/org/freedesktop/systemd1/unit/"

NO_SUCH_UNIT = "org.freedesktop.systemd1.NoSuchUnit"
UNIT_EXISTS = "org.freedesktop.systemd1.UnitExists"

RUNNING_STATES = frozenset({"active", "activating", "reloading", "deactivating"})
ENDED_STATES = frozenset({"inactive", "failed"})

# systemd's own exit statuses for a service that never got to run its program.
_EXEC_FAILURES = {
    200: "CHDIR",
    203: "EXEC: the program could not be executed",
    209: "STDOUT",
    216: "GROUP",
    217: "USER",
    226: "NAMESPACE: the sandbox could not be set up",
    243: "CREDENTIALS: a credential could not be loaded",
}

_MATCH_RULES = (
    f"type='signal',sender='{BUS_NAME}',interface='{PROPERTIES}',member='PropertiesChanged',"
    f"path_namespace='{UNIT_PATH_PREFIX.rstrip('/')}'",
    f"type='signal',sender='{BUS_NAME}',interface='{MANAGER}',path='{MANAGER_PATH}'",
)


class SystemdError(Exception):
    """A systemd call that failed; name is the D-Bus error name."""

    def __init__(self, name: str, text: str) -> None:
        super().__init__(f"{text} ({name})")
        self.name = name
        self.text = text


@dataclass(frozen=True)
class UnitInfo:
    """One unit as ListUnitsByPatterns lists it."""

    name: str
    description: str
    load_state: str
    active_state: str
    sub_state: str
    path: str


@dataclass(frozen=True)
class UnitState:
    """What is known of a service unit: its states and how its main process ended."""

    name: str
    active_state: str = ""
    sub_state: str = ""
    result: str = ""  # Service.Result: success, exit-code, signal, core-dump, timeout, ...
    main_pid: int = 0  # ExecMainPID
    exit_code: int = 0  # ExecMainCode: 1 exited, 2 killed, 3 dumped core
    exit_status: int = 0  # ExecMainStatus: the exit status or the signal number
    removed: bool = False  # the unit is gone (garbage-collected or never loaded)

    @property
    def running(self) -> bool:
        """The unit has (or is about to have) a process."""
        return not self.removed and self.active_state in RUNNING_STATES

    @property
    def ended(self) -> bool:
        """The unit has stopped: failed, inactive or unloaded."""
        return self.removed or self.active_state in ENDED_STATES

    def describe(self) -> str:
        """How the main process ended, in words for a status message."""
        if self.result == "oom-kill":
            return "killed by the kernel: it went over its memory limit (MemoryMax)"
        if self.exit_code == 2 or self.result in ("signal", "core-dump"):
            try:
                name = signal.Signals(self.exit_status).name
            except ValueError:
                name = str(self.exit_status)
            dumped = " (core dumped)" if self.result == "core-dump" else ""
            return f"killed by signal {name}{dumped}"
        if self.result == "exit-code" or self.exit_status:
            why = _EXEC_FAILURES.get(self.exit_status)
            if why is not None:
                return f"could not start: {self.exit_status}/{why}"
            return f"exited with status {self.exit_status}"
        if self.result and self.result != "success":
            return f"failed: {self.result}"
        return "exited" if self.exit_code else "stopped"

    def updated(self, props: dict[str, Any]) -> UnitState:
        """This state with the properties of a GetAll or PropertiesChanged applied."""
        fields: dict[str, Any] = {}
        for prop, field in _FIELDS.items():
            if prop in props:
                fields[field] = props[prop]
        return replace(self, **fields) if fields else self


_FIELDS = {
    "ActiveState": "active_state",
    "SubState": "sub_state",
    "Result": "result",
    "ExecMainPID": "main_pid",
    "ExecMainCode": "exit_code",
    "ExecMainStatus": "exit_status",
}

Watcher = Callable[[UnitState], None]


def unit_path(name: str) -> str:
    """The object path systemd gives a unit (its bus_label_escape of the name)."""
    if not name:
        return UNIT_PATH_PREFIX + "_"
    out = []
    for i, ch in enumerate(name):
        if ch.isascii() and (ch.isalpha() or (ch.isdigit() and i > 0)):
            out.append(ch)
        else:
            out.extend(f"_{b:02x}" for b in ch.encode())
    return UNIT_PATH_PREFIX + "".join(out)


class Systemd:
    """systemd's manager on the system bus (or at bus_address, for tests)."""

    def __init__(self, bus_address: str | None = None) -> None:
        self._address = bus_address
        self._bus: MessageBus | None = None
        self._watchers: dict[str, list[Watcher]] = {}  # unit name -> callbacks
        self._paths: dict[str, str] = {}  # object path -> unit name, for watched units
        self._states: dict[str, UnitState] = {}  # watched units, as the signals tell
        self._job_waiters: dict[str, asyncio.Future[str]] = {}
        # JobRemoved can arrive before the caller has read the job's path from the reply.
        self._jobs_done: OrderedDict[str, str] = OrderedDict()

    async def connect(self) -> None:
        """Connect, ask for systemd's signals and subscribe to them."""
        bus = MessageBus(bus_address=self._address, bus_type=BusType.SYSTEM)
        await bus.connect()
        self._bus = bus
        bus.add_message_handler(self._on_message)
        for rule in _MATCH_RULES:
            await self._call(
                "org.freedesktop.DBus",
                "/org/freedesktop/DBus",
                "org.freedesktop.DBus",
                "AddMatch",
                "s",
                [rule],
            )
        await self._manager("Subscribe")

    async def close(self) -> None:
        """Disconnect; units keep running."""
        if self._bus is not None:
            self._bus.disconnect()
            self._bus = None
        for fut in self._job_waiters.values():
            fut.cancel()
        self._job_waiters.clear()

    async def start_transient(
        self, name: str, argv: Sequence[str], properties: Sequence[tuple[str, Variant]]
    ) -> str:
        """Start a transient service running argv; returns the start job's result ("done")."""
        exec_start = Variant("a(sasb)", [(argv[0], list(argv), False)])
        props = [*properties, ("ExecStart", exec_start)]
        reply = await self._manager(
            "StartTransientUnit", "ssa(sv)a(sa(sv))", [name, "fail", props, []]
        )
        return await self._wait_job(reply[0])

    async def stop(self, name: str) -> str:
        """Stop a unit and wait for it to be stopped; "" when it was not loaded."""
        try:
            reply = await self._manager("StopUnit", "ss", [name, "replace"])
        except SystemdError as e:
            if e.name == NO_SUCH_UNIT:
                return ""
            raise
        return await self._wait_job(reply[0])

    async def start(self, name: str) -> str:
        """Start a unit from its files (and drop-ins); returns the start job's result."""
        reply = await self._manager("StartUnit", "ss", [name, "replace"])
        return await self._wait_job(reply[0])

    async def restart(self, name: str) -> str:
        """Restart a unit (start it if it is not running); returns the job's result."""
        reply = await self._manager("RestartUnit", "ss", [name, "replace"])
        return await self._wait_job(reply[0])

    async def reload(self) -> None:
        """The manager's daemon-reload: it reads unit files and drop-ins again."""
        await self._manager("Reload")

    async def reset_failed(self, name: str) -> None:
        """Forget a unit's failure, so that it is unloaded and its name can be used again."""
        try:
            await self._manager("ResetFailedUnit", "s", [name])
        except SystemdError as e:
            if e.name != NO_SUCH_UNIT:
                raise

    async def list_units(self, pattern: str) -> list[UnitInfo]:
        """The loaded units whose names match a glob pattern."""
        reply = await self._manager("ListUnitsByPatterns", "asas", [[], [pattern]])
        return [UnitInfo(u[0], u[1], u[2], u[3], u[4], u[6]) for u in reply[0]]

    async def state(self, name: str) -> UnitState:
        """A unit's current state, read from systemd (removed=True when it is not loaded)."""
        try:
            path = (await self._manager("GetUnit", "s", [name]))[0]
        except SystemdError as e:
            if e.name == NO_SUCH_UNIT:
                return UnitState(name, removed=True)
            raise
        st = UnitState(name)
        for iface in (UNIT, SERVICE):
            props = (await self._call(BUS_NAME, path, PROPERTIES, "GetAll", "s", [iface]))[0]
            st = st.updated({k: v.value for k, v in props.items()})
        return st

    def watch(self, name: str, callback: Watcher) -> Callable[[], None]:
        """Call callback with the unit's state on each change systemd signals; returns unwatch.

        systemd signals a new transient unit as inactive once before it activates: confirm
        an end with state() before acting on it.
        """
        self._watchers.setdefault(name, []).append(callback)
        self._paths[unit_path(name)] = name
        self._states.setdefault(name, UnitState(name))

        def unwatch() -> None:
            callbacks = self._watchers.get(name, [])
            if callback in callbacks:
                callbacks.remove(callback)
            if not callbacks:
                self._watchers.pop(name, None)
                self._paths.pop(unit_path(name), None)
                self._states.pop(name, None)

        return unwatch

    # D-Bus plumbing

    async def _manager(
        self, member: str, signature: str = "", body: list[Any] | None = None
    ) -> list[Any]:
        return await self._call(BUS_NAME, MANAGER_PATH, MANAGER, member, signature, body or [])

    async def _call(
        self, dest: str, path: str, iface: str, member: str, signature: str, body: list[Any]
    ) -> list[Any]:
        if self._bus is None:
            raise SystemdError("org.freedesktop.DBus.Error.Disconnected", "not connected")
        msg = Message(
            destination=dest,
            path=path,
            interface=iface,
            member=member,
            signature=signature,
            body=body,
        )
        reply = await self._bus.call(msg)
        if reply.message_type == MessageType.ERROR:
            text = reply.body[0] if reply.body else ""
            raise SystemdError(reply.error_name or "unknown", str(text))
        return list(reply.body)

    async def _wait_job(self, job: str) -> str:
        if job in self._jobs_done:
            return self._jobs_done.pop(job)
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._job_waiters[job] = fut
        try:
            return await fut
        finally:
            self._job_waiters.pop(job, None)

    def _on_message(self, msg: Message) -> None:
        if msg.message_type != MessageType.SIGNAL:
            return
        if msg.member == "PropertiesChanged" and msg.interface == PROPERTIES:
            self._on_properties(msg)
        elif msg.interface == MANAGER and msg.member == "JobRemoved":
            self._on_job_removed(msg.body[1], msg.body[3])
        elif msg.interface == MANAGER and msg.member in ("UnitRemoved", "UnitNew"):
            self._on_unit_presence(msg.body[0], removed=msg.member == "UnitRemoved")

    def _on_properties(self, msg: Message) -> None:
        name = self._paths.get(msg.path or "")
        if name is None or msg.body[0] not in (UNIT, SERVICE):
            return
        changed = {k: v.value for k, v in msg.body[1].items()}
        old = self._states.get(name, UnitState(name))
        new = replace(old.updated(changed), removed=False)
        if new != old:
            self._notify(name, new)

    def _on_unit_presence(self, name: str, *, removed: bool) -> None:
        if name not in self._watchers:
            return
        old = self._states.get(name, UnitState(name))
        # A new unit of the same name starts from nothing: forget the last run's exit.
        new = replace(old, removed=True) if removed else UnitState(name)
        if new != old:
            self._notify(name, new)

    def _notify(self, name: str, st: UnitState) -> None:
        self._states[name] = st
        for callback in list(self._watchers.get(name, [])):
            callback(st)

    def _on_job_removed(self, job: str, result: str) -> None:
        fut = self._job_waiters.pop(job, None)
        if fut is not None:
            if not fut.done():
                fut.set_result(result)
            return
        self._jobs_done[job] = result
        while len(self._jobs_done) > 256:  # jobs of other clients: keep only the recent ones
            self._jobs_done.popitem(last=False)
