"""Peak memory of `llmgw backup` and `llmgwd restore` against the store's size: llmgwd's
process (serving POST /backup), the CLI's and the restore's, each its own process (its
ru_maxrss), for stores of usage rows of each size, with this tree and, with --before REV,
the tree of REV (the in-memory way before the streamed one) in the same run.

    .venv/bin/python bench/backup/bench.py                   # 10 and 200 MB, this tree
    .venv/bin/python bench/backup/bench.py --before d652b4f  # and REV's, side by side
"""

from __future__ import annotations

import argparse
import asyncio
import grp
import json
import os
import pwd
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
PHRASE = "correct horse battery staple"
ROW_BATCH = 500  # usage rows a transaction while filling


def _peak_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _report(**fields: Any) -> None:
    print("RESULT " + json.dumps(fields), flush=True)


async def _fill(state_dir: Path, mb: int) -> None:
    """A store of usage rows (as Usage writes them: /usage/DAY/KEY/MODEL, JSON counts)
    until state.db is mb MB."""
    from llmgwd.store import Put
    from llmgwd.store.sqlite import SqliteStore

    store = await SqliteStore.open(state_dir / "state.db")
    db, n = state_dir / "state.db", 0
    try:
        while db.stat().st_size < mb * 1_000_000:
            puts = []
            for _ in range(ROW_BATCH):
                day, key, model = f"2026-{n // 40000 % 12 + 1:02d}-{n % 28 + 1:02d}", n, n % 7
                value = {"requests": n, "prompt_tokens": 7 * n, "completion_tokens": 3 * n,
                         "spend_pico": 123456789 * n}  # fmt: skip
                puts.append(Put(f"/usage/{day}/k{key:08d}/model-{model}",
                                json.dumps(value).encode()))  # fmt: skip
                n += 1
            await store.txn([], cast(Any, puts))
    finally:
        await store.close()
    print(f"filled {db} with {n} usage rows: {db.stat().st_size / 1e6:.0f} MB", flush=True)


def serve(state_dir: Path, sock: str, fresh: Path) -> None:
    """llmgwd's API over sock with the store in state_dir, until stdin closes; its peak."""
    from aiohttp import web

    from llmgw import pki
    from llmgw.config import ServerConfig
    from llmgwd.api.access import peercred_auth
    from llmgwd.api.base import ApiContext
    from llmgwd.api.routes import api_app
    from llmgwd.catalog import Catalog
    from llmgwd.planes import backup
    from llmgwd.planes.listing import ControlPlanes
    from llmgwd.planes.tokens import PlaneTokens
    from llmgwd.store.sqlite import SqliteStore

    async def run() -> None:
        store = await SqliteStore.open(state_dir / "state.db")
        catalog = Catalog(store)
        await catalog.load()
        cfg = ServerConfig(name="bench", state_dir=str(fresh))  # restored into fresh
        src = backup.Source(store, cfg, pki.make_ca("bench"), os.urandom(32), "cp1")
        planes = ControlPlanes(store, None, PlaneTokens(store, src.ca.cert_pem), "cp1",
                               "https://cp1:7710", backup=src)  # fmt: skip
        ctx = ApiContext(catalog=catalog, nodes=cast(Any, None), mint_token=lambda: "t",
                         join_url="https://cp1:7710", control_planes=planes)  # fmt: skip
        group = grp.getgrgid(os.getgid()).gr_name  # the socket's admins: us
        runner = web.AppRunner(api_app(ctx, peercred_auth(group)))
        await runner.setup()
        await web.UnixSite(runner, sock).start()
        before = _peak_kib()
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.read)
        await runner.cleanup()
        await store.close()
        _report(who="llmgwd", before_kib=before, peak_kib=_peak_kib())

    asyncio.run(run())


def cli(args: list[str]) -> None:
    """`llmgw ARGS` in this process; its peak."""
    import llmgw
    from llmgw.cli.main import main

    print(f"llmgw from {Path(llmgw.__file__).parent}", file=sys.stderr)
    before = _peak_kib()
    started = time.monotonic()
    main.main(args, prog_name="llmgw", standalone_mode=False)
    _report(who="llmgw backup", before_kib=before, peak_kib=_peak_kib(),
            seconds=time.monotonic() - started)  # fmt: skip


