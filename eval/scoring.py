"""Scores of one question and their summaries: candidate recall (an offered entry rests on one of
the question's evidence turns), its ceiling (any entry the asker may see does), search recall at
5 and 10, the size of what was offered, and leaks (entries of another person's chat offered)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from bench.measure import pct
from eval.dataset import CATEGORIES, Question
from eval.scripted import Offer

#: Characters per token for the size of what is offered.
CHARS_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class Learned:
    """An entry as listed by ``GET /v1/bots/{bot}/memory``: the dialog turns its Items hold."""

    id: str
    content: str
    chats: frozenset[str]  # the chats of its source Items
    evidence: frozenset[str]  # dia ids
    active: bool  # status "active" (the ceiling counts only these)

    def foreign(self, foreign_chats: frozenset[str]) -> bool:
        """Whether it rests on an Item of a chat the asker is not in (any one is enough)."""
        return bool(self.chats & foreign_chats)


@dataclass(frozen=True, slots=True)
class QuestionRow:
    conversation: str
    mode: str  # "group" or "leak-check"
    index: int
    category: int
    question: str
    answer: str
    evidence: tuple[str, ...]
    offered: tuple[str, ...]  # entry ids, in the order offered
    offered_chars: int
    candidate_hit: bool
    ceiling_hit: bool
    search: tuple[str, ...] | None  # entry ids by relevance; None when search is not available
    search_hit5: bool | None
    search_hit10: bool | None
    leaks: tuple[str, ...]  # entries of a chat the asker is not in, offered or found

    @property
    def tokens(self) -> float:
        return self.offered_chars / CHARS_PER_TOKEN


def _rests_on(ids: Iterable[str], entries: Mapping[str, Learned], evidence: frozenset[str]) -> bool:
    return any(i in entries and entries[i].evidence & evidence for i in ids)


def score(
    conversation: str,
    mode: str,
    question: Question,
    offered: Sequence[Offer],
    search: Sequence[str] | None,
    entries: Mapping[str, Learned],
    visible: Iterable[str],
    foreign_chats: frozenset[str],
) -> QuestionRow:
    """One question's row; ``visible`` = the entries the asker may see (the ceiling's pool: the
    active ones). A leak is an offered or found entry of a chat the asker is not in — or one the
    asker's and the other person's lists both lack, which the harness cannot vouch for."""
    evidence = frozenset(question.evidence)
    ids = tuple(o.id for o in offered)
    leaks = [i for i in (*ids, *(search or ())) if i not in entries or entries[i].foreign(foreign_chats)]
    pool = [i for i in visible if i in entries and entries[i].active]
    return QuestionRow(
        conversation,
        mode,
        question.index,
        question.category,
        question.text,
        question.answer,
        question.evidence,
        ids,
        sum(len(o.text) + len(o.said) for o in offered),  # the text and its day (D9.31)
        _rests_on(ids, entries, evidence),
        _rests_on(pool, entries, evidence),
        None if search is None else tuple(search),
        None if search is None else _rests_on(search[:5], entries, evidence),
        None if search is None else _rests_on(search[:10], entries, evidence),
        tuple(dict.fromkeys(leaks)),
    )


def _share(flags: Sequence[bool | None]) -> str:
    known = [f for f in flags if f is not None]
    if not flags:
        return "–"
    if len(known) < len(flags):
        return "n/a"
    return f"{100 * sum(known) / len(known):.1f} %"


def _tokens(rows: Sequence[QuestionRow]) -> str:
    t = [r.tokens for r in rows]
    if not t:
        return "– / –"
    return f"{sum(t) / len(t):,.0f} / {pct(t, 0.95):,.0f}"


def _within_ceiling(rows: Sequence[QuestionRow]) -> str:
    """Candidate recall among the questions some entry the asker may see rests on: how much of
    what the memory holds for them the ranking offers (what the data leaves out aside)."""
    return _share([r.candidate_hit for r in rows if r.ceiling_hit])


HEADER = (
    "| conversation | category | questions | candidate recall | ceiling | candidate recall within the ceiling | "
    "search recall@5 | search recall@10 | tokens offered mean / p95 | leaks |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def line(conversation: str, category: str, rows: Sequence[QuestionRow]) -> str:
    return (
        f"| {conversation} | {category} | {len(rows)} | {_share([r.candidate_hit for r in rows])} | "
        f"{_share([r.ceiling_hit for r in rows])} | {_within_ceiling(rows)} | {_share([r.search_hit5 for r in rows])} | "
        f"{_share([r.search_hit10 for r in rows])} | {_tokens(rows)} | {sum(len(r.leaks) for r in rows)} |"
    )


def table(rows: Sequence[QuestionRow]) -> str:
    """Per conversation and category, then all conversations together."""
    out = [HEADER]
    names = list(dict.fromkeys(r.conversation for r in rows))
    groups = [(n, [r for r in rows if r.conversation == n]) for n in names]
    if len(names) > 1:
        groups.append(("**all**", list(rows)))
    for name, mine in groups:
        for category, label in CATEGORIES.items():
            subset = [r for r in mine if r.category == category]
            if subset:
                out.append(line(name, f"{category} {label}", subset))
        out.append(line(name, "**1–4**", mine))
    return "\n".join(out)
