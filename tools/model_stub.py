"""The offline model: ``python -m tools.model_stub [--port 8099]`` (``make model``).

A deterministic OpenAI-compatible chat-completions server (:mod:`tools.model_server`) that answers
every request the memory Bot makes, so the local stack runs without a provider (``make up``
starts it when ``OPENAI_BASE_URL`` is not set). It serves any model name:

- a learning step (task ``learn``, DESIGN §7): every plain first-person sentence of a person's
  message ("I …", "I'm …", "My …", "We …", "Our …") becomes an ``add_fact`` citing that message,
  in the third person ("I love tea." → "Loves tea."); questions, the Bot's words, notices and App
  results are never facts; a sentence already kept is not added again; a re-asked step gets no
  tool call;
- an input rewrite (``rewrite``, N1): no tool call, so the input is kept;
- the Bot's own chat (``chat``, the built-in runner): a call of the ``confide`` tool when it is
  offered and not yet answered (no confide, nothing learned: L2), then a fixed text;
- ``confide``: a fixed friendly text; a summary a fixed short text.

Every answer carries usage (about four characters a token) so the cost accounting runs; the
local stack prices the stub at 0. The requests are identified by the ``X-Botmemory-Task`` header,
else by the tools they offer. Only counts are logged, never what the people said.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any, cast

from learning.protocol import MAX_TOOL_CALLS
from services.changes import MAX_CONTENT_CHARS
from services.settings import Settings
from tools.model_server import TASK_HEADER, ModelServer, Recorded, Reply, ToolCall
from tools.stores import stub_port

CHAT_REPLY = (
    "Thanks for your message. I am the offline stub model, so this is the only answer I give; "
    "set OPENAI_BASE_URL for a real model."
)
CONFIDE_ANSWER = (
    "Thank you for telling me. That is part of the work: tell the person plainly, fix what you can, "
    "and carry on calmly."
)
#: What the Bot confides when the runner offers the tool: every Turn of the runner is then learned.
CONFIDED = "I can only give a fixed answer here; I hope it still helps."
SUMMARY_TEXT = "People talked with the assistant; see the messages for the details."
KEEP_INPUT = "Nothing to add."
NOTHING_TO_KEEP = "Nothing to keep."

#: A sentence longer than this is not "plain"; it is never a fact.
MAX_SENTENCE_CHARS = 500

log = logging.getLogger("tools.model_stub")

_SENTENCES = re.compile(r"(?<=[.!?])\s+|\s*\n+\s*")
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")

# Openers that carry the subject: replaced as a whole (the verb after them needs no change).
_OPENERS = {
    "i'm": "Is",
    "i've": "Has",
    "i'll": "Will",
    "i'd": "Would",
    "my": "Their",
    "we": "They",
    "we're": "They're",
    "we've": "They've",
    "we'll": "They'll",
    "we'd": "They'd",
    "our": "Their",
}
# "I" + one of these: the third-person form.
_VERBS = {"am": "is", "have": "has", "do": "does", "don't": "doesn't"}
# "I" + one of these: the same word (past tenses and modals do not change).
_SAME = frozenset((
    "was", "had", "did", "didn't", "can", "can't", "cannot", "could", "couldn't", "will", "won't",
    "would", "wouldn't", "should", "shouldn't", "must", "might", "may", "shall", "went", "got", "made",
    "saw", "bought", "took", "came", "left", "met", "found", "ate", "drank", "ran", "wrote", "read",
    "grew", "began", "became", "brought", "built", "felt", "fell", "forgot", "gave", "heard", "held",
    "kept", "knew", "lost", "meant", "paid", "put", "said", "sent", "set", "sold", "spent", "spoke",
    "stood", "taught", "thought", "told", "understood", "wore", "won",
))  # fmt: skip
# Adverbs between "I" and the verb: kept, the verb after them changes ("I really like" → "Really likes").
_ADVERBS = frozenset((
    "really", "also", "just", "still", "usually", "always", "never", "often", "sometimes", "rarely",
    "mostly", "only", "even", "already", "actually", "definitely", "absolutely", "truly", "recently",
))  # fmt: skip
# Pronouns after the subject, for one speaker and for several.
_SINGULAR = (
    (r"\bI am\b", "they are"),
    (r"\bI was\b", "they were"),
    (r"\bI'm\b", "they're"),
    (r"\bI've\b", "they've"),
    (r"\bI'll\b", "they'll"),
    (r"\bI'd\b", "they'd"),
    (r"\bI\b", "they"),
    (r"\bmyself\b", "themselves"),
    (r"\bmine\b", "theirs"),
    (r"\bmy\b", "their"),
    (r"\bme\b", "them"),
)
_PLURAL = (
    (r"\bwe're\b", "they're"),
    (r"\bwe\b", "they"),
    (r"\bourselves\b", "themselves"),
    (r"\bours\b", "theirs"),
    (r"\bour\b", "their"),
    (r"\bus\b", "them"),
)


def _third_person_verb(verb: str) -> str | None:
    """``love`` → ``loves``; None when it does not look like a verb."""
    if verb in _VERBS:
        return _VERBS[verb]
    if verb in _SAME or verb.endswith("ed") or verb.endswith("n't"):
        return verb
    if not verb.isalpha():
        return None
    if verb.endswith(("s", "sh", "ch", "x", "z", "o")):
        return verb + "es"
    if len(verb) > 1 and verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


def _pronouns(rest: str, plural: bool) -> str:
    for pattern, replacement in _PLURAL if plural else _SINGULAR:
        flags = 0 if pattern.startswith(r"\bI") else re.IGNORECASE
        rest = re.sub(pattern, replacement, rest, flags=flags)
    return rest


def third_person(sentence: str) -> str | None:
    """A plain first-person statement in the third person ("I love tea." → "Loves tea."; "My cat is
    grey." → "Their cat is grey."); the sentence as said when the verb is not plain; None when it is
    no first-person statement (a question, someone else, too short or too long)."""
    text = sentence.strip().replace("\u2019", "'")
    if not text or text.endswith("?") or len(text) > MAX_SENTENCE_CHARS:
        return None
    body = text.rstrip(".!").rstrip()
    words = body.split()
    if len(words) < 2:
        return None
    first = words[0].lower().rstrip(",")
    if first in _OPENERS:
        head, rest = [_OPENERS[first]], words[1:]
        plural = first.startswith(("we", "our"))
    elif words[0] in ("I", "i"):
        head, rest, plural = [], words[1:], False
        if rest[0].lower() in _ADVERBS and len(rest) > 1:
            head, rest = [rest[0].lower()], rest[1:]
        verb = _third_person_verb(rest[0].lower())
        if verb is None:
            return text  # not easy to rewrite: the person's own words
        head, rest = [*head, verb], rest[1:]
    else:
        return None
    out = " ".join([*head, _pronouns(" ".join(rest), plural)]).strip()
    return out[0].upper() + out[1:] + "."


def facts(items: Sequence[dict[str, Any]], kept: Sequence[dict[str, Any]] = ()) -> list[tuple[str, str]]:
    """(content, Item id) of every first-person sentence of the person messages among ``items``
    (the request's ``newItems``), without what ``kept`` (its ``keptEntries``) already says."""
    seen = {str(e.get("content", "")).strip().lower() for e in kept}
    out: list[tuple[str, str]] = []
    for item in items:
        text, item_id = item.get("text"), item.get("id")
        if item.get("kind") != "person_message" or not isinstance(text, str) or not isinstance(item_id, str):
            continue
        for sentence in _SENTENCES.split(text):
            content = third_person(sentence)
            if content is None or len(content) > MAX_CONTENT_CHARS or content.lower() in seen:
                continue
            seen.add(content.lower())
            out.append((content, item_id))
    return out[:MAX_TOOL_CALLS]


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    raw = body.get("messages")
    if not isinstance(raw, list):
        return []
    return [cast(dict[str, Any], m) for m in cast(list[Any], raw) if isinstance(m, dict)]


def _learning_request(body: dict[str, Any]) -> dict[str, Any]:
    """The JSON the learning step sends as its user message (newItems, keptEntries), or {}."""
    users = [m.get("content") for m in _messages(body) if m.get("role") == "user"]
    if not users or not isinstance(users[0], str):
        return {}
    try:
        parsed: Any = json.loads(users[0])
    except ValueError:
        return {}
    return cast(dict[str, Any], parsed) if isinstance(parsed, dict) else {}


def _dicts(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        return []
    return [cast(dict[str, Any], v) for v in cast(list[Any], value) if isinstance(v, dict)]


def task_of(task: str | None, body: dict[str, Any]) -> str:
    """The task of a request: its header, else what the tools it offers say."""
    if task:
        return task
    names = {str(t.get("function", {}).get("name")) for t in _dicts(body.get("tools"))}
    if "add_fact" in names:
        return "learn"
    if "rewrite_input" in names:
        return "rewrite"
    return "chat"


def _tokens(text: str) -> int:
    return len(text) // 4 + 1


def answer(task: str | None, body: dict[str, Any]) -> Reply:
    """The stub's answer to one chat-completions request (see the module docstring)."""
    task = task_of(task, body)
    prompt = _tokens(json.dumps(body.get("messages"), ensure_ascii=False))
    if task == "learn":
        if len(_messages(body)) > 2:  # a re-ask (D9.21): our answer was refused, keep nothing
            return Reply(text=NOTHING_TO_KEEP, usage=(prompt, _tokens(NOTHING_TO_KEEP)))
        sent = _learning_request(body)
        found = facts(_dicts(sent.get("newItems")), _dicts(sent.get("keptEntries")))
        if not found:
            return Reply(text=NOTHING_TO_KEEP, usage=(prompt, _tokens(NOTHING_TO_KEEP)))
        calls = [ToolCall("add_fact", {"content": c, "source_item_ids": [i]}) for c, i in found]
        return Reply(tool_calls=calls, usage=(prompt, _tokens(json.dumps([c.arguments for c in calls]))))
    if task == "chat" and _offers_confide(body) and not any(m.get("role") == "tool" for m in _messages(body)):
        call = ToolCall("confide", {"text": CONFIDED})
        return Reply(tool_calls=[call], usage=(prompt, _tokens(CONFIDED)))
    text = {"rewrite": KEEP_INPUT, "confide": CONFIDE_ANSWER, "summary": SUMMARY_TEXT}.get(task, CHAT_REPLY)
    return Reply(text=text, usage=(prompt, _tokens(text)))


def _offers_confide(body: dict[str, Any]) -> bool:
    return any(t.get("function", {}).get("name") == "confide" for t in _dicts(body.get("tools")))


def _respond(recorded: Recorded) -> Reply:
    reply = answer(recorded.task, recorded.body)
    task = task_of(recorded.task, recorded.body)
    outcome = f"{len(reply.tool_calls)} facts" if task == "learn" else "text"
    if task == "chat" and reply.tool_calls:
        outcome = "confide"
    log.info("%s (model %s): %s", task, recorded.body.get("model"), outcome)
    return reply


def install(server: ModelServer) -> ModelServer:
    """Make ``server`` answer as the stub (every task, any model)."""
    server.respond(None, _respond)
    return server


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help="default: BOTMEMORY_MODEL_STUB_PORT, else the API's port + 99 (8099)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    port = args.port if args.port is not None else stub_port(Settings())
    try:
        server = install(ModelServer(history=100)).start(port)
    except OSError as exc:
        print(f"model stub: cannot listen on 127.0.0.1:{port} ({exc.strerror})", file=sys.stderr)
        return 1
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda _signum, _frame: stopping.set())
    log.info("offline model stub ready on %s (header %s names the task)", server.base_url, TASK_HEADER)
    stopping.wait()
    server.stop()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
