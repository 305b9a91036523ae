"""The Python client (client/, DESIGN §5): its generated code matches schema/schema.graphql and
its operations, and the quickstart runs through it against the real API, sync and async."""

from __future__ import annotations

import asyncio
import contextlib
import filecmp
import secrets
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from botmemory_client import AsyncBotMemory, BotMemory
from botmemory_client.generated_async.memory_changes import MemoryChangesMemoryChanges
from botmemory_client.generated_sync.enums import Access, ItemKind
from botmemory_client.generated_sync.exceptions import GraphQLClientGraphQLMultiError
from botmemory_client.generated_sync.input_types import ItemInput
from services.settings import Settings
from tests.client import Api, make_world
from tests.conftest import ROOT, ApiProcess
from tests.feed_helpers import opened, until_opened

CLIENT = ROOT / "client"
GENERATED = ("generated_async", "generated_sync")
CODEGEN = ROOT / ".venv-codegen" / "bin" / "ariadne-codegen"


def differences(left: Path, right: Path) -> list[str]:
    """Files that differ, or exist on one side only, between two generated packages."""
    compared = filecmp.dircmp(left, right, ignore=["__pycache__"])
    found = [f"{name} differs" for name in compared.diff_files]
    found += [f"{name} only in the committed code" for name in compared.left_only]
    found += [f"{name} missing from the committed code" for name in compared.right_only]
    return found


def test_generated_client_is_fresh(tmp_path: Path) -> None:
    """What `make client` writes from the schema snapshot and client/queries is what is committed."""
    assert CODEGEN.exists(), f"{CODEGEN} is missing: `make install` (or `make client`) builds it"
    work = tmp_path / "client"
    shutil.copytree(CLIENT / "queries", work / "queries")
    for config in CLIENT.glob("codegen-*.toml"):
        shutil.copy(config, work / config.name)
    (tmp_path / "schema").mkdir()
    shutil.copy(ROOT / "schema" / "schema.graphql", tmp_path / "schema" / "schema.graphql")
    (work / "botmemory_client").mkdir()
    for config in sorted(work.glob("codegen-*.toml")):
        subprocess.run([str(CODEGEN), "--config", config.name], cwd=work, check=True, capture_output=True)
    stale = [
        f"{package}/{problem}"
        for package in GENERATED
        for problem in differences(CLIENT / "botmemory_client" / package, work / "botmemory_client" / package)
    ]
    assert not stale, f"the committed client is stale ({', '.join(stale)}); run `make client`"


def test_quickstart_with_the_sync_client(api_process: ApiProcess, settings: Settings) -> None:
    """Provision, grant, chat, Turn, remember, then read the memory, search it and its log."""
    assert settings.admin_token is not None
    with BotMemory(api_process.url, settings.admin_token.get_secret_value()) as admin:
        org = admin.create_organization(name=f"client-{secrets.token_hex(3)}")
        person = admin.create_person(organization_id=org.id, name="ann")
        bot = admin.create_bot(organization_id=org.id, name="Ada")
        assert admin.grant_bot(bot_id=bot.id, person_id=person.person.id, access=Access.WRITE).id == bot.id
        platform = admin.create_platform_token(organization_id=org.id).token
    with BotMemory(api_process.url, person.token) as ann:
        assert ann.me().id == person.person.id
        chat = ann.create_chat(bot_id=bot.id)
        turn = ann.start_turn(chat_id=chat.id, input="Hello, I keep a cat.")
        items = ann.add_items(turn_id=turn.id, items=[ItemInput(kind=ItemKind.BOT_MESSAGE, text="Hi!")])
        assert [i.kind for i in items] == [ItemKind.BOT_MESSAGE]
        assert ann.complete_turn(turn_id=turn.id).status == "completed"
        history = ann.chat_messages(id=chat.id)
        assert history is not None and [m.text for m in history.messages] == ["Hello, I keep a cat.", "Hi!"]

        remembered = ann.remember(
            bot_id=bot.id, content="My cat is called Zanzibar.", tags=["pets"], idempotency_key="cat-1"
        )
        entry = remembered.entry
        # Sent again with its key (a retry after a lost answer): the same entry, none added.
        again = ann.remember(
            bot_id=bot.id, content="My cat is called Zanzibar.", tags=["pets"], idempotency_key="cat-1"
        )
        assert (again.entry.id, again.version) == (entry.id, remembered.version)
        # A share made on the version read: once it moved the entry on, the same read is stale.
        mine = [f"for:person:{person.person.id}"]
        shared = ann.share_entry(bot_id=bot.id, id=entry.id, audience=mine, expected=entry.changed_version)
        with pytest.raises(GraphQLClientGraphQLMultiError) as stale:
            ann.share_entry(bot_id=bot.id, id=entry.id, audience=mine, expected=entry.changed_version)
        assert [(e.extensions or {}).get("code") for e in stale.value.errors] == ["CONFLICT"]
        page = ann.memory(bot_id=bot.id)
        assert [e.content for e in page.entries] == ["My cat is called Zanzibar."]
        assert page.version == shared.version
        hits = ann.search(bot_id=bot.id, query="zanzibar", limit=5)
        assert [h.entry.id for h in hits] == [entry.id]
        log = ann.memory_log(bot_id=bot.id)
        assert [c.ids for c in log.changes] == [[entry.id], [entry.id]]  # the share, the remember
        explored = ann.entry(bot_id=bot.id, id=entry.id, depth=2)
        assert explored.entry.content == entry.content
        assert explored.dependents.entries == [] and explored.dependents.hidden == 0

        pack = ann.context_pack(chat_id=chat.id)
        assert pack.memory.ids == [entry.id] and [m.text for m in pack.last_messages][-1] == "Hi!"
        with BotMemory(api_process.url, platform) as server:
            assert server.context(chat_id=chat.id, query="cat").ids == [entry.id]

        assert ann.forget(bot_id=bot.id, id=entry.id).version > remembered.version
        assert ann.memory(bot_id=bot.id).entries == []
        with pytest.raises(GraphQLClientGraphQLMultiError) as refused:
            ann.create_organization(name="not for a person")
    assert [(e.extensions or {}).get("code") for e in refused.value.errors] == ["FORBIDDEN"]


async def collect(
    feed: AsyncIterator[MemoryChangesMemoryChanges], into: asyncio.Queue[MemoryChangesMemoryChanges]
) -> None:
    async for change in feed:
        await into.put(change)


async def test_async_client_receives_memory_changes(api: Api) -> None:
    """The subscription authenticates with the token in connection_init and, once the server has
    registered it, receives the change of a remember made through the same client."""
    w = await make_world(api, ("ann",))
    async with AsyncBotMemory(str(api.http.base_url), w.tokens["ann"]) as ann:
        received: asyncio.Queue[MemoryChangesMemoryChanges] = asyncio.Queue()
        before = await opened(api, "memoryChanges")
        listener = asyncio.create_task(collect(ann.memory_changes(bot_id=w.bot), received))
        try:
            await until_opened(api, "memoryChanges", before + 1)
            remembered = await ann.remember(bot_id=w.bot, content="Ann takes her tea without sugar.")
            change = await asyncio.wait_for(received.get(), 10)
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener  # a failure of the subscription itself is raised here
    assert change.version == remembered.version
    assert [(e.id, e.content) for e in change.entries] == [(remembered.entry.id, remembered.entry.content)]
