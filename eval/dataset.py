"""The LoCoMo conversations as frozen values: sessions of dialog turns, the observations written
for each session (with the turns they rest on) and the questions with their evidence turns.

The files stay where they are (``--data``, by default the shared copy); nothing is copied here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

DATA_DIR = Path("/work/shared/data/locomo")

#: Tune only on these; report on all (the data's README).
DEV_SPLIT = ("conv-41", "conv-42", "conv-43", "conv-44")
ALL_CONVERSATIONS = (*DEV_SPLIT, "conv-47", "conv-48", "conv-49", "conv-50")

#: Categories asked; 5 (adversarial, unanswerable) has no evidence to find.
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open domain", 4: "single hop"}

#: A dialog id as written, also the stray forms ``D:11:26`` and ``D4:17, D4:19`` of a few records.
_DIA_ID = re.compile(r"D:?(\d+):(\d+)")
_SESSION = re.compile(r"session_(\d+)")


@dataclass(frozen=True, slots=True)
class DialogTurn:
    dia_id: str  # D<session>:<n>
    speaker: str
    text: str  # the words, plus " [image: <caption>]" when a photo was shared

    @property
    def session(self) -> int:
        return int(self.dia_id[1:].split(":", 1)[0])


@dataclass(frozen=True, slots=True)
class Observation:
    speaker: str
    sentence: str
    evidence: tuple[str, ...]  # dia ids


@dataclass(frozen=True, slots=True)
class Session:
    number: int
    date_time: str
    turns: tuple[DialogTurn, ...]
    observations: tuple[Observation, ...]

    @property
    def said_at(self) -> int | None:
        """When the session took place, in epoch milliseconds (its ``date_time``, "1:56 pm on
        8 May, 2023", read as UTC; None when it has none)."""
        try:
            when = datetime.strptime(self.date_time, "%I:%M %p on %d %B, %Y")
        except ValueError:
            return None
        return int(when.replace(tzinfo=UTC).timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class Question:
    index: int  # position in the file's qa list
    text: str
    answer: str
    evidence: tuple[str, ...]  # dia ids
    category: int


@dataclass(frozen=True, slots=True)
class Conversation:
    name: str
    speaker_a: str
    speaker_b: str
    sessions: tuple[Session, ...]
    questions: tuple[Question, ...]

    @property
    def turns(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    def asked(self, limit: int | None = None) -> list[Question]:
        """The questions of categories 1–4 in file order, at most ``limit``."""
        found = [q for q in self.questions if q.category in CATEGORIES]
        return found if limit is None else found[:limit]


def dia_ids(raw: object) -> tuple[str, ...]:
    """Every dia id in a string or a list of strings, in order, without repeats (the data set
    writes them several ways: ``D4:17, D4:19``, ``D9:1 D4:4``, ``D:11:26``, ``D30:05``)."""
    parts = cast(list[Any], raw) if isinstance(raw, list) else [raw]
    found: list[str] = []
    for part in parts:
        if isinstance(part, str):
            # Numbers as numbers: one evidence id of conv-50 reads "D30:05" for turn D30:5.
            found += [f"D{int(s)}:{int(n)}" for s, n in _DIA_ID.findall(part)]
    return tuple(dict.fromkeys(found))


def _turn(raw: dict[str, Any]) -> DialogTurn:
    text = str(raw["text"])
    caption = raw.get("blip_caption")
    if isinstance(caption, str) and caption.strip():
        text += f" [image: {caption.strip()}]"
    return DialogTurn(str(raw["dia_id"]), str(raw["speaker"]), text)


def _observations(raw: object) -> tuple[Observation, ...]:
    if not isinstance(raw, dict):
        return ()
    found: list[Observation] = []
    for speaker, facts in cast(dict[str, Any], raw).items():
        for fact in cast(list[Any], facts):
            sentence, evidence = cast(list[Any], fact)[:2]
            found.append(Observation(str(speaker), str(sentence), dia_ids(evidence)))
    return tuple(found)


def load(name: str, data_dir: Path = DATA_DIR) -> Conversation:
    """One conversation file (``conv-41`` → ``<data_dir>/conv-41.json``)."""
    data = cast(dict[str, Any], json.loads((data_dir / f"{name}.json").read_text()))
    numbers = sorted(int(m.group(1)) for key in data if (m := _SESSION.fullmatch(key)))
    sessions = tuple(
        Session(
            n,
            str(data.get(f"session_{n}_date_time", "")),
            tuple(_turn(t) for t in cast(list[dict[str, Any]], data[f"session_{n}"])),
            _observations(data.get(f"session_{n}_observation")),
        )
        for n in numbers
    )
    questions = tuple(
        Question(
            i,
            str(q["question"]),
            str(q.get("answer", "")),
            dia_ids(q.get("evidence", [])),
            int(q["category"]),
        )
        for i, q in enumerate(cast(list[dict[str, Any]], data["qa"]))
    )
    return Conversation(name, str(data["speaker_a"]), str(data["speaker_b"]), sessions, questions)
