"""The man pages: llmgw(1) and llmgw.yaml(5) are what man/gen.py makes of the CLI and
config.py now, every daemon option is on its page, every command llmgw-cluster(7) names
exists, and every page lints clean."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess
from pathlib import Path

import click
import pytest

from llmgw import config
from llmgw.cli.main import main as cli
from man import gen

MAN = Path(gen.__file__).resolve().parent
PAGES = sorted(MAN.glob("*.[1578]"))


@pytest.mark.parametrize("name", sorted(gen.PAGES))
def test_generated_page_is_current(name: str) -> None:
    assert (MAN / name).read_text() == gen.PAGES[name](), (
        f"man/{name} is stale: run .venv/bin/python man/gen.py and commit it"
    )


def test_every_command_and_option_is_on_llmgw_1() -> None:
    page = (MAN / "llmgw.1").read_text()
    ctx = click.Context(cli, info_name="llmgw")
    seen = 0
    for cmd, sub in gen.commands(cli, ctx):
        assert f'.SS "{sub.command_path}"' in page
        for param in cmd.get_params(sub):
            if isinstance(param, click.Option):
                for opt in param.opts:
                    assert gen.esc(opt) in page, f"{sub.command_path} {opt}"
        seen += 1
    assert seen >= 15  # the tree was walked, not skipped


def test_every_setting_has_a_description() -> None:
    found = [s for cls, p in ((config.ServerConfig, "server"), (config.AgentConfig, "agent"))
             for s in gen.settings(cls, p)]  # fmt: skip
    ids = {s[0] for s in found}
    for setting, _dotted, _kind, _default, comment in found:
        assert gen.SETTINGS.get(setting) or comment, f"{setting}: no description"
    assert set(gen.SETTINGS) <= ids, f"no such settings: {set(gen.SETTINGS) - ids}"
    # Nested sections are walked, and named by their dotted key (llama.cpp as YAML spells it).
    assert {"agent.engines.llama.cpp.binary", "server.client.listen"} <= ids


def _named_commands(page: str) -> list[list[str]]:
    """The words after each `llmgw` a page shows in bold or in an example."""
    text = re.sub(r"\\f[BIRP]", "", page).replace("\\-", "-")
    named = re.findall(r"(?m)^llmgw((?: [a-z][a-z-]*)+)", text)
    named += re.findall(r"\\fBllmgw((?: [a-z][a-z-]*)+)", page.replace("\\-", "-"))
    return [words.split() for words in named]


def test_every_command_llmgw_cluster_7_names_exists() -> None:
    named = _named_commands((MAN / "llmgw-cluster.7").read_text())
    assert len(named) >= 20  # the page was read, not skipped
    for words in named:
        cmd: click.Command = cli
        ctx = click.Context(cli, info_name="llmgw")
        for word in words:  # down the groups; a command's arguments follow it
            if not isinstance(cmd, click.Group):
                break
            sub = cmd.get_command(ctx, word)
            assert sub is not None, f"llmgw-cluster(7) names llmgw {' '.join(words)}"
            cmd, ctx = sub, click.Context(sub, info_name=word, parent=ctx)
        assert not isinstance(cmd, click.Group), f"llmgw {' '.join(words)}: a group"


def _daemon_options(main: object) -> set[str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["--help"])  # type: ignore[operator]
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", out.getvalue()))


@pytest.mark.parametrize("daemon", ["llmgwd", "llmgw-agentd"])
def test_every_daemon_option_is_on_its_page(daemon: str) -> None:
    if daemon == "llmgwd":
        from llmgwd.main import main
    else:
        from llmgw_agentd.main import main
    page = (MAN / f"{daemon}.8").read_text()
    options = _daemon_options(main)
    assert "--config" in options
    for opt in options:
        assert gen.esc(opt) in page, f"{daemon}(8) lacks {opt}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_lints_clean(page: Path) -> None:
    linted = False
    if shutil.which("mandoc"):
        r = subprocess.run(["mandoc", "-T", "lint", str(page)], capture_output=True, text=True)
        assert (r.returncode, r.stdout + r.stderr) == (0, "")
        linted = True
    if shutil.which("groff"):
        r = subprocess.run(["groff", "-ww", "-man", "-Tutf8", "-z", str(page)],
                           capture_output=True, text=True)  # fmt: skip
        assert (r.returncode, r.stderr) == (0, "")
        linted = True
    if not linted:
        pytest.skip("neither mandoc nor groff is installed (apt-get install mandoc)")


def test_llmgwd_8_s_prometheus_config_is_one_promtool_accepts(tmp_path: Path) -> None:
    """llmgwd(8)'s sample scrape_config, as printed, with its token file made here."""
    if shutil.which("promtool") is None:
        pytest.skip("Debian's prometheus is not installed (apt-get install prometheus)")
    page = (MAN / "llmgwd.8").read_text()
    sample = re.search(r"\.EX\n(scrape_configs:\n.*?)\.EE\n", page, re.S)
    assert sample is not None, "llmgwd(8) has no Prometheus scrape_config"
    text = sample.group(1).replace("\\-", "-").replace("\\(aq", "'")
    assert text.count("credentials_file: /etc/prometheus/llmgw.token") == 2
    assert "metrics_path: /metrics/engines" in text
    token = tmp_path / "llmgw.token"
    token.write_text("metrics-llmgw-x\n")
    config = tmp_path / "prometheus.yml"
    config.write_text(text.replace("/etc/prometheus/llmgw.token", str(token)))
    r = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
