"""The eval's summary line: candidate recall, its ceiling and the share within the ceiling."""

from __future__ import annotations

import json

from eval.dataset import Question
from eval.locomo import target_line
from eval.scoring import HEADER, Learned, QuestionRow, line, score
from eval.scripted import Offer, mentioned
from tests.model_server import Recorded


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


def test_a_leak_is_any_entry_resting_on_the_other_chat_or_unknown_to_both_lists() -> None:
    mine = Learned("mem_a", "A likes tea.", frozenset({"chat_a"}), frozenset({"D1:1"}), True)
    both = Learned(
        "mem_ab", "They both like tea.", frozenset({"chat_a", "chat_b"}), frozenset({"D1:1"}), True
    )
    gone = Learned("mem_old", "A liked coffee.", frozenset({"chat_a"}), frozenset({"D1:1"}), False)
    entries = {e.id: e for e in (mine, both, gone)}
    question = Question(0, "What does A drink?", "tea", ("D1:1",), 4)
    offered = [Offer(i, "") for i in ("mem_a", "mem_ab", "mem_unknown")]
    found = score(
        "conv-x", "leak-check", question, offered, ("mem_a",), entries, ["mem_old"], frozenset({"chat_b"})
    )
    # One source in B's chat is enough; an id neither person lists cannot be vouched for.
    assert found.leaks == ("mem_ab", "mem_unknown")
    assert found.candidate_hit
    # The ceiling's pool is the active entries A may see: an invalidated one holds no answer.
    assert not found.ceiling_hit


def test_the_replay_leak_check_finds_entries_named_or_quoted_in_a_request() -> None:
    notes = json.dumps({"message": "hi", "notes": [{"id": "mem_1", "text": 'B said "no" to tea.'}]})
    rewrite = Recorded(
        "rewrite", "/v1/chat/completions", {}, {"messages": [{"role": "user", "content": notes}]}, 0
    )
    confide = Recorded(
        "confide",
        "/v1/chat/completions",
        {},
        {"messages": [{"role": "system", "content": "- B owns a boat."}]},
        0,
    )
    contents = {
        "mem_1": "nothing alike",
        "mem_2": 'B said "no" to tea.',
        "mem_3": "B owns a boat.",
        "mem_4": "x y",
    }
    # mem_1 by id, mem_2 quoted inside the JSON notes (escaped there), mem_3 in a system prompt.
    assert mentioned([rewrite, confide], contents) == {"mem_1", "mem_2", "mem_3"}


def test_the_target_line_says_whether_every_conversation_reaches_ninety_percent() -> None:
    def hit(conversation: str, index: int, offered: bool, held: bool) -> QuestionRow:
        return QuestionRow(
            conversation, "group", index, 4, "q?", "a", ("D1:1",), (), 0, offered, held, None, None, None, ()
        )

    rows = [hit("c1", i, True, True) for i in range(10)]
    rows += [hit("c2", i, i < 8, i < 9) for i in range(10)]
    text = target_line(rows)
    assert "**not met**: 1 of 2 reach it" in text and "reaches it on 2 of 2" in text
    assert "**met**: 1 of 1" in target_line(rows[:10])
