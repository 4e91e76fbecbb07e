"""No function in the daemons, the CLI or the shared library runs over about 60 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("src/llmgw", "llmgwd/src/llmgwd", "llmgw-agentd/src/llmgw_agentd")
# "About 60": a few lines of slack for a long signature or docstring, no more.
LONGEST = 64


def long_functions(folders: list[Path]) -> list[str]:
    """Each function over LONGEST lines in the folders' Python files, as path:line name."""
    found = []
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > LONGEST:
                        found.append(f"{path.name}:{node.lineno} {node.name}: {lines} lines")
    return found


def test_no_function_runs_over_about_60_lines() -> None:
    assert long_functions([ROOT / s for s in SOURCES]) == []


def test_a_long_method_is_found(tmp_path: Path) -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(LONGEST))
    (tmp_path / "m.py").write_text(f"class C:\n    async def f(self) -> None:\n{body}\n")
    (tmp_path / "short.py").write_text("def g() -> int:\n    return 1\n")
    assert long_functions([tmp_path]) == [f"m.py:2 f: {LONGEST + 1} lines"]
