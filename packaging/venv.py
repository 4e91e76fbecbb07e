#!/usr/bin/env python3
"""Build llmgw's private Python environment from uv.lock, and split it into the packages.

Run at package build time by debian/rules and rpm/llmgw.spec (never at install time):

    packaging/venv.py --dest DESTDIR --lists DIR [--python /usr/bin/python3.11]
                      [--python-version 3.11] [--glibc 2.36] [--compile]

It lays out DESTDIR/usr/lib/llmgw/venv as a venv of the target's system Python:
pyvenv.cfg, bin/python3 -> that interpreter, lib/pythonX.Y/site-packages with the locked
third-party wheels (`uv export --frozen --no-dev`, hashes checked, wheels only) and the
workspace's own three wheels, all installed with --no-deps; bin/uv (the uv wheel's binary,
which the agent installs engines with); and the commands
DESTDIR/usr/bin/{llmgw,llmgwd,llmgw-agentd}. The target interpreter need
not exist here: wheels are chosen for --python-version and --glibc, so one build host can
make the environment for another distribution's Python (Ubuntu 24.04's 3.12, say).

Then it writes DIR/<package>.files for the packages llmgw, llmgwd and llmgw-agentd: what
the CLI needs, and every distribution both daemons need, goes in llmgw; a distribution
only one daemon needs goes in that daemon's package. Each list holds absolute paths, with
`%dir PATH` lines for the directories a package must own (rpm's %files -f format; the
deb side strips those lines).
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PREFIX = "/usr/lib/llmgw/venv"
PACKAGES = ("llmgw", "llmgwd", "llmgw-agentd")
# Binaries a wheel installs as scripts that are kept, in the environment's bin/, by the
# distribution that ships them: the agent installs engines with its own uv (no distribution
# packages uv), which the uv module finds at sys.prefix/bin/uv.
KEPT_SCRIPTS = {"uv": "uv"}
# The commands, each in the package of the distribution that defines it.
ENTRY_POINTS = {
    "llmgw": ("llmgw", "llmgw.cli.main"),
    "llmgwd": ("llmgwd", "llmgwd.main"),
    "llmgw-agentd": ("llmgw-agentd", "llmgw_agentd.main"),
}
# A shell wrapper rather than a Python script naming the environment's interpreter:
# Debian's policy (and lintian) wants /usr/bin scripts on /usr/bin/python3. -I: a daemon's
# (or root's) PYTHONPATH, PYTHONHOME and user site never reach this Python. argv[0] is the
# command's name, which click shows in usage and derives _LLMGW_COMPLETE from.
SCRIPT = """\
#!/bin/sh
# {command}: installed by the {package} package; runs in llmgw's private Python environment.
exec {prefix}/bin/python3 -I -c 'import sys; sys.argv[0] = "{command}"
from {module} import main
sys.exit(main())' "$@"
"""


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def uv(*args: str, capture: bool = False) -> str:
    """Run uv in the checkout; its complaint ends the build."""
    exe = os.environ.get("UV", "uv")
    r = subprocess.run(
        [exe, *args], cwd=REPO, text=True, check=False,
        stdout=subprocess.PIPE if capture else None,
    )  # fmt: skip
    if r.returncode != 0:
        sys.exit(f"venv.py: {exe} {' '.join(args)} exited {r.returncode}")
    return r.stdout if capture else ""


def closure(package: str) -> set[str]:
    """The names of every distribution package needs at run time, per uv.lock."""
    text = uv("export", "--frozen", "--no-dev", "--package", package, "--no-hashes",
              "--no-header", "--no-annotate", "--no-editable", capture=True)  # fmt: skip
    names = set()
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("./", ".")):  # a workspace member, by path
            names.add(canonical(Path(line.split(";")[0].strip()).resolve().name))
            continue
        names.add(canonical(re.split(r"[=<>~!; \[]", line, maxsplit=1)[0]))
    names.add(canonical(package))
    return names


def owners() -> dict[str, str]:
    """Which package ships each distribution (canonical name -> package)."""
    cli, daemon, agent = (closure(p) for p in PACKAGES)
    shared = cli | (daemon & agent)
    owner = dict.fromkeys(shared, "llmgw")
    owner.update(dict.fromkeys(daemon - shared, "llmgwd"))
    owner.update(dict.fromkeys(agent - shared, "llmgw-agentd"))
    # A workspace wheel keeps its own name even when another package depends on it.
    owner.update({canonical(p): p for p in PACKAGES})
    return owner


def default_glibc() -> str:
    """This host's glibc as X.Y: the build host is the target unless told otherwise."""
    _, version = platform.libc_ver()
    if not version:
        sys.exit("venv.py: not a glibc host; give --glibc X.Y")
    return ".".join(version.split(".")[:2])


