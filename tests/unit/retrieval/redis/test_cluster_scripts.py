"""The arguments of the cluster store's delete scripts: every call's keys share one slot."""

from __future__ import annotations

from redis.crc import key_slot

from chatqna.retrieval.redis.cluster_layout import ClusterLayout, source_slot, source_tag
from chatqna.retrieval.redis.cluster_scripts import by_slot, delete_call, sweep_calls
from chatqna.retrieval.redis.writes import KEYS_PER_COMMAND


def slots(keys: list[str]) -> set[int]:
    return {key_slot(key.encode()) for key in keys}


def test_sources_are_deleted_one_slot_at_a_time() -> None:
    layout = ClusterLayout("rag")
    names = [f"file-{n}.txt" for n in range(3000)] + ["file-0.txt"]
    groups = by_slot(names)
    assert sorted(n for group in groups.values() for n in group) == sorted(set(names))
    shared = next(group for group in groups.values() if len(group) > 1)
    for slot, group in groups.items():
        keys, argv = delete_call(layout, group)
        assert slots(keys) == {slot} == {source_slot(name) for name in group}
        assert keys[0] == layout.membership_key(group[0])
        assert argv[1::2] == group
        assert argv[0::2] == [layout.chunk_key_prefix(name) for name in group]
    keys, _ = delete_call(layout, shared)
    assert keys[1:] == [
        key for name in shared for key in (layout.source_key(name), layout.source_chunks_key(name))
    ]


def test_the_sweep_takes_each_tag_in_batches_and_leaves_untagged_keys_to_a_plain_del() -> None:
    layout = ClusterLayout("rag")
    many = [layout.chunk_key("big.txt", f"c{n}") for n in range(2 * KEYS_PER_COMMAND + 5)]
    found = [
        *many,
        many[0],  # SCAN may return a key twice
        layout.source_chunks_key("big.txt"),
        layout.source_key("hash-only.txt"),
        "rag:chunk:untagged",
    ]
    calls, untagged = sweep_calls(layout, found)
    assert untagged == ["rag:chunk:untagged"]
    assert len(calls) == 4  # big.txt in three batches, hash-only.txt's hash alone
    for keys, argv in calls:
        assert len(slots(keys)) == 1
        assert keys[2] == layout.tag_membership_key(layout.tag_of(keys[0]) or "")
        assert [layout.chunk_id_of(k) for k in keys[3:]] == argv[1:]
    big = [call for call in calls if call[0][0] == layout.source_key("big.txt")]
    assert [keys[3:] for keys, _ in big] == [
        many[:KEYS_PER_COMMAND],
        many[KEYS_PER_COMMAND : 2 * KEYS_PER_COMMAND],
        many[2 * KEYS_PER_COMMAND :],
    ]
    assert big[0][1][0] == layout.chunk_key_prefix("big.txt")
    (alone,) = [call for call in calls if call not in big]
    assert alone == (
        [
            layout.source_key("hash-only.txt"),
            layout.source_chunks_key("hash-only.txt"),
            layout.membership_key("hash-only.txt"),
        ],
        [layout.tag_chunk_key_prefix(source_tag("hash-only.txt"))],
    )
