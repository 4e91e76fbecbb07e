"""llmgw: shared package of wire messages, config, PKI and the CLI."""

from __future__ import annotations


def package_version() -> str:
    """The release these packages were built from: the `llmgw` distribution's version, the one
    source that `llmgw --version`, `llmgwd --version`, `llmgw-agentd --version`, /api/v1 and
    the agent's Register all read (the three packages are built together at one version)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llmgw")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "0+unknown"
