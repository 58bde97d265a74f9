"""Scoring a running service: the files a corpus is uploaded as."""

from __future__ import annotations

from chatqna.evaluation.dataset import Passage
from chatqna.evaluation.service import passage_file, passage_filename, passage_id_of
from chatqna.ingest.chunking import chunk_document
from chatqna.ingest.loaders import load_document


def ingested(passage: Passage) -> list[tuple[str, str]]:
    """(title, text) of each chunk the service's ingestion makes of the uploaded file."""
    source = passage_filename(passage.id)
    chunks = chunk_document(load_document(source, passage_file(passage)), 20000, 0)
    return [(chunk.title, chunk.text) for chunk in chunks]


def test_the_service_indexes_an_uploaded_passage_as_the_harness_does() -> None:
    passage = Passage("doc/7-1", "Fee waivers", "You need a waiver in both courts.\nAsk the clerk.")
    assert passage_id_of(passage_filename(passage.id)) == "doc/7-1"
    assert ingested(passage) == [("Fee waivers", passage.text)]


def test_a_line_starting_with_a_hash_does_not_split_the_passage() -> None:
    passage = Passage("p", "Style", "Intro.\n## Not a heading\n# Nor this")
    assert ingested(passage) == [("Style", "Intro.\n\\## Not a heading\n\\# Nor this")]
