"""`chatqna ingest` on a directory of Office, CSV and JSON files, in a process of its own."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import ingest_cli
from tests.unit.ingest.office_files import handbook_docx, onboarding_pptx, price_list_xlsx

pytestmark = pytest.mark.slow  # loads the embedded model in a new process


def test_cli_ingests_every_new_format(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "handbook.docx").write_bytes(handbook_docx())
    (docs / "onboarding.pptx").write_bytes(onboarding_pptx())
    (docs / "sub" / "prices.xlsx").write_bytes(price_list_xlsx())
    (docs / "vat.csv").write_text("Country,VAT rate\nGermany,19 %\n")
    (docs / "plans.json").write_text('[{"plan": "Starter", "seats": 3}]')
    (docs / "errors.jsonl").write_text('{"code": "E1"}\n{"code": "E2"}\n')
    done = ingest_cli(tmp_path / "data", docs)
    assert "6 file(s) ingested" in done.stdout, done.stdout + done.stderr


def test_cli_refuses_a_name_with_a_newline_and_ingests_nothing(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "good.md").write_text("# Good\n\ntext")
    (docs / "bad\nname.md").write_text("# Bad\n\ntext")
    with pytest.raises(subprocess.CalledProcessError) as info:
        ingest_cli(tmp_path / "data", docs)
    assert "control characters" in info.value.stderr
    # Nothing of the failed run was stored: the good file is new to the index, not unchanged.
    again = ingest_cli(tmp_path / "data", docs / "good.md")
    assert "1 file(s) ingested" in again.stdout and "0 unchanged" in again.stdout


def test_a_rebuild_replaces_the_index_only_once_every_file_is_in(tmp_path: Path) -> None:
    data = tmp_path / "data"
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    (old / "a.md").write_text("# A\n\nApples are red.")
    (old / "b.md").write_text("# B\n\nBananas are yellow.")
    (new / "c.md").write_text("# C\n\nCherries are dark.")
    (new / "d.txt").write_bytes(b"\xff\xfe not text")  # fails to load: the rebuild fails
    assert "2 file(s) ingested" in ingest_cli(data, old).stdout
    # A typo and a file that cannot be read both fail before the old index is touched.
    for paths in ([tmp_path / "missing"], [new]):
        with pytest.raises(subprocess.CalledProcessError) as info:
            ingest_cli(data, *paths, rebuild=True)
        assert "ingest failed" in info.value.stderr
        kept = ingest_cli(data, old)
        assert "0 file(s) ingested" in kept.stdout and "2 unchanged" in kept.stdout
    (new / "d.txt").unlink()
    rebuilt = ingest_cli(data, new, rebuild=True)
    assert "1 file(s) ingested" in rebuilt.stdout and "rebuilt" in rebuilt.stdout
    assert not (data / ".rebuild").exists() and not (data / "index.old").exists()
    # The old files are gone from the index: ingesting them again embeds them anew.
    again = ingest_cli(data, old)
    assert "2 file(s) ingested" in again.stdout and "0 unchanged" in again.stdout


def test_a_directory_without_supported_files_is_an_error_that_names_the_skipped(
    tmp_path: Path,
) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "setup.exe").write_bytes(b"MZ")
    (tools / "run.py").write_text("print('hi')")
    with pytest.raises(subprocess.CalledProcessError) as info:
        ingest_cli(tmp_path / "data", tools)
    assert "2 file(s) skipped: not a supported type" in info.value.stderr
    assert "nothing to ingest" in info.value.stderr
    (tools / "notes.md").write_text("# Notes\n\nSome notes.")
    done = ingest_cli(tmp_path / "data", tools)
    assert "1 file(s) ingested" in done.stdout and "2 file(s) skipped" in done.stderr


@pytest.mark.parametrize("rebuild", [False, True])
def test_a_data_dir_that_is_a_file_is_named_as_one(tmp_path: Path, rebuild: bool) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    (tmp_path / "doc.md").write_text("# Doc\n\ntext")
    with pytest.raises(subprocess.CalledProcessError) as info:
        ingest_cli(afile, tmp_path / "doc.md", rebuild=rebuild)
    assert info.value.stderr.strip().splitlines() == [
        f"ingest failed: CHATQNA_DATA_DIR must be a directory: {afile} is a file"
    ]
