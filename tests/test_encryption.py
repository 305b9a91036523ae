"""Encryption at rest (E1): no plaintext in Neo4j files, Redis or logs; AAD binding; rotation; counter."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from services.bootstrap import open_runtime
from services.crypto import DecryptionError, Keyring, Kind
from services.rotation import rotate_data_keys
from services.runtime import Runtime
from services.settings import ConfigurationError, Settings
from tests.client import Api, make_world
from tests.conftest import ApiProcess, WorkerProcess
from tests.memory_helpers import command


def files_containing(root: Path, needle: bytes) -> list[Path]:
    found: list[Path] = []
    for path in root.rglob("*"):
        if path.is_file():
            try:
                if needle in path.read_bytes():
                    found.append(path)
            except OSError:
                continue
    return found


async def test_item_text_is_nowhere_in_plaintext(
    api: Api, runtime: Runtime, settings: Settings, api_process: ApiProcess, worker_process: WorkerProcess
) -> None:
    marker = "MARKER" + secrets.token_hex(12)
    # Neo4j packs short alphanumeric strings; a long one with spaces is stored as plain bytes.
    control = "control organization name - " + secrets.token_hex(16)
    world = await make_world(api, ("ann",))
    # Positive control: organization names are not content, so they are stored as they are.
    await api.admin("mutation($n: String!) { createOrganization(name: $n) { id } }", {"n": control})
    chat = await api.chat(world.tokens["ann"], world.bot)
    turn = await api.turn(world.tokens["ann"], chat, f"my code is {marker} please keep it")
    await api.gql(
        "mutation($t: ID!, $i: [ItemInput!]!) { addItems(turnId: $t, items: $i) { id } }",
        {"t": turn["id"], "i": [{"kind": "BOT_MESSAGE", "text": f"noted {marker}"}]},
        world.tokens["ann"],
    )
    # Malformed requests carrying the marker must not write it to the logs either.
    await api.raw(
        'mutation { startTurn(chatId: 1, input: "' + marker + '") { id } }', token=world.tokens["ann"]
    )
    await api.raw("mutation($t: Int!) { me }", {"t": marker}, world.tokens["ann"])
    await api.http.get(
        f"/v1/chats/{chat}/messages?limit={marker}",
        headers={"Authorization": f"Bearer {world.tokens['ann']}"},
    )
    await api.gql(
        "mutation($t: ID!) { completeTurn(turnId: $t) { id } }", {"t": turn["id"]}, world.tokens["ann"]
    )

    neo4j_dir = settings.data_dir / "neo4j"
    assert files_containing(neo4j_dir, control.encode()), "the scan must see what Neo4j stores"
    assert files_containing(neo4j_dir, marker.encode()) == []
    assert files_containing(neo4j_dir, marker.encode("utf-16-le")) == []

    for key in await runtime.redis.keys("*"):
        assert marker.encode() not in key
        kind = await runtime.redis.type(key)
        if kind == b"string":
            assert marker.encode() not in (await runtime.redis.get(key) or b"")
        dumped = await runtime.redis.dump(key)
        assert dumped is None or marker.encode() not in dumped

    logs = settings.data_dir / "logs"
    assert api_process.log_path.exists()
    assert worker_process.log_path.exists()
    assert files_containing(logs, marker.encode()) == []

    # And the owner still reads the text back.
    page = await api.gql(
        "query($c: ID!) { chat(id: $c) { messages { text } } }", {"c": chat}, world.tokens["ann"]
    )
    assert [m["text"] for m in page["chat"]["messages"]] == [
        f"my code is {marker} please keep it",
        f"noted {marker}",
    ]


async def test_stored_item_text_is_aes_gcm_ciphertext_bound_to_its_record(api: Api, runtime: Runtime) -> None:
    world = await make_world(api, ("ann",))
    chat = await api.chat(world.tokens["ann"], world.bot)
    await api.turn(world.tokens["ann"], chat, "first words")
    await api.turn(world.tokens["ann"], chat, "second words")
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (i:Item {chatId: $c}) RETURN i.uid AS uid, i.text AS text ORDER BY i.seq", c=chat
    )
    first, second = (dict(r) for r in records)
    assert isinstance(first["text"], str)  # the sealed blob's base64 text (services.crypto.Sealed)
    assert b"first words" not in base64.b64decode(first["text"], validate=True)
    # Copy the ciphertext of i-1 onto i-2: it must fail to decrypt (associated data = kind + id).
    await runtime.driver.execute_query(
        "MATCH (i:Item {uid: $uid}) SET i.text = $text", uid=second["uid"], text=first["text"]
    )
    response = await api.raw(
        "query($c: ID!) { chat(id: $c) { messages { text } } }", {"c": chat}, world.tokens["ann"]
    )
    assert response["errors"][0]["extensions"]["code"] == "INTERNAL"
    assert "first words" not in str(response)
    rows, _, _ = await runtime.driver.execute_query(
        "MATCH (b:Bot {id: $b}) RETURN b.keyMaster AS m, b.keyWrapped AS w", b=world.bot
    )
    cipher = runtime.cipher(world.bot, rows[0]["m"], rows[0]["w"])
    assert cipher.decrypt(Kind.ITEM, first["uid"], first["text"]) == "first words"
    with pytest.raises(DecryptionError):
        cipher.decrypt(Kind.ITEM, second["uid"], first["text"])
    with pytest.raises(DecryptionError):
        cipher.decrypt(Kind.ENTRY, first["uid"], first["text"])


async def test_ciphertexts_stored_as_byte_arrays_before_still_open(api: Api, runtime: Runtime) -> None:
    """Ciphertexts are stored as base64 text (services.crypto.Sealed); an Item and an Entry whose
    ciphertext a previous version stored as a byte array still read through the API."""
    world = await make_world(api, ("ann",))
    chat = await api.chat(world.tokens["ann"], world.bot)
    await api.turn(world.tokens["ann"], chat, "words of old")
    response = await command(
        api, world.tokens["ann"], world.bot, {"_tag": "Remember", "content": "an entry of old", "tags": []}
    )
    entry = response.json()["entry"]["id"]
    await runtime.driver.execute_query(
        "MATCH (i:Item {chatId: $c}) WHERE i.text IS :: STRING SET i.text = $raw",
        c=chat,
        raw=base64.b64decode(await _stored_item_text(runtime, chat)),
    )
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (e:Entry {id: $id}) RETURN e.content AS c", id=entry
    )
    await runtime.driver.execute_query(
        "MATCH (e:Entry {id: $id}) SET e.content = $raw", id=entry, raw=base64.b64decode(records[0]["c"])
    )
    kinds, _, _ = await runtime.driver.execute_query(
        "MATCH (e:Entry {id: $id}), (i:Item {chatId: $c}) RETURN valueType(e.content) AS e, valueType(i.text) AS i",
        id=entry,
        c=chat,
    )
    assert kinds[0]["e"].startswith("LIST<INTEGER") or kinds[0]["e"].startswith("BYTE")
    messages = await api.gql(
        "query($c: ID!) { chat(id: $c) { messages { text } } }", {"c": chat}, world.tokens["ann"]
    )
    assert [m["text"] for m in messages["chat"]["messages"]] == ["words of old"]
    listed = await api.gql(
        "query($b: ID!) { memory(botId: $b) { entries { id content } } }",
        {"b": world.bot},
        world.tokens["ann"],
    )
    assert {"id": entry, "content": "an entry of old"} in listed["memory"]["entries"]


async def _stored_item_text(runtime: Runtime, chat: str) -> str:
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (i:Item {chatId: $c}) RETURN i.text AS t", c=chat
    )
    return str(records[0]["t"])


async def test_decryptions_are_counted_on_metrics(api: Api) -> None:
    world = await make_world(api, ("ann",))
    chat = await api.chat(world.tokens["ann"], world.bot)
    for n in range(3):
        await api.turn(world.tokens["ann"], chat, f"message {n}")

    async def item_decryptions() -> float:
        text = (await api.http.get("/metrics")).text
        match = re.search(r'^botmemory_decryptions_total\{kind="item"\} (\S+)$', text, re.M)
        return float(match.group(1)) if match else 0.0

    before = await item_decryptions()
    await api.gql(
        "query($c: ID!) { chat(id: $c) { messages(limit: 2) { text } } }", {"c": chat}, world.tokens["ann"]
    )
    assert await item_decryptions() - before == 2


async def test_master_key_rotation_rewraps_data_keys_and_leaves_content_byte_identical(
    api: Api, runtime: Runtime
) -> None:
    world = await make_world(api, ("ann",))
    chat = await api.chat(world.tokens["ann"], world.bot)
    await api.turn(world.tokens["ann"], chat, "kept across rotation")
    query = (
        "MATCH (b:Bot {id: $b}) MATCH (i:Item {chatId: $c}) "
        "RETURN b.keyMaster AS m, b.keyWrapped AS w, i.uid AS uid, i.text AS text"
    )
    before = dict((await runtime.driver.execute_query(query, b=world.bot, c=chat)).records[0])
    old_key = runtime.settings.master_key_bytes()
    new_key = secrets.token_bytes(32)
    rotating = Keyring(new_key, [old_key])
    try:
        assert await rotate_data_keys(runtime.driver, rotating) >= 1
        after = dict((await runtime.driver.execute_query(query, b=world.bot, c=chat)).records[0])
        assert after["text"] == before["text"]
        assert after["m"] == rotating.current_id != before["m"]
        only_new = Keyring(new_key)
        assert (
            only_new.cipher(world.bot, _wrapped(after)).decrypt(Kind.ITEM, after["uid"], after["text"])
            == "kept across rotation"
        )
        with pytest.raises(DecryptionError):
            Keyring(old_key).unwrap(world.bot, _wrapped(after))
    finally:
        # Every Bot back under the test stack's master key, whatever failed above: under a key
        # nobody keeps, every later start on this store refuses (bootstrap._check_master_keys).
        assert await rotate_data_keys(runtime.driver, Keyring(old_key, [new_key])) >= 1


async def test_a_master_key_rotation_keeps_the_api_serving_throughout(
    api: Api, runtime: Runtime, settings: Settings, service_env: dict[str, str]
) -> None:
    """E1, "rotation without downtime", done as the README says: an API process given the new key
    with the old one among the previous keys serves Bots' content whose data keys it first meets
    wrapped by the old key (before the re-wrap), while they are being re-wrapped, and wrapped by
    the new one (after); a process not yet swapped, which has the new key among its previous ones
    (the README's first restart), serves a Bot that a swapped one created (its data key wrapped by
    the new key: a process that knew only the old key failed its every read); then a process
    given the new key alone starts and serves them all (the old key may be dropped). Before, only
    the re-wrap itself was tested, through the driver."""
    worlds = [await make_world(api, ("ann",)) for _ in range(8)]
    chats: list[str] = []
    for n, world in enumerate(worlds):
        chats.append(await api.chat(world.tokens["ann"], world.bot))
        await api.turn(world.tokens["ann"], chats[-1], f"kept across rotation {n}")
    old = runtime.settings.master_key
    assert old is not None
    old_key, new_key = runtime.settings.master_key_bytes(), secrets.token_bytes(32)
    new = base64.b64encode(new_key).decode()
    logs = settings.data_dir / "logs"
    both = {
        "BOTMEMORY_MASTER_KEY": new,
        "BOTMEMORY_PREVIOUS_MASTER_KEYS": json.dumps([old.get_secret_value()]),
    }
    first_step = {
        "BOTMEMORY_MASTER_KEY": old.get_secret_value(),
        "BOTMEMORY_PREVIOUS_MASTER_KEYS": json.dumps([new]),
    }
    processes: list[ApiProcess] = []
    try:
        processes.append(
            await asyncio.to_thread(
                ApiProcess, settings, logs / "pytest-api-rotating.log", service_env | both
            )
        )
        rotating = processes[0]
        processes.append(
            await asyncio.to_thread(
                ApiProcess, settings, logs / "pytest-api-not-swapped.log", service_env | first_step
            )
        )
        not_swapped = processes[1]
        async with httpx.AsyncClient(base_url=rotating.url, timeout=30) as http:
            swapped_api = Api(http, api.admin_token)
            worlds.append(await make_world(swapped_api, ("ann",)))  # its data key: the new key's
            chats.append(await swapped_api.chat(worlds[-1].tokens["ann"], worlds[-1].bot))
            await swapped_api.turn(
                worlds[-1].tokens["ann"], chats[-1], f"kept across rotation {len(chats) - 1}"
            )
        made_swapped = len(worlds) - 1

        async def texts(url: str, n: int) -> list[str]:
            """Chat n's messages, read through the API at ``url`` (its first read of that Bot
            unwraps the Bot's data key)."""
            headers = {"Authorization": f"Bearer {worlds[n].tokens['ann']}"}
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                response = await http.get(f"/v1/chats/{chats[n]}/messages", headers=headers)
            assert response.status_code == 200, response.text
            return [m["text"] for m in response.json()["messages"]]

        assert await texts(rotating.url, 0) == ["kept across rotation 0"]  # wrapped by the old key

        assert await texts(not_swapped.url, made_swapped) == [f"kept across rotation {made_swapped}"]

        async def first_reads() -> None:  # each Bot's first read, while the keys are re-wrapped
            for n in range(1, made_swapped - 1):
                assert await texts(rotating.url, n) == [f"kept across rotation {n}"]

        reading = asyncio.create_task(first_reads())
        try:
            assert await rotate_data_keys(runtime.driver, Keyring(new_key, [old_key])) >= made_swapped
        finally:
            await reading
        last = made_swapped - 1
        assert await texts(rotating.url, last) == [f"kept across rotation {last}"]  # by the new key
        only_new = {"BOTMEMORY_MASTER_KEY": new, "BOTMEMORY_PREVIOUS_MASTER_KEYS": "[]"}
        processes.append(
            await asyncio.to_thread(
                ApiProcess, settings, logs / "pytest-api-rotated.log", service_env | only_new
            )
        )
        for n in (0, last, made_swapped):
            assert await texts(processes[-1].url, n) == [f"kept across rotation {n}"]
    finally:
        for process in processes:
            process.stop()
        # Every Bot back under the test stack's master key (see the test above), the one the
        # swapped process made included: a later process would refuse to start.
        await rotate_data_keys(runtime.driver, Keyring(old_key, [new_key]))


