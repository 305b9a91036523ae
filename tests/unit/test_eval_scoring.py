"""The eval's summary line: candidate recall, its ceiling and the share within the ceiling."""

from __future__ import annotations

from eval.scoring import HEADER, QuestionRow, line


def row(index: int, *, offered: bool, held: bool) -> QuestionRow:
    return QuestionRow(
        "conv-x", "group", index, 4, "q?", "a", ("D1:1",), ("e1",), 400, offered, held, None, None, None, ()
    )


def test_within_the_ceiling_counts_only_the_questions_the_memory_holds_an_answer_for() -> None:
    rows = [
        row(0, offered=True, held=True),
        row(1, offered=True, held=True),
        row(2, offered=False, held=True),
        row(3, offered=False, held=False),  # no entry rests on its evidence: outside the ceiling
    ]
    cells = [c.strip() for c in line("conv-x", "**1–4**", rows).strip("|").split("|")]
    columns = [c.strip() for c in HEADER.splitlines()[0].strip("|").split("|")]
    assert len(cells) == len(columns)
    by = dict(zip(columns, cells, strict=True))
    assert by["candidate recall"] == "50.0 %"
    assert by["ceiling"] == "75.0 %"
    assert by["candidate recall within the ceiling"] == "66.7 %"
    alone = [
        c.strip() for c in line("conv-x", "1", [row(3, offered=False, held=False)]).strip("|").split("|")
    ]
    assert dict(zip(columns, alone, strict=True))["candidate recall within the ceiling"] == "–"  # none held
