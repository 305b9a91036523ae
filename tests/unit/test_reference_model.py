"""The reference model of who sees which entry (tests/reference_model.py), pinned on small cases:
the property tests compare the service with it, so a slip in the oracle would hide a slip in the
service. Each case is one rule of DESIGN §4 (V1-V12) or §9 (D9.1-D9.4)."""

from __future__ import annotations

import pytest

from tests.reference_model import CONFLICT, MAX_HOPS, Model, Refused


def world() -> Model:
    """Org o1: ann, bob, cat (channel c1 = ann, bob); org o2: dan. Bot b of o1 linked into o2;
    everyone holds a grant. ann has a private chat p, bob a group chat g in c1."""
    m = Model()
    for org in ("o1", "o2"):
        m.add_org(org)
    for person, org in (("ann", "o1"), ("bob", "o1"), ("cat", "o1"), ("dan", "o2")):
        m.add_person(person, org)
    m.add_channel("c1", "o1", {"ann", "bob"})
    m.add_bot("b", "o1")
    m.link("b", "o2")
    for person in ("ann", "bob", "cat", "dan"):
        m.grant("b", person, "READ")
    m.create_chat("p", "b", "ann", None, review=False)
    m.create_chat("g", "b", "bob", "c1", review=False)
    return m


def seen_by(m: Model, entry: str) -> set[str]:
    return {p for p in m.people if m.sees(p, "b", entry)}


def test_a_private_fact_is_for_its_speaker_and_a_group_fact_for_the_channel_now() -> None:
    m = world()
    m.add_fact("b", "f1", [("p", m.say("p", "ann"))])
    m.add_fact("b", "f2", [("g", m.say("g", "bob"))])
    assert seen_by(m, "f1") == {"ann"}
    assert seen_by(m, "f2") == {"ann", "bob"}
    assert {"for:channel:c1", "from:bob", "org:o1", "chat:g", "channel:c1"} <= set(m.entries["f2"].tags)
    m.set_members("c1", {"bob", "cat"})  # V3: the rule is evaluated at read time
    assert seen_by(m, "f2") == {"bob", "cat"}


def test_a_grant_is_needed_to_see_anything() -> None:
    m = world()
    m.add_fact("b", "f1", [("p", m.say("p", "ann"))])
    m.grant("b", "ann", "NONE")
    assert seen_by(m, "f1") == set() and m.listing("ann", "b") is None


def test_an_observation_is_seen_by_who_sees_every_source_v4_v12() -> None:
    m = world()
    m.add_fact("b", "f1", [("p", m.say("p", "ann"))])
    m.add_fact("b", "f2", [("g", m.say("g", "bob"))])
    m.add_observation("b", "o1", ["f1", "f2"])
    assert seen_by(m, "o1") == {"ann"}
    assert {"for:person:ann", "for:channel:c1"} <= set(m.entries["o1"].tags)
    m.invalidate("b", "f2")  # V5: an inactive source hides it
    assert seen_by(m, "o1") == set()
    with pytest.raises(Refused) as caught:
        m.add_observation("b", "o2", ["f2"])
    assert caught.value.codes == {CONFLICT}


def test_share_widens_only_within_every_source_rule_v6() -> None:
    m = world()
    m.add_fact("b", "f2", [("g", m.say("g", "bob"))])
    m.share("b", "f2", ["for:person:ann"])  # narrower: allowed
    assert seen_by(m, "f2") == {"ann"}
    m.share("b", "f2", ["for:channel:c1"])  # back to the rule: allowed
    assert seen_by(m, "f2") == {"ann", "bob"}
    # Within the rule but admitting nobody who uses the Bot (an unknown channel, tags nobody meets
    # at once, a person whose grant went): the entry would be seen by nobody, and nobody could
    # share it back or forget it.
    m.grant("b", "ann", "NONE")
    for nobody in (["for:channel:c9"], ["for:channel:c1", "for:person:cat"], ["for:person:ann"]):
        with pytest.raises(Refused) as caught:
            m.share("b", "f2", nobody)
        assert caught.value.codes == {CONFLICT}
    m.grant("b", "ann", "READ")
    for wider in (["for:bot"], ["for:person:cat"]):
        with pytest.raises(Refused) as caught:
            m.share("b", "f2", wider)
        assert caught.value.codes == {CONFLICT}
    assert seen_by(m, "f2") == {"ann", "bob"}  # a refused share changes nothing


