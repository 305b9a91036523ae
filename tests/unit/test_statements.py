"""Typed Cypher (issue 15): the snapshot of every composed statement is current, and each one is a
constant whose text is fixed at import."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from graph import snapshot

GRAPH = Path(snapshot.__file__).parent


def test_statement_snapshot_is_current() -> None:
    """Regenerate with `python -m graph.snapshot` when a statement changes on purpose."""
    assert snapshot.SNAPSHOT.read_text() == snapshot.render()


def test_no_statement_is_assembled_with_an_f_string_or_format() -> None:
    offenders: list[str] = []
    for path in sorted(GRAPH.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.JoinedStr) and any(
                isinstance(v, ast.Constant) and any(w in str(v.value) for w in ("MATCH", "RETURN", "WHERE"))
                for v in node.values
            ):
                offenders.append(f"{path.name}:{node.lineno} f-string")
            if isinstance(node, ast.Attribute) and node.attr == "format":
                offenders.append(f"{path.name}:{node.lineno} .format")
    assert offenders == []


def test_every_statement_constant_is_final_literal_string() -> None:
    """Module-level string constants are annotated ``Final[LiteralString]``, so a ``str`` built at
    run time cannot become a statement (pyright refuses it, and ``single``/``rows`` take only
    ``LiteralString``)."""
    loose: list[str] = []
    for path in sorted(GRAPH.glob("*.py")):
        module = importlib.import_module(f"graph.{path.stem}")
        for node in ast.parse(path.read_text()).body:
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(getattr(module, node.target.id, None), str)
                and ast.unparse(node.annotation) != "Final[LiteralString]"
            ):
                loose.append(f"{path.name}:{node.lineno} {node.target.id}: {ast.unparse(node.annotation)}")
    assert loose == []
    assert len(snapshot.statements()) > 100  # the walk above saw the statements
