"""Identity and provisioning: organizations, people and tokens (D9.5), channels, Bots, grants, links."""

from __future__ import annotations

from neo4j import AsyncManagedTransaction

from graph import bots as bots_q
from graph import identity
from graph.driver import autocommit, read, write
from services import idempotency, turnfeed
from services.auth import require_admin, require_person
from services.domain import Access, Bot, Channel, Organization, Person, Principal
from services.errors import BadInput, Conflict, Forbidden, NotFound, ServiceError, Unauthenticated
from services.idempotency import Key
from services.ids import new_id, new_token
from services.runtime import Runtime, now_ms
from services.validation import check_expected, check_id, check_ids, check_name, check_time_zone

_MAX_TOKEN_TTL_SECONDS = 366 * 24 * 3600


async def create_organization(
    rt: Runtime, principal: Principal, name: str, key: Key | None = None
) -> Organization:
    """``key``: the admin's idempotency key (D9.35): sent again, the organization it created."""
    require_admin(principal)
    org_id, name, now = new_id("org"), check_name(name), now_ms()

    async def work(tx: AsyncManagedTransaction) -> identity.OrganizationNode:
        await idempotency.claim(tx, rt, key, resource_id=org_id)
        return await identity.create_organization(tx, id=org_id, name=name, now=now)

    async def create() -> Organization:
        return Organization.of(await write(rt.driver, work))

    async def again(created: idempotency.Created) -> Organization:
        return await get_organization(rt, principal, created.resource_id)

    return await idempotency.once(rt, key, create, again)


async def get_organization(rt: Runtime, principal: Principal, org_id: str) -> Organization:
    check_id(org_id, "id")
    if principal.kind != "admin" and principal.organization_id != org_id:
        raise NotFound("organization not found")
    row = await read(rt.driver, lambda tx: identity.get_organization(tx, id=org_id))
    if row is None:
        raise NotFound("organization not found")
    return Organization.of(row)


async def update_organization(
    rt: Runtime,
    principal: Principal,
    org_id: str,
    *,
    bot_memory: bool | None,
    set_model: bool,
    bot_memory_model: str | None,
) -> Organization:
    """Change ``botMemory`` and/or ``botMemoryModel`` (``set_model`` distinguishes null from absent)."""
    require_admin(principal)
    check_id(org_id, "id")
    if bot_memory_model is not None:
        bot_memory_model = check_name(bot_memory_model, "botMemoryModel")
    row = await write(
        rt.driver,
        lambda tx: identity.update_organization(
            tx, id=org_id, bot_memory=bot_memory, set_model=set_model, bot_memory_model=bot_memory_model
        ),
    )
    if row is None:
        raise NotFound("organization not found")
    return Organization.of(row)


async def create_person(
    rt: Runtime, principal: Principal, organization_id: str, name: str, time_zone: str | None = None
) -> tuple[Person, str, str]:
    """Create a person and return their first token's id and the token, shown only this once
    (D9.5). The id is what revokes it: without it the first token could never be revoked.
    ``time_zone``: the zone their words are said in (D9.32), None for UTC."""
    require_admin(principal)
    check_id(organization_id, "organizationId")
    person_id, name, now = new_id("u"), check_name(name), now_ms()
    time_zone = check_time_zone(time_zone, "timeZone")
    token_id, token, token_hash = new_token("bmp")
    row = await write(
        rt.driver,
        lambda tx: identity.create_person(
            tx,
            id=person_id,
            organization_id=organization_id,
            name=name,
            token_id=token_id,
            token_hash=token_hash,
            now=now,
            time_zone=time_zone,
        ),
    )
    if row is None:
        raise NotFound("organization not found")
    return Person.of(row), token_id, token


async def me(rt: Runtime, principal: Principal) -> Person:
    person_id = require_person(principal)
    row = await autocommit(rt.driver, lambda s: identity.get_person(s, id=person_id))
    if row is None:
        raise NotFound("person not found")
    return Person.of(row)


