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


_PROJECT = GRAPH.parent


def _calls_of(folder: str, names: tuple[str, ...]) -> list[tuple[str, ast.Call]]:
    """Calls of the functions ``names`` by their bare name in the modules of ``folder``."""
    found: list[tuple[str, ast.Call]] = []
    for path in sorted((_PROJECT / folder).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
                found.append((f"{folder}/{path.name}:{node.lineno}", node))
    return found


def test_every_single_and_rows_call_names_the_row_type_of_its_statement() -> None:
    """``single(tx, QUERY, Row, ...)`` and ``rows(...)``: the third positional argument is the
    TypedDict of the statement's RETURN clause (a class, not a string or a splat), so every
    record read in graph/ and services/ has a declared shape (pyright checks the rest)."""
    calls = [c for folder in ("graph", "services") for c in _calls_of(folder, ("single", "rows"))]
    untyped = [
        where
        for where, call in calls
        if len(call.args) < 3
        or any(isinstance(a, ast.Starred) for a in call.args[:3])
        or not isinstance(call.args[2], ast.Name | ast.Attribute | ast.Subscript)
    ]
    assert untyped == []
    assert len(calls) > 100  # the walk saw the calls


def test_no_graph_function_returns_an_untyped_dict() -> None:
    """Graph functions return their rows' TypedDicts; ``dict[str, Any]`` stays only for the
    parameters a statement is given (``_log_params``)."""
    loose: list[str] = []
    for path in sorted(GRAPH.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and node.returns is not None
                and "dict[str, Any]" in ast.unparse(node.returns)
                and node.name != "_log_params"
            ):
                loose.append(f"{path.name}:{node.lineno} {node.name}")
    assert loose == []
