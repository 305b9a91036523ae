"""``make demo``: a guided tour against the running stack (``make up``).

It provisions an organization with three people, a channel of two of them and a Bot, then shows
step by step: memory learned in one chat and used in another, what a group member can and cannot
see, and the context pack of a group chat. Everything goes through the public API (GraphQL and
REST) with the tokens a platform and its people would hold.

    python -m tools.demo [--api http://127.0.0.1:8000] [--model gpt-4o-mini]
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from typing import Any

import httpx

from services.settings import load_settings

NO_MODEL = """The stack has no model endpoint, so the memory Bot cannot learn or rewrite anything.

Set these in the environment of `make up`, then restart it:

    export OPENAI_BASE_URL=https://api.openai.com/v1   # or any OpenAI-compatible server (vLLM, Ollama…)
    export OPENAI_API_KEY=sk-...
    make down && make up

and run the demo with the model name your endpoint serves:

    make demo DEMO_MODEL=gpt-4o-mini
"""


class Demo:
    def __init__(self, api: str, admin_token: str, model: str, wait: float) -> None:
        self.http = httpx.Client(base_url=api, timeout=60)
        self.admin_token = admin_token
        self.model = model
        self.wait = wait
        self.step_no = 0

    def step(self, title: str) -> None:
        self.step_no += 1
        print(f"\n== {self.step_no}. {title}")

    def gql(
        self, query: str, variables: dict[str, Any] | None = None, token: str | None = None
    ) -> dict[str, Any]:
        response = self.http.post(
            "/graphql",
            json={"query": query, "variables": variables or {}},
            headers={"Authorization": f"Bearer {token or self.admin_token}"},
        )
        body = response.json()
        if body.get("errors"):
            raise SystemExit(f"GraphQL error: {body['errors'][0].get('message')}")
        return body["data"]

    def rest(self, path: str, token: str) -> Any:
        response = self.http.get(path, headers={"Authorization": f"Bearer {token}"})
        response.raise_for_status()
        return response.json()

    def memory_of(self, token: str, bot: str) -> list[str]:
        return [e["content"] for e in self.rest(f"/v1/bots/{bot}/memory", token)["entries"]]

    def learn_from(self, platform: str, chat: str, actor: str, words: str, bot_words: str) -> str:
        """What a platform does for one Turn of its Bot: the person's words, the Bot's reply, the
        Bot confiding (its tool), the Turn completed — then the memory Bot learns in the background."""
        turn = self.gql(
            "mutation($c: ID!, $t: String!, $a: ID) { startTurn(chatId: $c, input: $t, actorId: $a) { id } }",
            {"c": chat, "t": words, "a": actor},
            platform,
        )["startTurn"]["id"]
        self.gql(
            "mutation($t: ID!, $x: String!) { addItems(turnId: $t, items: [{kind: BOT_MESSAGE, text: $x}]) { id } }",
            {"t": turn, "x": bot_words},
            platform,
        )
        answer = self.gql(
            'mutation($t: ID!) { confide(turnId: $t, text: "I am not sure I understood what matters to them.") { answer } }',
            {"t": turn},
            platform,
        )["confide"]["answer"]
        print(f"   the Bot confided; the memory Bot answered: {answer!r}")
        self.gql("mutation($t: ID!) { completeTurn(turnId: $t) { id } }", {"t": turn}, platform)
        return turn

    def wait_for(self, token: str, bot: str, count: int) -> list[str]:
        deadline = time.monotonic() + self.wait
        found: list[str] = []
        while time.monotonic() < deadline:
            found = self.memory_of(token, bot)
            if len(found) >= count:
                return found
            time.sleep(0.2)
        return found

    def run(self) -> int:
        health = self.http.get("/healthz").json()
        if health.get("status") != "ok":
            print(f"The stack is not healthy ({health}); start it with `make up`.")
            return 2
        if health.get("model") != "configured":
            print(NO_MODEL)
            return 2
        tag = secrets.token_hex(3)

        self.step("Provision an organization, three people, a channel of two and a Bot")
        org = self.gql("mutation($n: String!) { createOrganization(name: $n) { id } }", {"n": f"demo-{tag}"})[
            "createOrganization"
        ]["id"]
        self.gql(
            "mutation($o: ID!, $m: String) { updateOrganization(id: $o, botMemoryModel: $m) { id } }",
            {"o": org, "m": self.model},
        )
        people: dict[str, tuple[str, str]] = {}
        bot = self.gql(
            'mutation($o: ID!, $m: String) { createBot(organizationId: $o, name: "Ada", model: $m) { id } }',
            {"o": org, "m": self.model},
        )["createBot"]["id"]
        for name in ("ann", "bob", "cat"):
            created = self.gql(
                "mutation($o: ID!, $n: String!) { createPerson(organizationId: $o, name: $n) { person { id } token } }",
                {"o": org, "n": name},
            )["createPerson"]
            people[name] = (created["person"]["id"], created["token"])
            self.gql(
                "mutation($b: ID!, $p: ID!) { grantBot(botId: $b, personId: $p, access: WRITE) { id } }",
                {"b": bot, "p": people[name][0]},
            )
        channel = self.gql(
            'mutation($o: ID!, $m: [ID!]!) { createChannel(organizationId: $o, name: "team", memberIds: $m) { id } }',
            {"o": org, "m": [people["ann"][0], people["bob"][0]]},
        )["createChannel"]["id"]
        platform = self.gql(
            "mutation($o: ID!) { createPlatformToken(organizationId: $o) { token } }", {"o": org}
        )["createPlatformToken"]["token"]
        print(
            f"   organization {org} (model {self.model}), Bot {bot}; ann and bob are in channel 'team', cat is not"
        )

        def chat_of(owner: str, group: bool = False) -> str:
            return self.gql(
                "mutation($b: ID!, $c: ID) { createChat(botId: $b, channelId: $c) { id } }",
                {"b": bot, "c": channel if group else None},
                people[owner][1],
            )["createChat"]["id"]

        self.step("Ann tells the Bot something about herself in a private chat")
        private = chat_of("ann")
        said = "I'm vegetarian, so please never suggest meat dishes to me."
        print(f"   ann: {said}")
        self.learn_from(platform, private, people["ann"][0], said, "Noted, no meat for you.")
        learned = self.wait_for(people["ann"][1], bot, 1)
        print(f"   learned for ann only: {learned or '(nothing yet — is the worker running?)'}")

        self.step("In another chat, Ann's input is rewritten with what she may see")
        other = chat_of("ann")
        turn = self.gql(
            'mutation($c: ID!) { startTurn(chatId: $c, input: "Suggest a dinner for tonight.") { input enrichedInput } }',
            {"c": other},
            people["ann"][1],
        )["startTurn"]
        print(f"   ann wrote:        {turn['input']}")
        print(f"   the Bot receives: {turn['enrichedInput']}")
        print("   (the chat's history keeps Ann's own words; only the startTurn caller sees the rewrite)")

        self.step("Bob says something in the team's group chat")
        group = chat_of("ann", group=True)
        team_said = "Our team standup moved to 9:30 every morning."
        print(f"   bob: {team_said}")
        self.learn_from(platform, group, people["bob"][0], team_said, "Got it, standup at 9:30.")
        self.wait_for(people["bob"][1], bot, 1)

        self.step("Who sees what")
        for name in ("ann", "bob", "cat"):
            print(f"   {name} sees: {self.memory_of(people[name][1], bot)}")
        print(
            "   ann sees her own entry and the team's; bob only the team's; cat (not in the channel) nothing"
        )

        self.step("A group member's input is enriched only with what every member may see")
        turn = self.gql(
            'mutation($c: ID!) { startTurn(chatId: $c, input: "When is standup, and what should we order for lunch?") { input enrichedInput } }',
            {"c": group},
            people["bob"][1],
        )["startTurn"]
        print(f"   bob wrote:        {turn['input']}")
        print(f"   the Bot receives: {turn['enrichedInput']}")
        print("   (Ann's private entry is never sent to the model for the group)")

        self.step("The group chat's context pack (built for its audience)")
        pack = self.rest(f"/v1/chats/{group}/context", people["ann"][1])
        print(f"   memory: {pack['memory']['text']!r}")
        print(f"   last messages: {[m['text'] for m in pack['lastMessages']]}")
        print("\nDone. Explore further in GraphiQL:", str(self.http.base_url) + "/graphql")
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    settings = load_settings()
    parser.add_argument(
        "--api",
        default=os.environ.get("BOTMEMORY_DEMO_API", f"http://{settings.api_host}:{settings.api_port}"),
    )
    parser.add_argument("--model", default=os.environ.get("DEMO_MODEL") or "gpt-4o-mini")
    parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for learning")
    args = parser.parse_args(argv)
    assert settings.admin_token is not None
    try:
        return Demo(args.api, settings.admin_token.get_secret_value(), args.model, args.wait).run()
    except httpx.HTTPError as exc:
        print(f"Cannot reach the API at {args.api} ({type(exc).__name__}); start the stack with `make up`.")
        return 2


if __name__ == "__main__":
    sys.exit(main())
