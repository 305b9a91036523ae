"""``botmemory import-legacy`` reads its file strictly: a line of another shape is refused with its
number before anything is imported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from botmemory import cli
from services import maintenance


def test_legacy_lines_are_read_strictly_and_refused_by_number(tmp_path: Path) -> None:
    good = {"content": "Ann lived in Oslo", "tags": ["home", "for:bot"], "layer": "observation"}
    path = tmp_path / "legacy.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps({"content": "plain"}) + "\n")
    read = cli._read_legacy(str(path))  # pyright: ignore[reportPrivateUsage]
    # By line number (the blank line 2 skipped): the import prints each line's new entry id.
    assert [(n, e.content, e.tags, e.layer) for n, e in read.items()] == [
        (1, "Ann lived in Oslo", ("home", "for:bot"), "observation"),
        (3, "plain", (), "fact"),
    ]
    for bad in (
        {"content": "x", "tags": "work"},  # was read as the tags w, o, r and k
        {"content": "x", "tags": [1]},
        {"content": 5},
        {"tags": ["a"]},
        [1, 2],
        # A misspelt key was dropped: a private pinned entry lost its author's rule for good.
        {"content": "x", "tag": ["for:person:u1"], "layer": "pinned"},
        {"content": "x" * 4001},  # said which line, not only that some content was too long
        {"content": "\u0000"},
        {"content": "x", "tags": ["a" * 201]},
        {"content": "x", "tags": [""]},
        {"content": "x", "tags": ["for:person:u1\u0000"]},
    ):
        path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(cli.CommandFailed) as refused:
            cli._read_legacy(str(path))  # pyright: ignore[reportPrivateUsage]
        assert refused.value.code == "BAD_INPUT" and refused.value.message.startswith("line 2:"), bad
    # A key given twice kept its last value, quietly.
    path.write_text('{"content": "x", "layer": "pinned", "layer": "fact"}\n')
    with pytest.raises(cli.CommandFailed) as refused:
        cli._read_legacy(str(path))  # pyright: ignore[reportPrivateUsage]
    assert refused.value.message.startswith("line 1:")
    # A layer in any case: "Pinned" was read as a fact (hidden, V9), its author's rule lost.
    path.write_text(json.dumps({"content": "x", "layer": " Pinned"}) + "\n")
    assert [e.layer for e in cli._read_legacy(str(path)).values()] == ["pinned"]  # pyright: ignore[reportPrivateUsage]
    # A layer of no such name: stored as a fact before, quietly (a typo of "pinned" hid the
    # entry for good, V9). Refused by its line, as other bad lines are.
    path.write_text(json.dumps(good) + "\n" + json.dumps({"content": "x", "layer": "banana"}) + "\n")
    with pytest.raises(cli.CommandFailed) as refused:
        cli._read_legacy(str(path))  # pyright: ignore[reportPrivateUsage]
    assert (refused.value.code, refused.value.message) == (
        "BAD_INPUT",
        "line 2: layer is fact, observation or pinned",
    )
    path.write_text("{not json\n")
    with pytest.raises(cli.CommandFailed):
        cli._read_legacy(str(path))  # pyright: ignore[reportPrivateUsage]


def test_a_legacy_file_holds_so_many_entries_of_so_many_tags(tmp_path: Path) -> None:
    """One import is one change in one transaction, its entries numbered within its version
    (a million lines overlapped the next versions' memory order), and a line's tags were not
    counted: a file past MAX_LEGACY_ENTRIES is refused at the line past it, and a line of more
    than MAX_LEGACY_TAGS tags by its number."""
    path = tmp_path / "legacy.jsonl"
    line = json.dumps({"content": "x"}) + "\n"
    path.write_text(line * maintenance.MAX_LEGACY_ENTRIES + "\n")
    assert len(cli._read_legacy(str(path))) == maintenance.MAX_LEGACY_ENTRIES  # pyright: ignore[reportPrivateUsage]
    path.write_text(line * maintenance.MAX_LEGACY_ENTRIES + "\n" + line)
    with pytest.raises(cli.CommandFailed) as refused:
        cli._read_legacy(str(path))  # pyright: ignore[reportPrivateUsage]
    assert refused.value.message.startswith(
        f"line {maintenance.MAX_LEGACY_ENTRIES + 2}: a file holds at most"
    )
    tags = [f"t{i}" for i in range(maintenance.MAX_LEGACY_TAGS)]
    path.write_text(json.dumps({"content": "x", "tags": tags}) + "\n")
    assert len(cli._read_legacy(str(path))[1].tags) == maintenance.MAX_LEGACY_TAGS  # pyright: ignore[reportPrivateUsage]
    path.write_text(
        json.dumps({"content": "x"}) + "\n" + json.dumps({"content": "x", "tags": [*tags, "one more"]}) + "\n"
    )
    with pytest.raises(cli.CommandFailed) as refused:
        cli._read_legacy(str(path))  # pyright: ignore[reportPrivateUsage]
    assert refused.value.message == f"line 2: at most {maintenance.MAX_LEGACY_TAGS} tags"
