"""What a group chat's context costs as its channel grows (D9.15, D9.22).

An answer in a group chat must pass the group and every current member of its channel, checked
as one reader (``graph.access.GROUP_READER``) whose members are read again under the lock in
each statement: the cost grows with the members, never with members × candidates. The bench
builds one organization with a channel of two people, a group chat and 60 facts learned from it,
then adds members (Person, MEMBER_OF, MEMBER, a READ grant) in steps and times, in process, what
a server caller's ``context`` does — the Chat's readers (``memory.chat_reader``) and
``search.context`` without a query (memory order) — as medians of three runs of ``--samples``
calls each. Run: ``make bench-channel`` (the test-profile stack); it deletes what it made.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from bench.memory_bench import delete_bot_data
from services import chats, memory, provisioning, search, turns
from services.bootstrap import open_runtime
from services.changes import AddFact, ItemRef
from services.domain import Access, Principal
from services.runtime import Runtime
from services.settings import load_settings
from services.writepath import apply_changes

ADMIN = Principal("admin")
STEPS = (0, 100, 1_000, 5_000, 20_000)
FACTS = 60

ADD_MEMBERS = """
MATCH (o:Organization {id: $org}), (c:Channel {id: $channel}), (b:Bot {id: $bot})
UNWIND range($first, $last) AS n
CREATE (p:Person {id: $channel + '-member-' + n, name: 'member ' + n, createdAt: 0})-[:MEMBER_OF]->(o)
CREATE (p)-[:MEMBER]->(c)
CREATE (p)-[:GRANT {access: 'READ'}]->(b)
"""


async def build(rt: Runtime, org: str) -> tuple[str, str, str]:
    """The Bot, channel and group chat of the organization, with FACTS facts the group may see."""
    bot = (await provisioning.create_bot(rt, ADMIN, org, "bot", None)).id
    people: list[Principal] = []
    for name in ("ann", "bob"):
        person, _, _ = await provisioning.create_person(rt, ADMIN, org, name)
        await provisioning.grant_bot(rt, ADMIN, bot, person.id, Access.WRITE)
        people.append(Principal("person", person_id=person.id, organization_id=org))
    ids = [p.person_id or "" for p in people]
    channel = (await provisioning.create_channel(rt, ADMIN, org, "team", ids)).id
    chat = await chats.create_chat(rt, people[0], bot, channel_id=channel, review=False, owner_id=None)
    turn = await turns.start_turn(rt, people[0], chat.id, "the team's notes", actor_id=None, notice=False)
    source = ItemRef(chat.id, f"i-{turn.seq}")
    facts = [
        AddFact(content=f"The team decided point {n}: rivers and bridges, item {n}", sources=(source,))
        for n in range(FACTS)
    ]
    await apply_changes(rt, bot, list(facts), "memory_bot")
    return bot, channel, chat.id


async def one_context(rt: Runtime, bot: str, chat: str) -> tuple[float, int]:
    started = time.perf_counter()
    reader = await memory.chat_reader(rt, chat)
    assert reader is not None
    found = await search.context(rt, None, bot, reader, 4000, None)
    return (time.perf_counter() - started) * 1000, len(found.ids)


async def run(samples: int) -> int:
    async with open_runtime(load_settings()) as rt:
        org = (await provisioning.create_organization(rt, ADMIN, "channel-bench")).id
        try:  # everything made from here on is the organization's, and deleted with it
            bot, channel, chat = await build(rt, org)
            added = 0
            print("| extra members | context p50 (ms), medians of 3 runs | entries offered |")
            print("|---:|---:|---:|")
            for members in STEPS:
                if members > added:
                    await rt.driver.execute_query(
                        ADD_MEMBERS, org=org, channel=channel, bot=bot, first=added + 1, last=members
                    )
                    added = members
                await one_context(rt, bot, chat)  # plans and caches warm
                medians: list[float] = []
                offered = 0
                for _ in range(3):
                    times: list[float] = []
                    for _ in range(samples):
                        ms, offered = await one_context(rt, bot, chat)
                        times.append(ms)
                    medians.append(statistics.median(times))
                print(f"| {members:,} | {statistics.median(medians):.1f} | {offered} |")
                if offered != FACTS:
                    print(f"expected all {FACTS} facts offered, got {offered}", file=sys.stderr)
                    return 1
        finally:
            await delete_bot_data(rt, org)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="What a group chat's context costs as its channel grows.")
    parser.add_argument("--samples", type=int, default=15, help="calls per run (default 15)")
    return asyncio.run(run(parser.parse_args(argv).samples))


if __name__ == "__main__":
    raise SystemExit(main())
