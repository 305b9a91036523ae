"""``make demo``: a guided tour against the running stack (``make up``).

It provisions an organization with three people, a channel of two of them and a Bot, then shows
step by step: memory learned in one chat and used in another, what a group member can and cannot
see, and the context pack of a group chat. Everything goes through the public API with the tokens
a platform and its people would hold: GraphQL through the Python client (``botmemory_client``),
REST with httpx.

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

from botmemory_client import BotMemory
from botmemory_client.generated_sync.enums import Access, ItemKind
from botmemory_client.generated_sync.exceptions import GraphQLClientError, GraphQLClientGraphQLMultiError
from botmemory_client.generated_sync.input_types import ItemInput
from services.settings import load_settings
from tools.stores import STUB_MODEL

NO_MODEL = """The stack has no model endpoint, so the memory Bot cannot learn or rewrite anything.
(`make up` without OPENAI_BASE_URL starts the offline model stub; this stack was started otherwise.)

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
        self.api = api
        self.admin_token = admin_token
        self.model = model
        self.wait = wait
        self.step_no = 0
        self.clients: dict[str, BotMemory] = {}
        self.tty = sys.stdout.isatty()

    def step(self, title: str) -> None:
        self.step_no += 1
        print(f"\n== {self.step_no}. {title}")

    def graphql(self, token: str | None = None) -> BotMemory:
        """The GraphQL client of one token (the admin's by default)."""
        token = token or self.admin_token
        if token not in self.clients:
            self.clients[token] = BotMemory(self.api, token, timeout=60)
        return self.clients[token]

    def close(self) -> None:
        for client in self.clients.values():
            client.http_client.close()
        self.http.close()

    def progress(self, text: str | None) -> None:
        """A status line rewritten in place on a terminal (one line each elsewhere); None clears it."""
        if self.tty:
            sys.stdout.write("\r\x1b[K" + (text or ""))
            sys.stdout.flush()
        elif text:
            print(text, flush=True)

    def rest(self, path: str, token: str) -> Any:
        response = self.http.get(path, headers={"Authorization": f"Bearer {token}"})
        response.raise_for_status()
        return response.json()

    def memory_of(self, token: str, bot: str) -> list[str]:
        return [e["content"] for e in self.rest(f"/v1/bots/{bot}/memory", token)["entries"]]

    def learn_from(self, platform: str, chat: str, actor: str, words: str, bot_words: str) -> str:
        """What a platform does for one Turn of its Bot: the person's words, the Bot's reply, the
        Bot confiding (its tool), the Turn completed — then the memory Bot learns in the background."""
        client = self.graphql(platform)
        turn = client.start_turn(chat_id=chat, input=words, actor_id=actor).id
        client.add_items(turn_id=turn, items=[ItemInput(kind=ItemKind.BOT_MESSAGE, text=bot_words)])
        answer = client.confide(turn_id=turn, text="I am not sure I understood what matters to them.").answer
        print(f"   the Bot confided; the memory Bot answered: {answer!r}")
        client.complete_turn(turn_id=turn)
        return turn

    def wait_for(self, token: str, bot: str, count: int) -> list[str]:
        """The memory of ``token`` once it has ``count`` entries (or at the deadline), with the
        seconds waited so far on a status line."""
        started = time.monotonic()
        shown = -1
        found = self.memory_of(token, bot)
        while len(found) < count and time.monotonic() - started < self.wait:
            waited = int(time.monotonic() - started)
            if waited != shown:
                self.progress(f"   waiting for the memory Bot to learn… {waited} s")
                shown = waited
            time.sleep(0.2)
            found = self.memory_of(token, bot)
        if shown >= 0:
            self.progress(None)
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
        admin = self.graphql()
        org = admin.create_organization(name=f"demo-{tag}").id
        admin.update_organization(id=org, bot_memory_model=self.model)
        people: dict[str, tuple[str, str]] = {}
        bot = admin.create_bot(organization_id=org, name="Ada", model=self.model).id
        for name in ("ann", "bob", "cat"):
            created = admin.create_person(organization_id=org, name=name)
            people[name] = (created.person.id, created.token)
            admin.grant_bot(bot_id=bot, person_id=people[name][0], access=Access.WRITE)
        channel = admin.create_channel(
            organization_id=org, name="team", member_ids=[people["ann"][0], people["bob"][0]]
        ).id
        platform = admin.create_platform_token(organization_id=org).token
        print(
            f"   organization {org} (model {self.model}), Bot {bot}; ann and bob are in channel 'team', cat is not"
        )

        def chat_of(owner: str, group: bool = False) -> str:
            return (
                self.graphql(people[owner][1])
                .create_chat(bot_id=bot, channel_id=channel if group else None)
                .id
            )

        self.step("Ann tells the Bot something about herself in a private chat")
        private = chat_of("ann")
        said = "I'm vegetarian, so please never suggest meat dishes to me."
        print(f"   ann: {said}")
        self.learn_from(platform, private, people["ann"][0], said, "Noted, no meat for you.")
        learned = self.wait_for(people["ann"][1], bot, 1)
        print(f"   learned for ann only: {learned or '(nothing yet — is the worker running?)'}")

        self.step("In another chat, Ann's input is rewritten with what she may see")
        other = chat_of("ann")
        turn = self.graphql(people["ann"][1]).start_turn(chat_id=other, input="Suggest a dinner for tonight.")
        print(f"   ann wrote:        {turn.input}")
        print(f"   the Bot receives: {turn.enriched_input}")
        if self.model == STUB_MODEL:
            print("   (the offline stub keeps inputs as they are; a real model rewrites them with the notes)")
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
        turn = self.graphql(people["bob"][1]).start_turn(
            chat_id=group, input="When is standup, and what should we order for lunch?"
        )
        print(f"   bob wrote:        {turn.input}")
        print(f"   the Bot receives: {turn.enriched_input}")
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
    parser.add_argument("--wait", type=float, default=120.0, help="seconds to wait for learning")
    args = parser.parse_args(argv)
    assert settings.admin_token is not None
    demo = Demo(args.api, settings.admin_token.get_secret_value(), args.model, args.wait)
    try:
        return demo.run()
    except httpx.HTTPError as exc:
        print(f"Cannot reach the API at {args.api} ({type(exc).__name__}); start the stack with `make up`.")
        return 2
    except GraphQLClientGraphQLMultiError as exc:
        raise SystemExit(f"GraphQL error: {exc.errors[0].message}") from None
    except GraphQLClientError as exc:
        raise SystemExit(f"GraphQL error: {exc}") from None
    finally:
        demo.close()


if __name__ == "__main__":
    sys.exit(main())