def install(site: Path, python_version: str, glibc: str, work: Path) -> None:
    """The locked wheels, then the workspace's own, into site (no resolution, no sdists)."""
    reqs = work / "requirements.txt"
    text = uv("export", "--frozen", "--no-dev", "--all-packages", "--no-emit-workspace",
              "--no-header", "--no-annotate", capture=True)  # fmt: skip
    reqs.write_text(text)
    wheels = work / "wheels"
    for p in PACKAGES:
        uv("build", "--quiet", "--wheel", "--package", p, "--out-dir", str(wheels))
    target = ["--target", str(site), "--python-version", python_version,
              "--python-platform", f"{platform.machine()}-manylinux_{glibc.replace('.', '_')}",
              "--no-deps", "--no-build", "--quiet",
              "--link-mode", "copy"]  # fmt: skip
    uv("pip", "install", *target, "--require-hashes", "-r", str(reqs))
    uv("pip", "install", *target, *sorted(str(w) for w in wheels.glob("*.whl")))
    # Console scripts written by the installer name this host's Python: ours replace them.
    # A wheel's own binaries named in KEPT_SCRIPTS move to the environment's bin/.
    venv_bin = site.parents[2] / "bin"
    venv_bin.mkdir(parents=True, exist_ok=True)
    for name in KEPT_SCRIPTS:
        if not (site / "bin" / name).is_file():
            sys.exit(f"venv.py: the {KEPT_SCRIPTS[name]} wheel installed no bin/{name}")
        shutil.move(site / "bin" / name, venv_bin / name)
    shutil.rmtree(site / "bin", ignore_errors=True)
    (site / ".lock").unlink(missing_ok=True)  # uv's lock on the target directory


def skeleton(root: Path, python: str, python_version: str) -> None:
    """pyvenv.cfg, the interpreter links and the commands."""
    venv = root / PREFIX.lstrip("/")
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "pyvenv.cfg").write_text(
        f"home = {os.path.dirname(python)}\n"
        "include-system-site-packages = false\n"
        f"version = {python_version}\n"
    )
    for name, target in (("python3", python), ("python", "python3")):
        link = venv / "bin" / name
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    for package, (command, module) in ENTRY_POINTS.items():
        script = root / "usr/bin" / command
        script.write_text(
            SCRIPT.format(prefix=PREFIX, command=command, package=package, module=module)
        )
        script.chmod(0o755)


def record_files(site: Path) -> dict[str, set[Path]]:
    """Each installed distribution's files (its RECORD and its dist-info), by name."""
    found: dict[str, set[Path]] = {}
    for info in site.glob("*.dist-info"):
        name = canonical(info.name.removesuffix(".dist-info").rsplit("-", 1)[0])
        files = {p for p in info.rglob("*") if not p.is_dir()}
        with (info / "RECORD").open(newline="") as f:
            for row in csv.reader(f):
                if row:
                    path = (site / row[0]).resolve()
                    if path.is_file() and site in path.parents:
                        files.add(path)
        found[name] = files
    return found


def compile_all(root: Path, python: str) -> None:
    """Byte-compile site-packages with the target Python, naming the installed paths."""
    lib = root / PREFIX.lstrip("/") / "lib"
    subprocess.run(
        [python, "-m", "compileall", "-q", "-j0", "-s", str(root), "-p", "/", str(lib)],
        check=True,
    )


