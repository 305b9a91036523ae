"""What is kept of the entries' topics (V8: their tags without a colon) so that no read of a
topic reads every entry of the Bot.

- Counts for learningContext (L4): how many valid entries of an organization carry each topic,
  kept as ``(:TopicCount {key, botId, org, topic, n})`` where an entry's validity (``validOrg``, set
  with its labels in ``graph.access``) or its topics change, so a learning step reads the counts
  and not every valid entry's tags. A count is deleted when it reaches zero.
- Links for the tag filter and the topic rename: every entry, whatever its status, has a
  ``HAS_TOPIC`` relationship for each of its topics to a ``(:Topic {key, botId, audienceKey,
  topic})`` of its Bot and its audience key (``audienceKey``, ``graph.access``; '' for none), so
  the entries with a topic that a reader's keys hold are the relationships of those keys' Topics
  (their degrees the topic's size for that reader, read without reading them): a filter never
  reads the entries of an audience key the reader does not hold, so its time does not tell how
  many of another audience carry a guessed topic. An entry whose audience key changes is linked again with its labels
  (``relinked``). A Topic is deleted with its last relationship. Only entries with topics pay
  for it, one relationship a topic (a full-text index of the tags cost every write ~2 ms,
  bench/README.md session 30).

Every statement that changes either runs under the Bot's exclusive lock and adds its own delta:
the labels (an entry becoming valid or not, or valid for another organization, or of another
audience), tag writes (``retag``), a new entry (``link_topics``) and the purge (``deleting`` before
a delete, ``unlinked`` after). An entry's topics count once each. ``tests/test_label_equivalence.py`` compares the counts
and the links with the entries' tags after every step.
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


#: The audience key of ``e`` as its Topics are keyed ('' for an entry without one).
AUDIENCE_OF_E: Final[LiteralString] = "coalesce(e.audienceKey, '')"


def topic_key(bot: LiteralString, audience: LiteralString, topic: LiteralString) -> LiteralString:
    """The key of the Topic of ``topic`` for audience key ``audience`` in Bot ``bot`` (three Cypher
    expressions), as it is written and sought."""
    return bot + " + '|' + " + audience + " + '|' + " + topic


def link_topics(topics: LiteralString, *, concurrent: bool = False) -> LiteralString:
    """A FOREACH that links ``e`` to the Topic of each of ``topics`` (distinct, not yet linked) for
    its audience key, creating the Topic at its first entry; it keeps the rows as they are.
    ``concurrent``: for a statement that others may run at once on the same entries without the
    Memory lock (a migration's data step as replicas start together): the link is MERGEd (Neo4j
    locks both nodes, so it is made once), not created."""
    link: LiteralString = "MERGE" if concurrent else "CREATE"
    return (
        "FOREACH (topic IN " + topics + " |\n"
        "  MERGE (tp:Topic {key: " + topic_key("e.botId", AUDIENCE_OF_E, "topic") + "})\n"
        "  ON CREATE SET tp.botId = e.botId, tp.audienceKey = " + AUDIENCE_OF_E + ", tp.topic = topic\n"
        "  " + link + " (e)-[:HAS_TOPIC]->(tp))\n"
    )


def relinked() -> LiteralString:
    """After the labels set ``e.audienceKey``: ``e``'s topics linked to the Topics of that key
    where they were linked to another's, or to a Topic of another shape (one a process of before
    version 24 made: keyed by the Bot alone); a Topic left without entries is deleted. A unit
    subquery: it keeps the rows as they are."""
    return (
        """CALL (e) {
  MATCH (e)-[h:HAS_TOPIC]->(tp:Topic) WHERE tp.key <> """
        + topic_key("e.botId", AUDIENCE_OF_E, "tp.topic")
        + """
  DELETE h
  WITH e, collect(tp) AS moved
  """
        + link_topics("[tp IN moved | tp.topic]")
        + "  "
        + unlinked("moved")
        + "}\n"
    )


def retag(set_tags: LiteralString) -> LiteralString:
    """``set_tags`` (a SET of ``e.tags``) with the counts of ``e``'s organization and its topic
    links kept: the topics it lost counted down and unlinked (a Topic left without entries
    deleted), those it gained counted up and linked. Goes on with ``e`` alone."""
    return (
        "WITH e, "
        + TOPICS_OF_E
        + " AS topicsBefore\n"
        + set_tags
        + "WITH e, topicsBefore, "
        + TOPICS_OF_E
        + " AS topicsAfter\n"
        + "WITH e, [t IN topicsBefore WHERE NOT t IN topicsAfter] AS lost,\n"
        + "     [t IN topicsAfter WHERE NOT t IN topicsBefore] AS gained\n"
        + """CALL (e, lost) {
  MATCH (e)-[h:HAS_TOPIC]->(tp:Topic)
  WHERE tp.topic IN lost
  DELETE h
  WITH collect(tp) AS topics
  """
        + unlinked("topics")
        + "}\n"
        + count_topics("e.validOrg", "lost", "-1")
        + count_topics("e.validOrg", "gained", "1")
        + link_topics("gained")
        + "WITH e\n"
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


def unlinked(topics: LiteralString) -> LiteralString:
    """After the entries of a statement are deleted: the Topics of the list ``topics`` (collected
    before the delete from their ``HAS_TOPIC`` relationships) left without an entry go too."""
    return "FOREACH (tp IN [tp IN " + topics + " WHERE NOT EXISTS { (tp)<-[:HAS_TOPIC]-() }] | DELETE tp)\n"


__all__ = [
    "AUDIENCE_OF_E",
    "TOPICS_OF_E",
    "count_topics",
    "deleting",
    "link_topics",
    "relinked",
    "retag",
    "revalidate",
    "topic_key",
    "unlinked",
]
