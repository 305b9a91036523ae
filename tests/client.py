"""A small GraphQL/REST client for the tests, plus builders of a provisioned world."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

import httpx


class GraphQLErrors(AssertionError):
    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors)
        self.errors = errors

    @property
    def codes(self) -> list[str]:
        return [e.get("extensions", {}).get("code") for e in self.errors]


def bearer(token: str) -> dict[str, str]:
    """The REST and GraphQL authorization header of a token."""
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Api:
    http: httpx.AsyncClient
    admin_token: str

    async def raw(
        self, query: str, variables: dict[str, Any] | None = None, token: str | None = None
    ) -> dict[str, Any]:
        headers = bearer(token) if token else {}
        response = await self.http.post(
            "/graphql", json={"query": query, "variables": variables or {}}, headers=headers
        )
        body: dict[str, Any] = response.json()
        return body

    async def gql(
        self, query: str, variables: dict[str, Any] | None = None, token: str | None = None
    ) -> dict[str, Any]:
        """Data of a successful operation; raises GraphQLErrors otherwise."""
        body = await self.raw(query, variables, token)
        if body.get("errors"):
            raise GraphQLErrors(body["errors"])
        return body["data"]

    async def codes(
        self, query: str, variables: dict[str, Any] | None = None, token: str | None = None
    ) -> list[str]:
        body = await self.raw(query, variables, token)
        errors: list[dict[str, Any]] = body.get("errors") or []
        return [e.get("extensions", {}).get("code") for e in errors]

    async def admin(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.gql(query, variables, self.admin_token)

    # Builders -----------------------------------------------------------------------------

    async def organization(self, name: str = "org") -> str:
        data = await self.admin("mutation($n: String!) { createOrganization(name: $n) { id } }", {"n": name})
        return data["createOrganization"]["id"]

    async def person(self, org: str, name: str = "person") -> tuple[str, str]:
        data = await self.admin(
            "mutation($o: ID!, $n: String!) { createPerson(organizationId: $o, name: $n) { person { id } token } }",
            {"o": org, "n": name},
        )
        return data["createPerson"]["person"]["id"], data["createPerson"]["token"]

    async def bot(self, org: str, name: str = "bot") -> str:
        data = await self.admin(
            "mutation($o: ID!, $n: String!) { createBot(organizationId: $o, name: $n) { id } }",
            {"o": org, "n": name},
        )
        return data["createBot"]["id"]

    async def grant(self, bot: str, person: str, access: str = "WRITE") -> None:
        await self.admin(
            "mutation($b: ID!, $p: ID!, $a: Access!) { grantBot(botId: $b, personId: $p, access: $a) { id } }",
            {"b": bot, "p": person, "a": access},
        )

    async def channel(self, org: str, members: list[str]) -> str:
        data = await self.admin(
            'mutation($o: ID!, $m: [ID!]!) { createChannel(organizationId: $o, name: "team", memberIds: $m) { id } }',
            {"o": org, "m": members},
        )
        return data["createChannel"]["id"]

    async def platform_token(self, org: str) -> str:
        data = await self.admin(
            "mutation($o: ID!) { createPlatformToken(organizationId: $o) { token } }", {"o": org}
        )
        return data["createPlatformToken"]["token"]

    async def chat(self, token: str, bot: str, channel: str | None = None, review: bool = False) -> str:
        data = await self.gql(
            "mutation($b: ID!, $c: ID, $r: Boolean!) { createChat(botId: $b, channelId: $c, review: $r) { id } }",
            {"b": bot, "c": channel, "r": review},
            token,
        )
        return data["createChat"]["id"]

    async def turn(self, token: str, chat: str, text: str, **extra: Any) -> dict[str, Any]:
        data = await self.gql(
            "mutation($c: ID!, $t: String!, $a: ID, $n: Boolean!, $s: Long, $z: String) {"
            " startTurn(chatId: $c, input: $t, actorId: $a, notice: $n, saidAt: $s, timeZone: $z)"
            " { id input enrichedInput actorKind actorId status } }",
            {
                "c": chat,
                "t": text,
                "a": extra.get("actor"),
                "n": extra.get("notice", False),
                "s": extra.get("said_at"),
                "z": extra.get("time_zone"),
            },
            token,
        )
        return data["startTurn"]


@dataclass
class World:
    """One organization with people (and their tokens), a Bot granted to all, and a channel."""

    org: str
    bot: str
    people: dict[str, str] = field(default_factory=dict[str, str])  # name -> id
    tokens: dict[str, str] = field(default_factory=dict[str, str])  # name -> token
    channel: str | None = None


async def make_world(
    api: Api, names: tuple[str, ...] = ("ann", "bob", "cat"), *, channel: tuple[str, ...] = ()
) -> World:
    org = await api.organization(f"org-{secrets.token_hex(3)}")
    bot = await api.bot(org)
    world = World(org=org, bot=bot)
    for name in names:
        pid, token = await api.person(org, name)
        world.people[name], world.tokens[name] = pid, token
        await api.grant(bot, pid)
    if channel:
        world.channel = await api.channel(org, [world.people[n] for n in channel])
    return world