async def test_a_process_without_the_master_key_of_the_bots_refuses_to_start(
    api: Api, runtime: Runtime, settings: Settings
) -> None:
    """E1: a process given another master key than the one the Bots' data keys are wrapped by (a
    lost or mistyped key, the old one left out during a rotation) started healthy and failed
    every read of their content with INTERNAL. It refuses to start now, naming the setting; with
    the old key among the previous ones it starts (a rotation)."""
    await make_world(api, ("ann",))  # at least one Bot under the stack's key
    other = base64.b64encode(secrets.token_bytes(32)).decode()
    stranger = settings.resolved().model_copy(update={"master_key": SecretStr(other)})
    with pytest.raises(ConfigurationError, match="BOTMEMORY_MASTER_KEY") as refused:
        async with open_runtime(stranger, schema="wait"):
            pass
    assert other not in str(refused.value)  # named by its fingerprint, never quoted
    current = runtime.settings.master_key
    assert current is not None
    rotating = stranger.model_copy(update={"previous_master_keys": [current]})
    async with open_runtime(rotating, schema="wait") as rt:
        assert runtime.keyring.current_id in rt.keyring.known_ids


def _wrapped(row: dict[str, object]):  # type: ignore[no-untyped-def]
    from services.crypto import WrappedKey

    return WrappedKey(str(row["m"]), bytes(row["w"]))  # type: ignore[arg-type]