async def set_time_zone(rt: Runtime, principal: Principal, time_zone: str | None) -> Person:
    """A person sets the time zone they speak in (D9.32; None: UTC): their Items said from now on
    keep it, so that "yesterday" and the days they name are read as they live them. Items said
    before keep the zone they were said in."""
    person_id = require_person(principal)
    time_zone = check_time_zone(time_zone, "timeZone")
    row = await write(rt.driver, lambda tx: identity.set_time_zone(tx, id=person_id, time_zone=time_zone))
    if row is None:
        raise NotFound("person not found")
    return Person.of(row)


async def issue_token(rt: Runtime, principal: Principal, expires_in_seconds: int | None) -> tuple[str, str]:
    """A person issues another token for themselves; nobody else can (D9.5, V7). It expires no
    later than the token that issued it and is revoked with it (``identity.CREATE_PERSON_TOKEN``)."""
    person_id = require_person(principal)
    if expires_in_seconds is not None and not 60 <= expires_in_seconds <= _MAX_TOKEN_TTL_SECONDS:
        raise BadInput(
            f"expiresInSeconds must be between 60 and {_MAX_TOKEN_TTL_SECONDS}", field="expiresInSeconds"
        )
    token_id, token, token_hash = new_token("bmp")
    now = now_ms()
    expires_at = None if expires_in_seconds is None else now + expires_in_seconds * 1000
    issued = await write(
        rt.driver,
        lambda tx: identity.create_person_token(
            tx,
            person_id=person_id,
            token_id=token_id,
            token_hash=token_hash,
            now=now,
            expires_at=expires_at,
            parent_id=principal.token_id,
        ),
    )
    if not issued:  # the issuing token was revoked meanwhile (or the person is gone)
        raise Unauthenticated("invalid, expired or revoked token")
    return token_id, token


async def create_platform_token(rt: Runtime, principal: Principal, organization_id: str) -> tuple[str, str]:
    """A platform token of one organization (D9.5): acts for people of its Chats, reads no memory."""
    require_admin(principal)
    check_id(organization_id, "organizationId")
    token_id, token, token_hash = new_token("bmk")
    now = now_ms()
    created = await write(
        rt.driver,
        lambda tx: identity.create_platform_token(
            tx, organization_id=organization_id, token_id=token_id, token_hash=token_hash, now=now
        ),
    )
    if not created:
        raise NotFound("organization not found")
    return token_id, token


async def revoke_token(rt: Runtime, principal: Principal, token_id: str) -> str:
    """The admin revokes any token; a person revokes their own. Unknown and foreign ids look alike."""
    check_id(token_id, "tokenId")
    owner = await read(rt.driver, lambda tx: identity.token_owner(tx, token_id=token_id))
    mine = owner is not None and principal.kind == "person" and owner["ownerId"] == principal.person_id
    if owner is None or not (principal.kind == "admin" or mine):
        raise NotFound("token not found")
    now = now_ms()
    await write(rt.driver, lambda tx: identity.revoke_token(tx, token_id=token_id, now=now))
    await turnfeed.announce_access_change(rt)  # streams of turns on it (or its children) end
    return token_id


async def remove_person(rt: Runtime, principal: Principal, person_id: str) -> Person:
    """Remove a person from their organization (the admin's offboarding, D9.34): out of every channel, no
    grant on any Bot, every token revoked, in one transaction, and never a member, a grantee or
    an actor of a chat again; their open streams end. What they said and what was learned of it
    stay, under the same rules (their private memory now has no reader). Removed again: as it is."""
    require_admin(principal)
    check_id(person_id, "personId")
    now = now_ms()
    row = await write(rt.driver, lambda tx: identity.remove_person(tx, id=person_id, now=now))
    if row is None:
        raise NotFound("person not found")
    await turnfeed.announce_access_change(rt)  # their streams, and a channel's turn streams, end
    return Person.of(row)


_MEMBERS_REFUSED = "every member must be a person of the channel's organization"


async def _check_members(rt: Runtime, organization_id: str, member_ids: list[str]) -> list[str]:
    members = check_ids(member_ids, "memberIds")
    found = await read(
        rt.driver,
        lambda tx: identity.count_people_in_org(tx, person_ids=members, organization_id=organization_id),
    )
    if found != len(members):
        raise BadInput(_MEMBERS_REFUSED, field="memberIds")
    return members