def test_a_person_shares_only_what_they_are_behind() -> None:
    m = world()
    m.add_fact("b", "f2", [("g", m.say("g", "bob"))])
    with pytest.raises(Refused):
        m.share("b", "f2", ["for:person:bob"], by="ann")
    m.share("b", "f2", ["for:person:bob"], by="bob")
    assert seen_by(m, "f2") == {"bob"}


def test_forget_retracts_for_the_only_person_behind_else_excludes_v11() -> None:
    m = world()
    m.add_fact("b", "f1", [("g", m.say("g", "bob")), ("g", m.say("g", "ann"))])
    assert m.forget("ann", "b", "f1") == "excluded"
    assert seen_by(m, "f1") == {"bob"}
    assert m.forget("bob", "b", "f1") == "retracted"
    assert seen_by(m, "f1") == set() and m.visible("bob", "b") == set()


def test_pinned_entries_are_their_authors_and_listed_first() -> None:
    m = world()
    m.add_fact("b", "f1", [("p", m.say("p", "ann"))])
    m.remember("ann", "b", "r1", ("tea",))
    m.add_fact("b", "f3", [("p", m.say("p", "ann"))])
    assert seen_by(m, "r1") == {"ann"}
    listing = m.listing("ann", "b")
    assert listing is not None and [v.id for v in listing] == ["r1", "f3", "f1"]


def test_organizations_and_legacy_entries_fail_closed_v2_v9() -> None:
    m = world()
    m.create_chat("d", "b", "dan", None, review=False)
    m.add_fact("b", "f4", [("d", m.say("d", "dan"))])
    assert seen_by(m, "f4") == {"dan"}
    m.add_fact("b", "f1", [("p", m.say("p", "ann"))])
    m.add_observation("b", "mix", ["f1", "f4"])
    assert seen_by(m, "mix") == set()  # two organizations: nobody passes both org: tags
    m.import_legacy("b", "old", ["for:bot", "org:o1"])
    assert seen_by(m, "old") == set()
    # An old private pinned entry made with Remember keeps its own rule (seed 000); one for the
    # Bot's people, or naming another organization than its author's, stays hidden.
    m.import_legacy("b", "mine", ["for:person:ann", "from:ann", "org:o1", "tea"], "pinned")
    assert seen_by(m, "mine") == {"ann"}
    m.import_legacy("b", "ours", ["for:bot", "org:o1"], "pinned")
    m.import_legacy("b", "elsewhere", ["for:person:ann", "from:ann", "org:o2"], "pinned")
    m.import_legacy("b", "about", ["for:person:ann", "org:o1"], "pinned")  # not from her: not Remember's
    assert seen_by(m, "ours") == seen_by(m, "elsewhere") == seen_by(m, "about") == set()


def test_a_source_chain_deeper_than_the_bound_is_hidden_d9_2() -> None:
    m = world()
    m.add_fact("b", "e0", [("p", m.say("p", "ann"))])
    for n in range(1, MAX_HOPS + 1):
        m.add_observation("b", f"e{n}", [f"e{n - 1}"])
    assert seen_by(m, f"e{MAX_HOPS - 1}") == {"ann"}
    assert seen_by(m, f"e{MAX_HOPS}") == set()


def test_review_chats_and_deleted_history_are_no_evidence() -> None:
    m = world()
    m.create_chat("r", "b", "ann", None, review=True)
    with pytest.raises(Refused):
        m.add_fact("b", "f", [("r", m.say("r", "ann"))])
    item = m.say("p", "ann")
    assert m.delete_chat_history("p", "ann") == 1
    with pytest.raises(Refused):
        m.add_fact("b", "f", [("p", item)])
    assert "f" not in m.entries
