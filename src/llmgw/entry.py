"""The daemons' shared start: --config and --check, a clear exit on bad config, uvloop, the GC."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import uvloop  # a dependency of both daemons, this module's only users

from llmgw import log, package_version
from llmgw.config import C, ConfigError, load

EX_CONFIG = 78  # sysexits.h: systemd and people see "bad config", not a crash
# CPython's collector once a daemon has started (default 700, 10, 10): the router's requests
# make next to no cyclic garbage, but at 700 objects in flight a young collection runs, so a
# backlog of requests set off hundreds a second and full ones over every object (bench/README).
GC_THRESHOLD = (10_000, 10, 10)
# The config file run_daemon read and whether it may be missing, for reread() at a reload.
_SOURCE: dict[str, tuple[Path, bool]] = {}


def settle_heap() -> None:
    """Once a daemon has started: collect, then freeze what start-up built (the modules, the
    catalog, the apps), which full collections no longer walk, and collect less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


def reread(schema: type[C]) -> C:
    """The config file the daemon started from, read again (`systemctl reload`); a
    ConfigError when it cannot be used now."""
    if "config" not in _SOURCE:
        raise ConfigError("no config file was read at start")
    path, missing_ok = _SOURCE["config"]
    return load(path, schema, missing_ok=missing_ok)


def run_daemon(
    prog: str,
    description: str,
    default_config: Path,
    schema: type[C],
    runner: Callable[[C], Coroutine[Any, Any, None]],
    argv: list[str] | None = None,
    *,
    missing_ok: bool = False,
) -> None:
    """Parse arguments, load the config (exit 78 naming key and line when it is wrong), run
    (exit 78 on a ConfigError raised while starting, in one line: systemd does not restart).
    missing_ok: the default file may be absent (the defaults then); a file named by --config
    must always be there."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--config", type=Path, help=f"config file to read (default {default_config})"
    )
    parser.add_argument("--check", action="store_true", help="check the config and exit")
    parser.add_argument(
        "--version", action="version", version=f"{prog}, version {package_version()}"
    )
    args = parser.parse_args(argv)
    path: Path = args.config or default_config
    _SOURCE["config"] = (path, missing_ok and args.config is None)
    try:
        config = load(path, schema, missing_ok=_SOURCE["config"][1])
        network = getattr(config, "network", None)  # both daemons' network.proxy, or else
        if network is not None:  # HTTPS_PROXY/HTTP_PROXY, which must be http:// URLs
            network.route(os.environ)
    except ConfigError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        sys.exit(EX_CONFIG)
    if args.check:
        print(f"{path}: ok" if path.exists() else f"{path}: ok (no such file: the defaults)")
        return
    log.setup(prog, getattr(config, "log_level", "info"))
    try:
        uvloop.run(runner(config))
    except KeyboardInterrupt:
        pass
    except ConfigError as e:  # found on starting (a store of a newer schema): as a bad config
        logging.getLogger(prog).error("%s cannot start: %s", prog, e)
        sys.exit(EX_CONFIG)
    except Exception:
        logging.getLogger(prog).exception("%s stopped on an error", prog)
        sys.exit(1)
