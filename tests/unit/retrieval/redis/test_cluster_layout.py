"""The cluster store's key names: a source's keys share one slot, and name their tag."""

from __future__ import annotations

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from chatqna.retrieval.redis.cluster_layout import ClusterLayout, source_slot, source_tag


def test_a_sources_keys_share_one_slot_and_give_back_the_chunk_id() -> None:
    layout = ClusterLayout("rag")
    keys = [
        layout.chunk_key("docs/a b.md", "abc-0001"),
        layout.source_key("docs/a b.md"),
        layout.source_chunks_key("docs/a b.md"),
        layout.membership_key("docs/a b.md"),
    ]
    assert {key_slot(key.encode()) for key in keys} == {source_slot("docs/a b.md")}
    assert key_slot(keys[0].encode()) == key_slot(source_tag("docs/a b.md").encode())
    assert keys[0].startswith("rag:chunk:{") and layout.chunk_id_of(keys[0]) == "abc-0001"
    assert source_tag("a.md") != source_tag("b.md") and len(source_tag("a.md")) == 16


def test_the_keys_of_a_tag_are_the_keys_of_its_source() -> None:
    layout = ClusterLayout("rag")
    tag = source_tag("a.md")
    assert layout.tag_source_key(tag) == layout.source_key("a.md")
    assert layout.tag_source_chunks_key(tag) == layout.source_chunks_key("a.md")
    assert layout.tag_chunk_key_prefix(tag) + "c1" == layout.chunk_key("a.md", "c1")
    assert layout.tag_membership_key(tag) == layout.membership_key("a.md")


def test_only_a_sources_own_keys_name_a_tag() -> None:
    layout = ClusterLayout("rag")
    tag = source_tag("a.md")
    for key in (
        layout.chunk_key("a.md", "c1"),
        layout.chunk_key("a.md", "odd}:id"),
        layout.source_key("a.md"),
        layout.source_chunks_key("a.md"),
    ):
        assert layout.tag_of(key) == tag, key
    for key in (
        layout.membership_key("a.md"),
        layout.meta_key,
        "rag:chunk:plain-id",  # an earlier layout's, untagged
        "rag:chunk:{}:c1",  # an empty tag: Redis hashes the whole key
        f"rag:source:{{{tag}}}:more",
        f"rag:chunk:{{{tag}}}",
        f"other:chunk:{{{tag}}}:c1",
    ):
        assert layout.tag_of(key) is None, key


def test_sources_are_listed_in_one_membership_set_per_slot_and_no_other() -> None:
    keys = ClusterLayout("rag").membership_keys()
    assert [key_slot(key.encode()) for key in keys] == list(range(REDIS_CLUSTER_HASH_SLOTS))
    assert all(key.startswith("rag:sources:{") for key in keys)
