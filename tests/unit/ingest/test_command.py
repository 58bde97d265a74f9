"""`chatqna ingest --rebuild`'s swap of the index directories (the command itself runs in
`tests/integration/test_cli_formats.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatqna.ingest.command import rebuild_settings, replace_embedded_index
from chatqna.settings import Settings


def index_with(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True)
    (directory / name).write_text(name)
    return directory


def test_the_rebuilt_index_takes_the_old_ones_place(tmp_path: Path) -> None:
    settings = Settings(chatqna_data_dir=tmp_path)
    index_with(settings.index_dir, "old")
    staging = rebuild_settings(settings)
    replace_embedded_index(settings, index_with(staging.index_dir, "new"))
    assert sorted(p.name for p in settings.index_dir.iterdir()) == ["new"]
    assert not (tmp_path / "index.old").exists()


def test_a_swap_that_cannot_finish_puts_the_old_index_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(chatqna_data_dir=tmp_path)
    index_with(settings.index_dir, "old")
    rebuilt = index_with(tmp_path / ".rebuild" / "index", "new")
    renames: list[Path] = []
    real_rename = Path.rename

    def failing_second(self: Path, target: Path) -> Path:
        renames.append(self)
        if self == rebuilt:
            raise OSError("disk gone")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", failing_second)
    with pytest.raises(OSError):
        replace_embedded_index(settings, rebuilt)
    monkeypatch.undo()
    assert sorted(p.name for p in settings.index_dir.iterdir()) == ["old"]


def test_a_swap_cut_off_between_its_renames_is_undone_first(tmp_path: Path) -> None:
    settings = Settings(chatqna_data_dir=tmp_path)
    index_with(tmp_path / "index.old", "old")  # renamed aside, then the process died
    rebuild_settings(settings)  # the next rebuild empties its staging directory
    rebuilt = index_with(tmp_path / ".rebuild" / "index", "new")
    assert not settings.index_dir.exists()
    replace_embedded_index(settings, rebuilt)
    assert sorted(p.name for p in settings.index_dir.iterdir()) == ["new"]