async def create_channel(
    rt: Runtime,
    principal: Principal,
    organization_id: str,
    name: str,
    member_ids: list[str],
    key: Key | None = None,
) -> Channel:
    """``key``: the admin's idempotency key (D9.35): sent again, the channel it created, as it
    stands now."""
    require_admin(principal)
    check_id(organization_id, "organizationId")

    async def create() -> Channel:
        if await read(rt.driver, lambda tx: identity.get_organization(tx, id=organization_id)) is None:
            raise NotFound("organization not found")
        members = await _check_members(rt, organization_id, member_ids)
        channel_id, named, now = new_id("ch"), check_name(name), now_ms()

        async def work(tx: AsyncManagedTransaction) -> identity.ChannelMap | None:
            await idempotency.claim(tx, rt, key, resource_id=channel_id)
            made = await identity.create_channel(
                tx, id=channel_id, organization_id=organization_id, name=named, member_ids=members, now=now
            )
            if made != len(members):  # one removed since they were checked: nothing is made
                raise BadInput(_MEMBERS_REFUSED, field="memberIds")
            # Read in the same transaction: read after its commit, a database gone in between
            # answered 503 for a channel that was made, and the admin's retry made a second one.
            return await identity.get_channel(tx, id=channel_id)

        row = await write(rt.driver, work)
        assert row is not None  # made in this transaction
        return Channel.of(row)

    async def again(created: idempotency.Created) -> Channel:
        return await get_channel(rt, principal, created.resource_id)

    return await idempotency.once(rt, key, create, again)


async def get_channel(rt: Runtime, principal: Principal, channel_id: str) -> Channel:
    check_id(channel_id, "channelId")
    row = await read(rt.driver, lambda tx: identity.get_channel(tx, id=channel_id))
    if row is None or (principal.kind != "admin" and row["organizationId"] != principal.organization_id):
        raise NotFound("channel not found")
    return Channel.of(row)


async def set_channel_members(
    rt: Runtime, principal: Principal, channel_id: str, member_ids: list[str], expected: int | None = None
) -> Channel:
    """The Channel's members become ``member_ids``. ``expected``: the Channel's ``version`` the
    caller read — CONFLICT when its members were set since, so that two admins editing the list
    never overwrite each other unseen (the last one's list replaced the other's, both told it
    was done)."""
    require_admin(principal)
    check_expected(expected)
    channel = await get_channel(rt, principal, channel_id)
    members = await _check_members(rt, channel.organization_id, member_ids)

    async def work(tx: AsyncManagedTransaction) -> identity.ChannelMap | None:
        version = await identity.lock_channel(tx, id=channel_id)
        if version is None:
            return None
        if expected is not None and version != expected:
            raise Conflict(
                f"the channel's members were set since version {expected} (now {version}): read them again"
            )
        if await identity.set_channel_members(tx, id=channel_id, member_ids=members) != len(members):
            raise BadInput(_MEMBERS_REFUSED, field="memberIds")  # one removed since they were checked
        # Read in the same transaction (as create_channel): read after the commit, an outage in
        # between answered 503 for a change that was made.
        return await identity.get_channel(tx, id=channel_id)

    row = await write(rt.driver, work)
    if row is None:
        raise NotFound("channel not found")
    await turnfeed.announce_access_change(rt)  # a removed member's turn streams end
    return Channel.of(row)


async def create_bot(
    rt: Runtime,
    principal: Principal,
    organization_id: str,
    name: str,
    model: str | None,
    key: Key | None = None,
) -> Bot:
    """Create a Bot, its Memory and its data key wrapped by the current master key (E1). ``key``:
    the admin's idempotency key (D9.35): sent again, the Bot it created, as it stands now."""
    require_admin(principal)
    check_id(organization_id, "organizationId")
    bot_id, name, now = new_id("bot"), check_name(name), now_ms()
    model = None if model is None else check_name(model, "model")

    async def create() -> Bot:
        data_key = rt.keyring.new_data_key(bot_id)  # one, whichever attempt of the transaction commits

        async def work(tx: AsyncManagedTransaction) -> bots_q.NewBotMap:
            await idempotency.claim(tx, rt, key, resource_id=bot_id)
            row = await bots_q.create_bot(
                tx,
                id=bot_id,
                organization_id=organization_id,
                name=name,
                model=model,
                key_master=data_key.master_id,
                key_wrapped=data_key.wrapped,
                now=now,
            )
            if row is None:  # raised here: the claim goes with the transaction
                raise NotFound("organization not found")
            return row

        return Bot.of({**(await write(rt.driver, work)), "linkedOrganizationIds": []})

    async def again(created: idempotency.Created) -> Bot:
        return await get_bot(rt, principal, created.resource_id)

    return await idempotency.once(rt, key, create, again)