def test_a_new_master_key_is_refused_while_a_data_key_is_under_another(
    settings: Settings, tmp_path: Path
) -> None:
    """``rotate-master-key --generate`` makes the current key the previous one and drops the one
    before: run again after a rotation that did not finish (or with Bots a process made under an
    older key), it dropped the key their data keys were wrapped by — every Bot's data lost. It now
    refuses then, and when the store does not answer, before anything is written."""
    key = tmp_path / "master-key"
    key.write_text(base64.b64encode(secrets.token_bytes(32)).decode() + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOTMEMORY_")}
    env |= {
        "BOTMEMORY_ENV": "test",
        "BOTMEMORY_DATA_DIR": str(tmp_path),
        "BOTMEMORY_NEO4J_URI": settings.neo4j_uri,
        "BOTMEMORY_NEO4J_PASSWORD": settings.resolved().neo4j_password.get_secret_value(),  # type: ignore[union-attr]
        "BOTMEMORY_REDIS_URL": settings.redis_url,
    }

    def generate(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "botmemory.cli", "rotate-master-key", "--generate"],
            env=env | extra,
            capture_output=True,
            text=True,
            check=False,
        )

    before = key.read_text()
    # Every Bot of the test store is wrapped by the stack's key, not by this data dir's.
    refused = generate()
    assert refused.returncode != 0 and "CONFLICT" in refused.stderr, refused.stderr
    assert key.read_text() == before and not (tmp_path / "master-key.previous").exists()
    unreachable = generate(BOTMEMORY_NEO4J_URI="bolt://127.0.0.1:1")
    assert unreachable.returncode != 0
    assert key.read_text() == before and not (tmp_path / "master-key.previous").exists()
    # A rotation that cannot re-wrap every data key says so and fails (README: "then drop the old
    # key" must not follow). Before, the first data key wrapped by a key it did not know ended
    # the command as INTERNAL, and every Bot after it was left as it was, uncounted.
    rotate = subprocess.run(
        [sys.executable, "-m", "botmemory.cli", "rotate-master-key"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert rotate.returncode != 0 and "CONFLICT" in rotate.stderr, rotate.stderr
    assert "re-wrapped 0 data keys" in rotate.stdout and "still not wrapped" in rotate.stderr
