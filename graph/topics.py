"""Topic counts of learningContext (L4): how many valid entries of an organization carry each
topic, kept as ``(:TopicCount {key, botId, org, topic, n})`` where an entry's validity (``validOrg``,
set with its labels in ``graph.access``) or its topics change, so a learning step reads the
counts and not every valid entry's tags. A count is deleted when it reaches zero.

Every statement that changes either runs under the Bot's exclusive lock and adds its own delta:
the labels (an entry becoming valid or not, or valid for another organization), tag writes
(``retag``) and the purge (``count_topics`` before a delete). An entry's topics count once each.
``tests/test_label_equivalence.py`` compares the counts with a recount after every step.
"""

from __future__ import annotations

from typing import Final, LiteralString

#: The topics of ``e``, each once: its tags without a colon (OpenBot's tags have one, V8).
TOPICS_OF_E: Final[LiteralString] = (
    "reduce(acc = [], t IN e.tags | CASE WHEN t CONTAINS ':' OR t IN acc THEN acc ELSE acc + t END)"
)


def count_topics(org: LiteralString, topics: LiteralString, delta: LiteralString) -> LiteralString:
    """A FOREACH that adds ``delta`` to the count of each of ``topics`` among the valid entries of
    organization ``org`` of ``e``'s Bot (none when ``org`` is null), deleting a count that reaches
    zero (a purged topic leaves no trace); it keeps the rows as they are."""
    return (
        "FOREACH (topic IN CASE WHEN " + org + " IS NULL THEN [] ELSE " + topics + " END |\n"
        "  MERGE (tc:TopicCount {key: e.botId + '|' + " + org + " + '|' + topic})\n"
        "  ON CREATE SET tc.botId = e.botId, tc.org = " + org + ", tc.topic = topic, tc.n = 0\n"
        "  SET tc.n = tc.n + " + delta + "\n"
        "  FOREACH (_ IN CASE WHEN tc.n = 0 THEN [1] ELSE [] END | DELETE tc))\n"
    )


def retag(set_tags: LiteralString) -> LiteralString:
    """``set_tags`` (a SET of ``e.tags``) with the counts of ``e``'s organization kept: the topics
    it lost counted down, those it gained up. Goes on with ``e`` alone."""
    return (
        "WITH e, "
        + TOPICS_OF_E
        + " AS topicsBefore\n"
        + set_tags
        + "WITH e, topicsBefore, "
        + TOPICS_OF_E
        + " AS topicsAfter\n"
        + count_topics("e.validOrg", "[t IN topicsBefore WHERE NOT t IN topicsAfter]", "-1")
        + count_topics("e.validOrg", "[t IN topicsAfter WHERE NOT t IN topicsBefore]", "1")
    )


def revalidate() -> LiteralString:
    """After the labels set ``e.validOrg`` (``validBefore`` its value before): ``e``'s topics
    counted down in the organization it left and up in the one it joined, if it changed."""
    return count_topics(
        "CASE WHEN validBefore = e.validOrg THEN null ELSE validBefore END", TOPICS_OF_E, "-1"
    ) + count_topics("CASE WHEN validBefore = e.validOrg THEN null ELSE e.validOrg END", TOPICS_OF_E, "1")


def deleting() -> LiteralString:
    """Before ``e`` is deleted: its topics counted down in its organization."""
    return count_topics("e.validOrg", TOPICS_OF_E, "-1")


__all__ = ["TOPICS_OF_E", "count_topics", "deleting", "retag", "revalidate"]
