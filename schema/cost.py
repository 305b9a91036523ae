"""What an operation may cost (design §5: depth, complexity and alias limits).

The depth and alias limits bound a document's shape; they let one request ask for 30 model calls
(30 aliased ``sendMessage``, each up to a minute and billed), 30 searches or 30 unpaged memory
reads. Each root field costs what it sets going (``COSTS``; 1 otherwise), and so does each field
within it that reads on its own (``NESTED``: a chat's page of messages, an entry's walk of the
source graph — 29 aliased pages of 200 messages cost one chat read before) but the first, which
the root's cost covers (a chat with its messages, as a batch of chats asks); an operation that
costs more than the limit is refused before anything runs. Fields merged by GraphQL (one response
key asked twice) run once and count once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from graphql import GraphQLError, OperationDefinitionNode, ValidationRule

from schema.roots import selected_fields

#: A model call (seconds, billed).
MODEL_CALL: Final = 50
#: An embedding and a ranking, a page of decrypted rows, a walk of the source graph: ten an
#: operation.
RETRIEVAL: Final = 10
#: (operation type, root field) → its cost; any other root field costs 1, ``__typename`` nothing.
COSTS: Final[Mapping[tuple[str, str], int]] = {
    ("mutation", "sendMessage"): MODEL_CALL,
    ("mutation", "startTurn"): MODEL_CALL,
    ("mutation", "confide"): MODEL_CALL,
    ("mutation", "remember"): RETRIEVAL,
    ("mutation", "purge"): RETRIEVAL,
    ("mutation", "deleteChatHistory"): RETRIEVAL,
    ("query", "search"): RETRIEVAL,
    ("query", "context"): RETRIEVAL,
    ("query", "contextPack"): RETRIEVAL,
    ("query", "memory"): RETRIEVAL,
    ("query", "memoryLog"): RETRIEVAL,
    ("query", "chatMetas"): RETRIEVAL,
    ("query", "validateReferences"): RETRIEVAL,
    # A page of decrypted rows, or a walk of the source graph.
    ("query", "entry"): RETRIEVAL,
    ("query", "chat"): RETRIEVAL,
    ("query", "chatMeta"): RETRIEVAL,
    ("query", "confessions"): RETRIEVAL,
    ("query", "enrichments"): RETRIEVAL,
    ("query", "learning"): RETRIEVAL,
    ("query", "__typename"): 0,
    ("mutation", "__typename"): 0,
}
#: Root field → the fields of what it returns that each read on their own (a page of decrypted
#: rows, a walk of the source graph), RETRIEVAL each.
NESTED: Final[Mapping[str, frozenset[str]]] = {
    "chat": frozenset({"messages"}),
    "entry": frozenset({"sources", "dependents", "why"}),
}


def cost_rule(limit: int) -> type[ValidationRule]:
    """The validation rule refusing an operation that costs more than ``limit``."""

    class OperationCost(ValidationRule):
        def enter_operation_definition(self, node: OperationDefinitionNode, *_: Any) -> None:
            kind = node.operation.value
            names: dict[str, str] = {}
            nested: dict[str, set[str]] = {}  # root key → the keys of its fields that read on their own
            for key, name, field in selected_fields(self.context, node.selection_set):
                names[key] = name
                within = NESTED.get(name) if kind == "query" else None
                if within and field.selection_set is not None:
                    inner = selected_fields(self.context, field.selection_set)
                    nested.setdefault(key, set()).update(k for k, n, _ in inner if n in within)
            cost = sum(COSTS.get((kind, name), 1) for name in names.values())
            cost += RETRIEVAL * sum(max(0, len(keys) - 1) for keys in nested.values())
            if cost > limit:
                self.report_error(
                    GraphQLError(
                        f"the operation costs {cost}, more than the limit of {limit}: a model call costs"
                        f" {MODEL_CALL}, a search, context, memory or page read {RETRIEVAL} (a chat's messages"
                        " and an entry's sources, dependents or why too), any other field 1;"
                        " send the rest as further operations",
                        node,
                    )
                )

    return OperationCost


__all__ = ["COSTS", "MODEL_CALL", "NESTED", "RETRIEVAL", "cost_rule"]
