"""An operation's root fields, as GraphQL runs them, and the rule of one mutation per operation.

Every Mutation field's payload is non-null, so an error in any root field of a mutation operation
nulls ``data`` whole (GraphQL's null propagation): a field that committed before it — a Remember,
a Turn — is written and its answer lost, and a retry writes it again. An operation that selects
one mutation field leaves no write without its answer, so a mutation operation selects one
(``__typename`` aside, which writes nothing); it is refused before anything runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from graphql import (
    FieldNode,
    FragmentSpreadNode,
    GraphQLError,
    InlineFragmentNode,
    OperationDefinitionNode,
    OperationType,
    SelectionSetNode,
    ValidationRule,
)
from graphql.validation import ASTValidationContext

#: What a mutation operation of several root fields is told.
ONE_MUTATION: Final = (
    "send one mutation per operation: an error in one mutation field nulls the answer of every"
    " other, and what they wrote is not told"
)


def selected_fields(
    context: ASTValidationContext, selections: SelectionSetNode, seen: set[str] | None = None
) -> Iterator[tuple[str, str, FieldNode]]:
    """(response key, field name, node) of each field of a selection set, inline fragments and
    fragment spreads followed (each fragment once: a fragment spread twice runs its fields once)."""
    seen = set() if seen is None else seen
    for selection in selections.selections:
        if isinstance(selection, FieldNode):
            key = selection.alias.value if selection.alias else selection.name.value
            yield key, selection.name.value, selection
        elif isinstance(selection, InlineFragmentNode):
            yield from selected_fields(context, selection.selection_set, seen)
        elif isinstance(selection, FragmentSpreadNode) and selection.name.value not in seen:
            seen.add(selection.name.value)
            fragment = context.get_fragment(selection.name.value)
            if fragment is not None:
                yield from selected_fields(context, fragment.selection_set, seen)


class OneMutation(ValidationRule):
    """Refuses a mutation operation whose root fields are more than one response key besides
    ``__typename`` (fields merged under one key run once, and count once)."""

    def enter_operation_definition(self, node: OperationDefinitionNode, *_: Any) -> None:
        if node.operation is not OperationType.MUTATION:
            return
        keys = {
            key for key, name, _ in selected_fields(self.context, node.selection_set) if name != "__typename"
        }
        if len(keys) > 1:
            self.report_error(GraphQLError(f"{ONE_MUTATION} (this one selects {len(keys)})", node))


__all__ = ["ONE_MUTATION", "OneMutation", "selected_fields"]
