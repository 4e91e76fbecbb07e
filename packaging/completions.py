#!/usr/bin/env python3
"""Write llmgw's bash and zsh completion scripts: what `_LLMGW_COMPLETE=bash_source llmgw`
(and zsh_source) prints.

    packaging/completions.py SITE_PACKAGES OUTDIR    -> OUTDIR/llmgw (bash), OUTDIR/_llmgw (zsh)

click's script is a fixed template of the program's name: it calls `llmgw` back for each
completion, so it never goes stale as commands change. Only click (pure Python) is imported
from SITE_PACKAGES, so this runs with the build host's Python even when the environment
was made for another version (a cross build for Ubuntu's 3.12).
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    site, out = Path(sys.argv[1]), Path(sys.argv[2])
    sys.path.insert(0, str(site))
    import click
    from click.shell_completion import get_completion_class

    out.mkdir(parents=True, exist_ok=True)
    for shell, name in (("bash", "llmgw"), ("zsh", "_llmgw")):
        cls = get_completion_class(shell)
        assert cls is not None
        source = cls(click.Command("llmgw"), {}, "llmgw", "_LLMGW_COMPLETE").source()
        (out / name).write_text(source if source.endswith("\n") else source + "\n")


if __name__ == "__main__":
    main()
