"""npm's oidc-provider (panva's, pinned in oidc_provider/package-lock.json) installed once under
~/.cache/llmgw/npm/ and run under Node on loopback for the sign-in tests, with the person's
side played through the provider's own forms (plain HTTP, a cookie jar of its own)."""

from __future__ import annotations

import fcntl
import hashlib
import http.cookiejar
import json
import os
import re
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

SOURCE = Path(__file__).parent / "oidc_provider"
VERSION = "8.8.1"  # oidc-provider's last major that runs on Debian 12's Node 18 (and on 20)
HOW = "needs node and npm on PATH (Debian: apt-get install nodejs npm)"


def installed() -> Path:
    """The provider's directory with its node_modules, made by npm ci once per lockfile."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip(HOW)
    lock = (SOURCE / "package-lock.json").read_bytes() + (SOURCE / "package.json").read_bytes()
    key = hashlib.sha256(lock).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    where = cache / "llmgw" / "npm" / f"oidc-provider-{VERSION}-{key}"
    where.mkdir(parents=True, exist_ok=True)
    with open(where / ".lock", "w") as lockfile:
        fcntl.flock(lockfile, fcntl.LOCK_EX)
        if not (where / "node_modules" / ".llmgw-done").exists():
            for name in ("package.json", "package-lock.json"):
                shutil.copyfile(SOURCE / name, where / name)
            args = [npm, "ci", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error"]
            subprocess.run(args, cwd=where, check=True, timeout=600)
            (where / "node_modules" / ".llmgw-done").touch()
        shutil.copyfile(SOURCE / "provider.mjs", where / "provider.mjs")
    return where


@contextmanager
def running(
    secret_file: Path,
    device_ttl_s: int = 600,
    interval_s: int = 1,
    redirect_uris: tuple[str, ...] = (),
) -> Iterator[str]:
    """The provider on 127.0.0.1 (its issuer URL), stopped at the end; redirect_uris: more
    than `llmgw login`'s loopback one (the console's callback)."""
    where = installed()
    env = os.environ | {
        "CLIENT_ID": "llmgw",
        "CLIENT_SECRET_FILE": str(secret_file),
        "DEVICE_TTL_S": str(device_ttl_s),
        "INTERVAL_S": str(interval_s),
        "REDIRECT_URIS": " ".join(redirect_uris),
    }
    proc = subprocess.Popen(
        ["node", str(where / "provider.mjs")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening "), f"the provider did not start: {line!r}"
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def put_account(issuer: str, sub: str, claims: dict[str, object]) -> None:
    """Make or change the provider's account sub (its claims, groups among them)."""
    req = urllib.request.Request(
        f"{issuer}/accounts/{urllib.parse.quote(sub)}",
        data=json.dumps(claims).encode(),
        method="PUT",
    )
    with urllib.request.urlopen(req) as resp:
        assert resp.status == 204


class Person:
    """A browser of the person's own: cookies kept, redirects followed."""

    def __init__(self) -> None:
        jar = urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        self._open = urllib.request.build_opener(jar).open

    def _go(self, url: str, form: dict[str, str] | None = None) -> tuple[str, str]:
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        with self._open(url, data=data, timeout=30) as resp:
            return resp.geturl(), resp.read().decode()

    def sign_in(self, url: str, sub: str) -> str:
        """Open a sign-in page (the authorization URL, or the device's after its code) and
        sign in as sub: the page the provider ends on."""
        page, _ = self._go(url)
        assert "/interaction/" in page, page
        return self._go(page, {"sub": sub})[1]

    def confirm_code(self, verification_uri: str, user_code: str, sub: str) -> str:
        """Enter the user code on the provider's device page, confirm it, and sign in."""
        form = {"xsrf": self._xsrf(verification_uri), "user_code": user_code}
        self._go(verification_uri, form)  # the page that asks to confirm
        form["confirm"] = "yes"
        page, _ = self._go(verification_uri, form)
        assert "/interaction/" in page, page
        return self._go(page, {"sub": sub})[1]

    def refuse_code(self, verification_uri: str, user_code: str) -> None:
        """Enter the user code and press the device page's abort."""
        form = {"xsrf": self._xsrf(verification_uri), "user_code": user_code, "abort": "yes"}
        try:
            self._go(verification_uri, form)
        except urllib.error.HTTPError as e:
            assert e.code == 400  # the provider's "aborted" page
            e.close()

    def _xsrf(self, verification_uri: str) -> str:
        _, html = self._go(verification_uri)
        found = re.search(r'name="xsrf" value="([^"]+)"', html)
        assert found, html
        return found.group(1)
