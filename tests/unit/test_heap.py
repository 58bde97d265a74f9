"""Heap trimming: glibc's `malloc_trim` really hands pages back, and the trimmer's policy
(after requests, when idle or every interval under load) holds."""

from __future__ import annotations

import asyncio
import platform

import pytest

from chatqna.activity import RequestActivity
from chatqna.heap import (
    HeapTrimmer,
    freeze_startup_objects,
    release_free_heap,
    resident_bytes,
)

GLIBC = platform.libc_ver()[0] == "glibc"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """What a trimmer under test did: bytes reported released, collections run."""

    def __init__(self) -> None:
        self.released: list[int] = []
        self.collections = 0

    def collect(self) -> int:
        self.collections += 1
        return 0


def trimmer_for(
    activity: RequestActivity, clock: FakeClock, recorder: Recorder | None = None
) -> HeapTrimmer:
    recorder = recorder if recorder is not None else Recorder()
    return HeapTrimmer(
        activity,
        10.0,
        release=lambda: 4096,
        collect=recorder.collect,
        on_trim=recorder.released.append,
        clock=clock,
    )


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's")
def test_release_free_heap_gives_freed_pages_back() -> None:
    # Thousands of 2 KB buffers (glibc's heap, not Python's small-object arenas), every
    # tenth kept: the freed ones sit between live ones, so only a trim returns them.
    buffers = [bytes([i % 251]) * 2048 for i in range(20_000)]
    kept = buffers[::10]
    before = resident_bytes()
    del buffers
    released = release_free_heap()
    after = resident_bytes()
    assert released is not None and released > 8 * 1024 * 1024
    assert before is not None and after is not None and after < before
    assert len(kept) == 2000


def test_nothing_is_due_without_requests() -> None:
    clock = FakeClock()
    trimmer = trimmer_for(RequestActivity(), clock)
    clock.now += 3600
    assert not trimmer.due()


def test_due_once_the_last_request_has_finished() -> None:
    activity = RequestActivity()
    trimmer = trimmer_for(activity, FakeClock())
    activity.started()
    activity.started()
    activity.ended()
    assert not trimmer.due()  # one still in flight, interval not reached
    activity.ended()
    assert trimmer.due()


def test_under_steady_load_due_every_interval() -> None:
    activity = RequestActivity()
    clock = FakeClock()
    trimmer = trimmer_for(activity, clock)
    activity.started()
    activity.started()
    activity.ended()
    clock.now += 9.9
    assert not trimmer.due()
    clock.now += 0.1
    assert trimmer.due()


@pytest.mark.anyio
async def test_trim_resets_the_policy_and_reports_what_it_released() -> None:
    activity = RequestActivity()
    recorder = Recorder()
    trimmer = trimmer_for(activity, FakeClock(), recorder)
    activity.started()
    activity.ended()
    assert await trimmer.trim() == 4096
    assert recorder.released == [4096]
    assert trimmer.trims == 1
    assert not trimmer.due()  # nothing new has finished
    activity.started()
    activity.ended()
    assert trimmer.due()


@pytest.mark.anyio
async def test_a_full_collection_runs_only_when_nothing_is_in_flight() -> None:
    activity = RequestActivity()
    recorder = Recorder()
    clock = FakeClock()
    trimmer = trimmer_for(activity, clock, recorder)
    activity.started()
    activity.started()
    activity.ended()
    clock.now += 10
    await trimmer.trim()  # under load: trim only, no pause for a collection
    assert (recorder.collections, recorder.released) == (0, [4096])
    activity.ended()
    await trimmer.trim()  # idle
    assert (recorder.collections, recorder.released) == (1, [4096, 4096])


@pytest.mark.anyio
async def test_run_trims_after_requests_and_stays_quiet_otherwise() -> None:
    activity = RequestActivity()
    released: list[int] = []
    trimmer = HeapTrimmer(
        activity, 0.02, release=lambda: 123, on_trim=released.append, poll_seconds=0.01
    )
    task = asyncio.create_task(trimmer.run())
    try:
        await asyncio.sleep(0.1)
        assert released == []
        activity.started()
        activity.ended()
        for _ in range(100):
            if released:
                break
            await asyncio.sleep(0.01)
        assert released == [123]
        await asyncio.sleep(0.1)
        assert released == [123]  # no new requests, no new trim
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_a_missing_malloc_trim_reports_none(monkeypatch: pytest.MonkeyPatch) -> None:
    import chatqna.heap as heap

    monkeypatch.setattr(heap, "_malloc_trim", lambda: None)
    assert heap.release_free_heap() is None
    assert not heap.trim_available()


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError):
        HeapTrimmer(RequestActivity(), 0)


def test_freezing_moves_start_up_objects_out_of_the_collectors_reach() -> None:
    import gc

    start_up = [{"state": [i]} for i in range(1000)]
    try:
        frozen = freeze_startup_objects()
        assert frozen >= len(start_up) and gc.get_freeze_count() == frozen
        collectable = {id(obj) for obj in gc.get_objects()}
        assert not any(id(obj) in collectable for obj in start_up)
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0
