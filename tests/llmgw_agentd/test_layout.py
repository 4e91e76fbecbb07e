"""The agent's two directories: state in /var/lib/llmgw-agent, cache (world-readable) in
/var/cache/llmgw-agent, the same in its unit, tmpfiles.d, packages, settings and pages; and
a node upgraded from the layout before finds its models, engines and builds in the cache."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from llmgw.config import AgentConfig, Engines
from llmgw_agentd import layout
from llmgw_agentd.engines import llamacpp

REPO = Path(__file__).resolve().parents[2]
OLD_NAMES = ("/var/lib/llmgw-agentd", "/var/cache/llmgw/", "/var/cache/llmgw ")


def old_layout(root: Path) -> dict[str, Path]:
    """A node's directories as the layout before left them: a model file and a set's relative
    link to it, a vLLM environment, a llama-server build."""
    models, engines, builds = root / "lib/models", root / "lib/engines", root / "cache/llama.cpp"
    (models / "blobs").mkdir(parents=True)
    (models / "blobs" / "ab12").write_text("weights")
    (models / "sets" / "org--repo").mkdir(parents=True)
    (models / "sets" / "org--repo" / "model.gguf").symlink_to("../../blobs/ab12")
    (engines / "vllm-0.32.0" / "bin").mkdir(parents=True)
    (engines / "vllm-0.32.0" / "bin" / "python").write_text("#!")
    (builds / "11434.0.0-x86_64-noamx").mkdir(parents=True)
    (builds / "11434.0.0-x86_64-noamx" / "llama-server").write_text("ELF")
    return {"models": models, "engines": engines, "llama.cpp": builds}


@pytest.fixture
def upgraded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Path], Path]:
    """The old layout under tmp_path/old, the new cache at tmp_path/cache/llmgw-agent."""
    old = old_layout(tmp_path / "old")
    cache = tmp_path / "cache" / "llmgw-agent"
    monkeypatch.setattr(layout, "OLD_MODELS", old["models"])
    monkeypatch.setattr(layout, "OLD_ENGINES", old["engines"])
    monkeypatch.setattr(layout, "OLD_BUILDS", old["llama.cpp"])
    monkeypatch.setattr(layout, "CACHE", cache)
    return old, cache


def config_in(cache: Path) -> AgentConfig:
    """The defaults, their cache moved under cache as the default one would be."""
    return AgentConfig(
        models_dir=str(cache / "models"), engines=Engines(dir=str(cache / "engines"))
    )


def test_an_upgraded_node_finds_its_files_in_the_new_cache_and_under_the_old_paths(
    upgraded: tuple[dict[str, Path], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    old, cache = upgraded
    monkeypatch.setattr(layout, "moves", lambda c: [(old[n], cache / n) for n in old])
    layout.adopt_old(config_in(cache))
    assert (cache / "models" / "sets" / "org--repo" / "model.gguf").read_text() == "weights"
    assert (cache / "engines" / "vllm-0.32.0" / "bin" / "python").read_text() == "#!"
    assert (cache / "llama.cpp" / "11434.0.0-x86_64-noamx" / "llama-server").read_text() == "ELF"
    assert not (cache / "models").is_symlink()  # moved, not copied nor linked
    # an engine started before the upgrade names its model by the old path: it still opens
    assert (old["models"] / "sets" / "org--repo" / "model.gguf").read_text() == "weights"
    assert all(old[n].resolve() == cache / n for n in old)
    layout.adopt_old(config_in(cache))  # the next start: nothing more to do
    assert [layout.adopt(old[n], cache / n) for n in old] == ["nothing"] * 3


def test_across_filesystems_the_old_directory_is_read_where_it_is(
    upgraded: tuple[dict[str, Path], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    old, cache = upgraded

    def exdev(src: object, dst: object) -> None:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(os, "rename", exdev)
    assert layout.adopt(old["models"], cache / "models") == "linked"
    assert (cache / "models" / "sets" / "org--repo" / "model.gguf").read_text() == "weights"
    assert (cache / "models").resolve() == old["models"] and not old["models"].is_symlink()


def test_a_directory_agent_yaml_names_is_not_moved() -> None:
    site = AgentConfig(models_dir="/srv/models", engines=Engines(dir="/srv/engines"))
    assert [new for _, new in layout.moves(site)] == [layout.CACHE / "llama.cpp"]
    assert {str(new) for _, new in layout.moves(AgentConfig())} == {
        "/var/cache/llmgw-agent/llama.cpp",
        "/var/cache/llmgw-agent/models",
        "/var/cache/llmgw-agent/engines",
    }


def test_the_unit_tmpfiles_packages_settings_and_pages_name_the_same_two_directories() -> None:
    defaults = AgentConfig()
    assert defaults.state_dir == "/var/lib/llmgw-agent"
    assert defaults.models_dir.startswith("/var/cache/llmgw-agent/")
    assert defaults.engines.dir.startswith("/var/cache/llmgw-agent/")
    assert llamacpp.SYSTEM_CACHE == layout.CACHE == Path("/var/cache/llmgw-agent")
    unit = (REPO / "units" / "llmgw-agentd.service").read_text().splitlines()
    for line in ("StateDirectory=llmgw-agent", "StateDirectoryMode=0750",
                 "CacheDirectory=llmgw-agent", "CacheDirectoryMode=0755"):  # fmt: skip
        assert line in unit
    assert (
        "d /var/cache/llmgw-agent 0755 root root -"
        in (REPO / "units" / "llmgw.tmpfiles.conf").read_text().splitlines()
    )
    assert (
        "%dir %attr(0755,root,root) /var/cache/llmgw-agent"
        in (REPO / "rpm" / "llmgw.spec").read_text().splitlines()
    )
    for page in ("man/llmgw-agentd.8", "man/llmgw.yaml.5", "units/llmgw.tmpfiles.conf"):
        text = (REPO / page).read_text().replace("\\-", "-")
        assert "/var/cache/llmgw-agent" in text
        # a file the page lists, a default or a directory made: never an old place
        named = [line for line in text.splitlines() if line.startswith((".I ", "\\fB", "d "))]
        assert not [line for line in named for old in OLD_NAMES if old in line + " "], page
