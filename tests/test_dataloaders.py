"""DataLoaders: nested and repeated lookups are one statement per batch, whatever the number of
objects, and every key gets what the single lookup gives the same caller (D9.6); one
authentication per request.

The operation runs in-process on the real Neo4j (the world is built through the real API), with
the managed transaction's ``run`` wrapped to record every statement.
"""

from __future__ import annotations

from typing import Any, cast

import pytest
from neo4j import AsyncManagedTransaction, AsyncSession
from strawberry import Schema

from graph import bots as bots_q
from graph import identity
from learning.gateway import Gateway
from resolvers.schema import build_schema
from schema.context import Context
from services import chats, provisioning
from services.auth import authenticate
from services.domain import Page
from services.errors import BadInput, Forbidden, NotFound
from services.runtime import Runtime
from services.settings import Settings
from tests.client import Api, make_world

CHAT_FIELDS = "id messageCount messages(limit: 2) { id text }"


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The text of every statement this process runs, in a managed or an auto-commit transaction."""
    seen: list[str] = []
    for kind in (AsyncManagedTransaction, AsyncSession):
        original = kind.run

        async def run(
            self: Any, query: Any, parameters: Any = None, original: Any = original, **kwargs: Any
        ) -> Any:
            seen.append(str(query))
            return await original(self, query, parameters, **kwargs)

        monkeypatch.setattr(kind, "run", run)
    return seen


@pytest.fixture(scope="module")
def schema(settings: Settings) -> Schema:
    return build_schema(settings)


def context_of(runtime: Runtime, token: str, *, connection: bool = False) -> Context:
    """A request's context, or with ``connection`` a WebSocket connection's (see get_context)."""
    return Context(
        runtime=runtime,
        gateway=cast(Gateway, None),
        embedder=None,
        authorization=f"Bearer {token}",
        cache_loaders=not connection,
    )


async def execute(
    schema: Schema,
    runtime: Runtime,
    token: str,
    query: str,
    variables: dict[str, Any],
    context: Context | None = None,
) -> tuple[dict[str, Any], list[tuple[str, str | None]]]:
    """Data and (path, code) of each error of one operation, as the API would answer it."""
    context = context or context_of(runtime, token)
    result = await schema.execute(query, variable_values=variables, context_value=context)
    errors = [
        (".".join(map(str, e.path or [])), (e.extensions or {}).get("code")) for e in result.errors or []
    ]
    return result.data or {}, errors


def aliased(field: str, ids: list[str], selection: str) -> tuple[str, dict[str, Any]]:
    """One operation reading ``field(id:)`` for each id under aliases k0, k1, …"""
    params = ", ".join(f"$k{n}: ID!" for n in range(len(ids)))
    body = " ".join(f"k{n}: {field}(id: $k{n}) {{ {selection} }}" for n in range(len(ids)))
    return f"query({params}) {{ {body} }}", {f"k{n}": i for n, i in enumerate(ids)}


async def test_chats_with_messages_take_the_same_statements_for_one_or_many(
    api: Api, runtime: Runtime, schema: Schema, statements: list[str]
) -> None:
    world = await make_world(api, ("ann",))
    ann = world.tokens["ann"]
    ids = [await api.chat(ann, world.bot) for _ in range(6)]
    for n, chat in enumerate(ids):
        await api.turn(ann, chat, f"hello {n}")

    counts: list[int] = []
    for some in (ids[:1], ids):
        statements.clear()
        data, errors = await execute(schema, runtime, ann, *aliased("chat", some, CHAT_FIELDS))
        assert errors == []
        assert [data[f"k{n}"]["messages"][0]["text"] for n in range(len(some))] == [
            f"hello {n}" for n in range(len(some))
        ]
        assert all(data[f"k{n}"]["messageCount"] == 1 for n in range(len(some)))
        counts.append(len(statements))
    # The token, the chats, their message counts, their first pages: one statement each.
    assert counts == [4, 4]


async def test_each_key_gets_what_its_single_lookup_gives(
    api: Api, runtime: Runtime, schema: Schema, statements: list[str]
) -> None:
    world = await make_world(api, ("ann", "bob", "cat"), channel=("ann", "cat"))
    ann, bob = world.tokens["ann"], world.tokens["bob"]
    mine = await api.chat(ann, world.bot)
    group = await api.chat(ann, world.bot, channel=world.channel)
    bobs = await api.chat(bob, world.bot)
    for chat, token in ((mine, ann), (group, ann), (bobs, bob)):
        await api.turn(token, chat, f"in {chat}")
    keys = [mine, bobs, group, "chat_unknown", "not an id!", mine]

    for token in (ann, bob, world.tokens["cat"]):
        batched, errors = await execute(schema, runtime, token, *aliased("chat", keys, CHAT_FIELDS))
        for n, key in enumerate(keys):
            alone, alone_errors = await execute(schema, runtime, token, *aliased("chat", [key], CHAT_FIELDS))
            assert batched[f"k{n}"] == alone["k0"]
            assert [code for path, code in errors if path.startswith(f"k{n}")] == [
                code for _, code in alone_errors
            ]
    cat_view, _ = await execute(schema, runtime, world.tokens["cat"], *aliased("chat", keys, "id"))
    assert [cat_view[f"k{n}"] for n in range(len(keys))] == [None, None, {"id": group}, None, None, None]

    # Below the resolvers: a Chat the caller may not read is NOT_FOUND for that key only.
    as_bob = await authenticate(runtime, f"Bearer {bob}")
    pages = await chats.message_pages(runtime, as_bob, [mine, bobs, "not an id!"], limit=5, skip=0)
    assert isinstance(pages[0], NotFound)
    assert isinstance(pages[1], Page) and [i.text for i in pages[1].items] == [f"in {bobs}"]
    assert isinstance(pages[2], BadInput) and pages[2].field == "chatId"
    counts = await chats.message_counts(runtime, as_bob, [bobs, group])
    assert counts[0] == 1 and isinstance(counts[1], NotFound)
    # A platform token of the Chat's organization is told what it may call instead (D9.26).
    platform = await authenticate(runtime, f"Bearer {await api.platform_token(world.org)}")
    assert all(
        isinstance(p, Forbidden)
        for p in await chats.message_pages(runtime, platform, [mine], limit=5, skip=0)
    )


async def test_bots_are_batched_with_their_visibility(
    api: Api, runtime: Runtime, schema: Schema, statements: list[str]
) -> None:
    world = await make_world(api, ("ann",))
    other = await make_world(api, ("zed",))
    second = await api.bot(world.org)
    keys = [world.bot, other.bot, second, "bot_unknown", "not an id!", world.bot]
    statements.clear()
    data, errors = await execute(
        schema, runtime, world.tokens["ann"], *aliased("bot", [world.bot, second], "id")
    )
    assert errors == []
    assert data == {"k0": {"id": world.bot}, "k1": {"id": second}}
    assert statements[1:] == [bots_q.GET_BOTS]  # after the token: the Bots in one statement
    for n, key in enumerate(keys):
        # Bot is non-null: one error nulls the whole operation, so each foreign key goes alone.
        _, alone = await execute(schema, runtime, world.tokens["ann"], *aliased("bot", [key], "id"))
        assert [code for _, code in alone] == (
            [] if key in (world.bot, second) else ["BAD_INPUT" if n == 4 else "NOT_FOUND"]
        )
    ann = await authenticate(runtime, f"Bearer {world.tokens['ann']}")
    found = await provisioning.get_bots(runtime, ann, keys)
    assert [getattr(b, "id", type(b).__name__) for b in found] == [
        world.bot,
        "NotFound",
        second,
        "NotFound",
        "BadInput",
        world.bot,
    ]


async def test_one_authentication_per_request(
    api: Api, runtime: Runtime, schema: Schema, statements: list[str]
) -> None:
    world = await make_world(api, ("ann",))
    ann = world.tokens["ann"]
    chat = await api.chat(ann, world.bot)
    query = (
        "query($c: ID!, $b: ID!) { me { id } a: chat(id: $c) { id messageCount } "
        "b: bot(id: $b) { id } c: memoryBot(botId: $b) { version } }"
    )
    for token in (ann, "bmp_not-a-token"):
        statements.clear()
        _, errors = await execute(schema, runtime, token, query, {"c": chat, "b": world.bot})
        assert statements.count(identity.TOKEN_BY_HASH) == 1
        if token != ann:
            assert {code for _, code in errors} == {"UNAUTHENTICATED"}


async def test_a_connection_batches_but_never_reuses_an_earlier_operations_answers(
    api: Api, runtime: Runtime, schema: Schema, statements: list[str]
) -> None:
    world = await make_world(api, ("ann",))
    ann = world.tokens["ann"]
    ids = [await api.chat(ann, world.bot) for _ in range(3)]
    connection = context_of(runtime, ann, connection=True)
    for expected in (0, 1):
        statements.clear()
        data, errors = await execute(schema, runtime, ann, *aliased("chat", ids, CHAT_FIELDS), connection)
        assert errors == []
        assert [data[f"k{n}"]["messageCount"] for n in range(len(ids))] == [expected] * len(ids)
        # Each operation on a connection authenticates its token again (a revoked one stops
        # working for the next operation): one statement, then the batched loads.
        assert len(statements) == 4
        for chat in ids:
            await api.turn(ann, chat, "one more")


async def test_a_connection_keeps_no_loader_of_an_earlier_operation(
    api: Api, runtime: Runtime, schema: Schema
) -> None:
    """A connection's context kept a message loader for every paging any of its operations asked
    for, for as long as the socket stayed open: a client sending ``messages(skip: n)`` with a new
    ``n`` each time grew it without end. Each operation starts with loaders of its own."""
    world = await make_world(api, ("ann",))
    ann = world.tokens["ann"]
    chat = await api.chat(ann, world.bot)
    connection = context_of(runtime, ann, connection=True)
    for skip in range(5):
        data, errors = await execute(
            schema,
            runtime,
            ann,
            f'{{ chat(id: "{chat}") {{ messages(limit: 1, skip: {skip}) {{ id }} }} }}',
            {},
            connection,
        )
        assert errors == [] and data["chat"]["messages"] == []
        assert len(connection.loaders._pages) <= 1  # pyright: ignore[reportPrivateUsage]
