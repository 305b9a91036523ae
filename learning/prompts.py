"""What every memory-Bot request says: the system prompt with the Bot's instructions (L1), and the
words an answer may not use (D9.16)."""

from __future__ import annotations

import re

from services.memorybot import Route

#: Words that would tell the Bot that memory exists (D9.16); an answer using them is replaced.
MEMORY_VOCABULARY = re.compile(r"\bmemor(?:y|ies|ise|ize|ised|ized)\b|\bmem_\w", re.IGNORECASE)


def system_prompt(base: str, route: Route, known: str | None = None) -> str:
    """The memory Bot's instructions go into every request of that Bot (L1)."""
    parts = [base]
    if route.instructions:
        parts.append("Rules from the team you work for (follow them):\n" + route.instructions)
    if known:
        parts.append("What you know from earlier work (use only what helps):\n" + known)
    return "\n\n".join(parts)