def restore(file: str, phrase: str, fresh: Path) -> None:
    """`llmgwd restore FILE` into fresh (its settings name it), as this user; its peak."""
    from llmgwd.planes import host_commands

    me = pwd.getpwuid(os.getuid())
    pwd.getpwnam = lambda _: me  # type: ignore[assignment]  # no llmgw user needed
    before = _peak_kib()
    started = time.monotonic()
    args = ["restore", file, "--passphrase-file", phrase, "--config",
            str(fresh / "server.yaml"), "--no-start"]  # fmt: skip
    host_commands.host.main(args, prog_name="llmgwd", standalone_mode=False)
    _report(who="llmgwd restore", before_kib=before, peak_kib=_peak_kib(),
            seconds=time.monotonic() - started)  # fmt: skip


def _child(tree: Path | None, *args: str, **kw: Any) -> subprocess.Popen[str]:
    env = dict(os.environ)
    if tree is not None:  # another tree's llmgw and llmgwd first on the path
        env["PYTHONPATH"] = f"{tree / 'src'}:{tree / 'llmgwd' / 'src'}"
    return subprocess.Popen([sys.executable, str(HERE), *args], env=env, text=True,
                            stdout=subprocess.PIPE, **kw)  # fmt: skip


def _result(out: str) -> dict[str, Any]:
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise SystemExit(f"a child reported nothing:\n{out}")
    return cast(dict[str, Any], json.loads(lines[-1].removeprefix("RESULT ")))


def measure(tree: Path | None, state_dir: Path, work: Path) -> dict[str, dict[str, Any]]:
    """One backup and one restore of the store in state_dir with tree's code."""
    sock, fresh, file = str(work / "d.sock"), work / "fresh", work / "cluster.backup"
    phrase = work / "phrase"
    phrase.write_text(PHRASE + "\n")
    server = _child(tree, "serve", str(state_dir), sock, str(fresh), stdin=subprocess.PIPE)
    assert server.stdout is not None and server.stdin is not None
    if server.stdout.readline().strip() != "ready":
        raise SystemExit("llmgwd's API did not start")
    got: dict[str, dict[str, Any]] = {}
    try:
        args = ["--socket", sock, "backup", str(file), "--passphrase-file", str(phrase)]
        out, _ = _child(tree, "cli", *args).communicate()
        got["backup"] = _result(out)
    finally:
        server.stdin.close()
        got["llmgwd"] = _result(server.stdout.read())
        server.wait()
    got["file"] = {"bytes": file.stat().st_size}
    out, _ = _child(tree, "restore", str(file), str(phrase), str(fresh)).communicate()
    got["restore"] = _result(out)
    return got


def _mib(kib: int) -> str:
    return f"{kib / 1024:7.0f}"


def _print(mb: int, db_bytes: int, runs: dict[str, dict[str, dict[str, Any]]]) -> None:
    print(f"\nstore of usage rows: state.db {db_bytes / 1e6:.0f} MB")
    print(f"{'tree':>8} {'process':>15} {'peak MiB':>9} {'at start':>9} {'grew':>7} {'s':>6}")
    for tree, got in runs.items():
        for who in ("llmgwd", "backup", "restore"):
            r = got[who]
            grew = (r["peak_kib"] - r["before_kib"]) / 1024
            s = f"{r['seconds']:6.1f}" if "seconds" in r else "      "
            print(f"{tree:>8} {r['who']:>15} {_mib(r['peak_kib']):>9} "
                  f"{_mib(r['before_kib']):>9} {grew:7.0f} {s}")  # fmt: skip
    if len(runs) == 2:
        (a, before), (b, after) = runs.items()
        for who in ("llmgwd", "backup", "restore"):
            ratio = before[who]["peak_kib"] / after[who]["peak_kib"]
            print(f"  {who}: peak {a} / {b} = {ratio:.1f}x")


def _tree(rev: str, into: Path) -> Path:
    """REV's src and llmgwd/src (git archive: the repository untouched)."""
    into.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src", "llmgwd/src"],
                             check=True, capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,200", help="store sizes in MB (state.db)")
    parser.add_argument("--before", help="a git revision to measure too (the old way)")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-backup-") as tmp:
        base = Path(tmp)
        trees: dict[str, Path | None] = {"this": None}
        if opts.before:
            trees = {opts.before[:8]: _tree(opts.before, base / "before"), "this": None}
        for mb in (int(s) for s in opts.sizes.split(",")):
            state = base / f"store-{mb}"
            state.mkdir()
            asyncio.run(_fill(state, mb))
            runs = {}
            for name, tree in trees.items():
                work = base / f"run-{mb}-{name}"
                work.mkdir()
                runs[name] = measure(tree, state, work)
            _print(mb, (state / "state.db").stat().st_size, runs)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "cli":
        cli(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "restore":
        restore(sys.argv[2], sys.argv[3], Path(sys.argv[4]))
    else:
        main()