def _visible_bot(principal: Principal, row: bots_q.BotMap | None) -> Bot | NotFound:
    """The Bot when the caller's organization owns or links it (or the caller is the admin)."""
    if row is None:
        return NotFound("bot not found")
    bot, org = Bot.of(row), principal.organization_id
    if principal.kind == "admin":
        return bot
    if org != bot.organization_id and org not in bot.linked_organization_ids:
        return NotFound("bot not found")
    return bot.seen_from(org)


async def get_bots(rt: Runtime, principal: Principal, bot_ids: list[str]) -> list[Bot | ServiceError]:
    """:func:`get_bot` of each id, in one statement: the Bot, or that id's NOT_FOUND or BAD_INPUT."""
    errors: dict[str, BadInput] = {}
    for bot_id in bot_ids:
        try:
            check_id(bot_id, "botId")
        except BadInput as exc:
            errors[bot_id] = exc
    ids = [b for b in dict.fromkeys(bot_ids) if b not in errors]
    found = await read(rt.driver, lambda tx: bots_q.get_bots(tx, ids=ids)) if ids else {}
    return [errors.get(b) or _visible_bot(principal, found.get(b)) for b in bot_ids]


async def get_bot(rt: Runtime, principal: Principal, bot_id: str) -> Bot:
    """A Bot as seen from the caller's organization (owner or linked); others get NOT_FOUND."""
    (bot,) = await get_bots(rt, principal, [bot_id])
    if isinstance(bot, ServiceError):
        raise bot
    return bot


async def usable_bots(rt: Runtime, principal: Principal) -> list[Bot]:
    """The Bots the caller can use: a person's granted Bots of their organization (owned or
    linked); a platform token's organization's Bots; every Bot for the admin."""
    person = principal.person_id if principal.kind == "person" else None
    org = None if principal.kind == "admin" else principal.organization_id
    found = await read(rt.driver, lambda tx: bots_q.usable_bots(tx, person_id=person, org=org))
    return [Bot.of(row).seen_from(org) for row in found]


async def grant_bot(rt: Runtime, principal: Principal, bot_id: str, person_id: str, access: Access) -> Bot:
    """Give a person READ or WRITE on a Bot (NONE removes it); the person's organization must use the Bot."""
    require_admin(principal)
    bot = await get_bot(rt, principal, bot_id)
    check_id(person_id, "personId")
    person = await read(rt.driver, lambda tx: identity.get_person(tx, id=person_id))
    if person is None:
        raise NotFound("person not found")
    if "removedAt" in person and access is not Access.NONE:
        raise BadInput("the person was removed from their organization", field="personId")
    if person["organizationId"] not in (bot.organization_id, *bot.linked_organization_ids):
        raise Forbidden("the person's organization neither owns nor links this Bot")
    if not await write(
        rt.driver, lambda tx: bots_q.set_grant(tx, bot_id=bot_id, person_id=person_id, access=access.value)
    ):
        raise BadInput("the person was removed from their organization", field="personId")
    await turnfeed.announce_access_change(rt)  # feeds of someone who lost the grant end at once
    return bot


async def link_bot(rt: Runtime, principal: Principal, bot_id: str, organization_id: str) -> Bot:
    """Share a Bot with another organization (a shared Bot)."""
    require_admin(principal)
    check_id(organization_id, "organizationId")
    bot = await get_bot(rt, principal, bot_id)
    if organization_id == bot.organization_id:
        raise BadInput("a Bot cannot be linked into its own organization", field="organizationId")
    if not await write(
        rt.driver, lambda tx: bots_q.link_bot(tx, bot_id=bot_id, organization_id=organization_id)
    ):
        raise NotFound("organization not found")
    return await get_bot(rt, principal, bot_id)
