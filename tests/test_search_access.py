"""Stateful property test: ``search`` shows nobody more than the reference model lets them see,
and finds every visible entry that holds the query's rare word (design §10, V10).

It reuses the access-model machine (:mod:`tests.test_access_model`): the same random worlds and
changes, checked against :mod:`tests.reference_model` after every step as there, plus one step that
learns entries a Chat's people see. This machine also plants words in the entries it creates — a
made-up rare word (``zq`` and six Latin letters, ``жщ`` and six Cyrillic ones, or two Han
characters; one to three per example, each shared by several entries) and a common word — and, in about half the examples, the memory Bot's changes carry
vectors of the settings' embedder as the learning worker writes them (else keywords only, as when
the embedder is down). Then, through the real route ``GET /v1/bots/{bot}/memory/search`` with each
person's token:

- every result is an entry the model says the person sees and that is active, with its content,
  best first, at most ``limit`` of them;
- a query of one rare word finds every visible active entry holding it, with ``limit`` as small as
  their number when they all have vectors (see :meth:`SearchMachine.rare_limit` otherwise);
- a memory small enough for every vector to be a candidate (at most ``DENSE_MIN`` entries) is found
  whole when ``limit`` allows it.

Searches run as random steps (at some state of the world) and, at the end of every example, for
every person and Bot: each rare word, and every word of every entry at once. Dropping ``VISIBLE``
from the keyword or the dense candidates of ``graph/search.py`` fails it within a few examples.
``BOTMEMORY_HYPOTHESIS_EXAMPLES`` and ``_STEPS`` scale it as the access model (default 15 × 25).
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from learning.embedders import make_embedder
from services.changes import MemoryChange
from services.embedding import Embedder
from services.keywords import STOPWORDS, tokens
from services.runtime import Runtime
from services.search import DENSE_MIN
from services.settings import Settings
from services.writepath import apply_changes
from tests.client import Api
from tests.reference_model import ACTIVE
from tests.test_access_model import (
    EXAMPLES,
    MAX_ENTRIES,
    STEPS,
    UNKNOWN_ENTRY,
    AccessMachine,
    Bridge,
    idx,
    pick,
    pick_recent,
    run_machine,
    step,
)

#: Consonants but ``s`` and ``y``: the Snowball English stemmer leaves a word of them whole, as
#: the Russian one leaves a word of Cyrillic consonants; two Han characters are one token (a pair).
RARE_LETTERS = "bcdfghjklmnpqrtvwxz"
RARE_CYRILLIC = "бвгджзклмнпрстфхцчшщ"
RARE_HAN = "".join(chr(code) for code in range(0x9F90, 0x9FA0))
rare_words = st.one_of(
    st.text(alphabet=RARE_LETTERS, min_size=6, max_size=6).map(lambda s: "zq" + s),
    st.text(alphabet=RARE_CYRILLIC, min_size=6, max_size=6).map(lambda s: "жщ" + s),
    st.text(alphabet=RARE_HAN, min_size=2, max_size=2),
)
COMMON_WORDS = ("coffee", "violin", "lisbon", "peanuts", "marathon", "birthday")
#: What the n-th new entry gets besides its text: a rare word (by index) and a common word.
planted = st.tuples(
    st.one_of(st.none(), st.integers(0, 2)), st.one_of(st.none(), st.sampled_from(COMMON_WORDS))
)

Result = list[dict[str, Any]]


class SearchMachine(AccessMachine):
    embedder: ClassVar[Embedder | None] = None

    def __init__(self) -> None:
        super().__init__()
        self.rare: list[str] = []
        self.plan: list[tuple[int | None, str | None]] = []
        self.planted = 0
        self.vectors = True

    @initialize(data=st.data())
    def world(self, data: st.DataObject) -> None:
        self.rare = data.draw(st.lists(rare_words, min_size=1, max_size=3, unique=True), label="rare words")
        for word in self.rare:
            assert tokens(word) == [word] and word not in STOPWORDS, f"{word} is not one keyword"
        self.plan = data.draw(st.lists(planted, min_size=1, max_size=8), label="planted words")
        self.vectors = data.draw(st.booleans(), label="the memory Bot writes vectors")
        super().world(data)

    def content(self, text: str) -> str:
        rare, common = self.plan[self.planted % len(self.plan)] if self.plan else (None, None)
        self.planted += 1
        words = [
            text,
            *([common] if common else []),
            *([self.rare[rare % len(self.rare)]] if rare is not None else []),
        ]
        return " ".join(words)

    async def _apply(self, bot: str, changes: list[MemoryChange]) -> None:
        await apply_changes(
            self.bridge.runtime, bot, changes, "memory_bot", embedder=self.embedder if self.vectors else None
        )

    @precondition(lambda self: self.chats and self.created < MAX_ENTRIES)
    @rule(chat=idx, speaker=idx, above=st.integers(0, 2))
    @step
    def learn_in_view(self, chat: int, speaker: int, above: int) -> None:
        """A message by a person of a Chat that is not a review, a fact learnt from it and up to two
        observations over that fact: entries that the Chat's people see, for searches to find."""
        chats = [c for c in self.chats if not self.model.chats[c].review] or self.chats
        c = pick(chats, chat)
        people = [p for p in self.people if self.model.is_person_of_chat(p, c)]
        if not people:  # a group chat whose channel has no members now: nobody says anything in it
            return
        item = self._say(c, pick(people, speaker))
        if item is None:
            return
        bot, before = self.model.chats[c].bot, self.created
        self._fact(bot, [(c, item)], None)
        for _ in range(above if self.created > before else 0):
            self._observe(bot, [self.entry_ids[-1]])

    # Searching -------------------------------------------------------------------------------------

    async def _search(self, person: str, bot: str, query: str, limit: int) -> Result | None:
        """The results of the REST search as the person; None when they may not read the Bot."""
        response = await self.bridge.api.http.get(
            f"/v1/bots/{bot}/memory/search",
            params={"q": query, "limit": str(limit)},
            headers=self.headers(person),
        )
        if response.status_code in (403, 404):
            assert response.json()["error"]["code"] in ("FORBIDDEN", "NOT_FOUND"), response.text
            return None
        assert response.status_code == 200, response.text
        results: Result = response.json()["results"]
        return results

    def visible_active(self, person: str, bot: str) -> set[str] | None:
        listing = self.model.listing(person, bot)
        return None if listing is None else {v.id for v in listing if v.status == ACTIVE}

    def holding(self, ids: set[str], word: str) -> set[str]:
        return {e for e in ids if word in self.contents[e].split()}

    def explain(self, entry_id: str, person: str) -> str:
        e = self.model.entries.get(entry_id)
        if e is None:
            return f"{entry_id}: purged or unknown"
        return f"{entry_id}: {e.status} {e.layer} tags {sorted(e.tags)} excluded {sorted(e.excluded)}" + (
            f" (seen as history by {person})" if self.model.sees(person, e.bot, entry_id) else ""
        )

    @property
    def all_vectors(self) -> bool:
        """Every entry has a vector: the memory Bot's by this machine, Remember's by the API —
        not an imported one, whose vector the backfill makes later (its keywords come with it)."""
        remembered = any(e in self.model.entries and not self.model.entries[e].legacy for e in self.imported)
        return self.embedder is not None and self.vectors and not remembered

    def rare_limit(self, visible: set[str], word: str) -> int:
        """The smallest ``limit`` that promises every visible active entry holding ``word``.

        Only those entries match the word's keyword. With a vector each, they also rank high by
        meaning, so in memories this small their number is enough. A holder without a vector is found by its keyword
        alone, and reciprocal-rank fusion may put entries found by meaning (a pinned one above
        all) before it: then only room for every visible entry promises it.
        """
        return max(1, len(self.holding(visible, word)) if self.all_vectors else len(visible))

    def promised(self, bot: str, query: str, limit: int, visible: set[str]) -> set[str]:
        """What a search must find: the holders of a rare word given ``rare_limit``; everything
        visible in a memory small enough for every vector to be a candidate (``DENSE_MIN``)."""
        pool = [e for e in self.contents if self.entry_bot[e] == bot]
        if self.all_vectors and len(pool) <= DENSE_MIN and limit >= len(visible):
            return visible
        if query in self.rare and limit >= self.rare_limit(visible, query):
            return self.holding(visible, query)
        return set()

    def check_search(self, person: str, bot: str, query: str, limit: int, got: Result | None) -> None:
        """Every result is visible and active for the person, with its content, best first, at
        most ``limit``; and what :meth:`promised` says is among them."""
        where = f"search {query!r} limit {limit} by {person} on {bot}"
        visible = self.visible_active(person, bot)
        if visible is None or got is None:
            assert visible is None and got is None, self.describe(
                f"{where}: readable by the model {visible is not None}, by the service {got is not None}"
            )
            self.bridge.count("search: refused")
            return
        ids = [r["entry"]["id"] for r in got]
        extra = [e for e in ids if e not in visible]
        assert not extra, self.describe(
            f"{where}: LEAK of {extra}; the model's visible active set is {sorted(visible)}\n"
            + "\n".join(self.explain(e, person) for e in extra)
        )
        assert len(ids) == len(set(ids)) and len(ids) <= limit, self.describe(f"{where}: {ids}")
        for r in got:
            entry = r["entry"]
            assert entry["status"] == ACTIVE, self.describe(f"{where}: {entry['id']} is {entry['status']}")
            assert entry["content"] == self.contents[entry["id"]], self.describe(f"{where}: {entry}")
        scores = [float(r["score"]) for r in got]
        assert scores == sorted(scores, reverse=True), self.describe(f"{where}: scores {scores}")
        must_find = self.promised(bot, query, limit, visible)
        missing = sorted(must_find - set(ids))
        assert not missing, self.describe(
            f"{where}: MISSING {missing} (found {ids}, the model's visible active set {sorted(visible)})\n"
            + "\n".join(f"{e}: {self.contents[e]!r}" for e in missing)
        )
        self.bridge.count("search: found" if ids else "search: nothing found")
        if must_find:
            self.bridge.count("search: found what it must")
        hidden = {e.id for e in self.model.entries.values() if e.bot == bot and e.status == ACTIVE} - visible
        if query in self.rare and self.holding(hidden, query):
            self.bridge.count("search: a rare word also in hidden entries")

    @rule(person=idx, bot=idx, word=idx, slack=st.sampled_from([0, 0, 1, 100]))
    @step
    def search_rare_word(self, person: int, bot: int, word: int, slack: int) -> None:
        """One rare word; ``limit`` as small as :meth:`rare_limit` (plus ``slack``)."""
        p, b, w = pick(self.people, person), pick(self.bots, bot), pick(self.rare, word)
        limit = min(100, self.rare_limit(self.visible_active(p, b) or set[str](), w) + slack)
        self.check_search(p, b, w, limit, self.run(self._search(p, b, w, limit)))

    @precondition(lambda self: len(self.entry_ids) > 1)
    @rule(
        person=idx, bot=idx, picks=st.lists(idx, min_size=1, max_size=3), limit=st.sampled_from([1, 3, 100])
    )
    @step
    def search_words(self, person: int, bot: int, picks: list[int], limit: int) -> None:
        """Words of entries, of any Bot and state (newest first); ``limit`` 1, 3 or 100."""
        p, b = pick(self.people, person), pick(self.bots, bot)
        ids = [e for e in self.entry_ids if e != UNKNOWN_ENTRY]
        query = " ".join(pick(self.contents[pick_recent(ids, i)].split(), i // 7) for i in picks)
        self.check_search(p, b, query, limit, self.run(self._search(p, b, query, limit)))

    def check_searches(self) -> None:
        """Every person on every Bot: each rare word with ``limit`` = :meth:`rare_limit`, and every
        word of every entry at once with ``limit`` 100 (any entry is a keyword candidate then)."""
        everything = " ".join(sorted({w for c in self.contents.values() for w in c.split()}))
        queries: list[tuple[str, str, str, int]] = []
        for p in self.people:
            for b in self.bots:
                visible = self.visible_active(p, b) or set[str]()
                queries += [(p, b, w, min(100, self.rare_limit(visible, w))) for w in self.rare]
                queries.append((p, b, everything or "nothing", 100))

        async def all_of() -> list[Result | None]:
            return list(await asyncio.gather(*(self._search(*q) for q in queries)))

        for (p, b, q, limit), got in zip(queries, self.run(all_of()), strict=True):
            self.check_search(p, b, q, limit, got)

    def teardown(self) -> None:
        if self.ready and self.clean:
            self.check_searches()
        super().teardown()


@pytest.mark.timeout(max(600, EXAMPLES * STEPS * 3))
async def test_search_shows_only_visible_entries_and_finds_rare_words(
    api: Api, runtime: Runtime, settings: Settings
) -> None:
    SearchMachine.bridge = Bridge(api, runtime, asyncio.get_running_loop())
    SearchMachine.embedder = make_embedder(settings)
    try:
        await run_machine(SearchMachine, EXAMPLES, "search access")
    finally:
        if SearchMachine.embedder is not None:
            await SearchMachine.embedder.aclose()