def split(root: Path, lists: Path) -> None:
    """Write lists/<package>.files, every file of the environment in exactly one."""
    venv = root / PREFIX.lstrip("/")
    site = next((venv / "lib").glob("python3.*/site-packages"))
    owner = owners()
    by_file: dict[Path, str] = {}
    for name, files in record_files(site).items():
        if name not in owner:
            sys.exit(f"venv.py: {name} is installed but no package of uv.lock needs it")
        for f in files:
            by_file[f] = owner[name]
    assigned: dict[str, set[Path]] = {p: set() for p in PACKAGES}
    commands = [root / "usr/bin" / c for c, _ in ENTRY_POINTS.values()]
    for path in sorted([*venv.rglob("*"), *commands]):
        if path.is_dir() and not path.is_symlink():
            continue
        pkg = by_file.get(path)
        if pkg is None and path.parent.name == "__pycache__":
            # X.cpython-311.pyc belongs with X.py.
            source = path.parent.parent / (path.name.split(".", 1)[0] + ".py")
            pkg = by_file.get(source)
        if pkg is None and path in commands:
            pkg = path.name
        if pkg is None and path.parent == venv / "bin" and path.name in KEPT_SCRIPTS:
            pkg = owner[canonical(KEPT_SCRIPTS[path.name])]
        if pkg is None and site not in path.parents:
            pkg = "llmgw"  # pyvenv.cfg, the interpreter links
        if pkg is None:
            sys.exit(f"venv.py: {path.relative_to(root)} belongs to no distribution")
        assigned[pkg].add(path)
    lists.mkdir(parents=True, exist_ok=True)
    for pkg, files in assigned.items():
        dirs = {d for f in files for d in f.parents if venv in d.parents or d == venv}
        if pkg == "llmgw":
            dirs.add(venv.parent)  # /usr/lib/llmgw
        lines = [f"%dir /{d.relative_to(root)}" for d in sorted(dirs)]
        lines += [f"/{f.relative_to(root)}" for f in sorted(files)]
        (lists / f"{pkg}.files").write_text("\n".join(lines) + "\n")


def tidy(root: Path) -> None:
    """Modes a package should carry: no group/world write, no stray executable bits."""
    for path in (root / PREFIX.lstrip("/")).rglob("*"):
        if path.is_symlink():
            continue
        mode = stat.S_IMODE(path.stat().st_mode) & ~0o022
        library = path.suffix == ".so" or ".so." in path.name
        if path.is_file() and not library and path.parent.name != "bin":
            mode &= ~0o111
        path.chmod(mode | (0o755 if path.is_dir() else 0))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dest", type=Path, required=True, help="the staging root (DESTDIR)")
    p.add_argument("--lists", type=Path, required=True, help="where <package>.files go")
    p.add_argument("--python", default="", help="the target's interpreter [/usr/bin/python3.X]")
    p.add_argument("--python-version", default="", help="X.Y [that of --python, or this host's]")
    p.add_argument("--glibc", default="", help="the target's glibc X.Y [this host's]")
    p.add_argument("--compile", action="store_true", help="byte-compile (needs --python here)")
    a = p.parse_args()
    version = a.python_version
    if not version and a.python and os.access(a.python, os.X_OK):
        version = subprocess.run(
            [a.python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    version = version or "{}.{}".format(*sys.version_info[:2])
    python = a.python or f"/usr/bin/python{version}"
    root = a.dest.resolve()
    venv = root / PREFIX.lstrip("/")
    if venv.exists():
        shutil.rmtree(venv)
    site = venv / "lib" / f"python{version}" / "site-packages"
    site.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="llmgw-venv.") as work:
        install(site, version, a.glibc or default_glibc(), Path(work))
    skeleton(root, python, version)
    tidy(root)
    if a.compile:
        compile_all(root, python)
    split(root, a.lists.resolve())
    print(f"venv.py: {PREFIX} for Python {version} ({python}) in {root}", file=sys.stderr)


if __name__ == "__main__":
    main()
