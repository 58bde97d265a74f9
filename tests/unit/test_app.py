"""`chatqna.app`: what a served process does with its start-up state."""

from __future__ import annotations

import gc

from chatqna.app import freeze_startup_objects


def test_freezing_moves_start_up_objects_out_of_the_collectors_reach() -> None:
    start_up = [{"state": [i]} for i in range(1000)]
    try:
        frozen = freeze_startup_objects()
        assert frozen >= len(start_up) and gc.get_freeze_count() == frozen
        collectable = {id(obj) for obj in gc.get_objects()}
        assert not any(id(obj) in collectable for obj in start_up)
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0
