from __future__ import annotations

from chatqna.ingest.loaders import load_document
from chatqna.ingest.markdown_text import markdown_sections


def test_setext_headings_name_the_title_and_sections() -> None:
    text = "Billing Guide\n=============\n\nHow billing works.\n\nRefunds\n-------\n\nFive days.\n"
    title, sections = markdown_sections(text)
    assert title == "Billing Guide"
    assert sections == [(None, "\nHow billing works.\n"), ("Refunds", "\nFive days.\n")]


def test_a_setext_heading_over_two_lines_is_one_name() -> None:
    title, sections = markdown_sections("Plans and\npricing\n===\nBody.")
    assert title == "Plans and pricing"
    assert sections == [(None, "Body.")]


def test_headings_inside_quotes_lists_and_indented_code_stay_text() -> None:
    text = "## Part\n\n> ## quoted\n\n- ## listed\n\n```\n## fenced\n```\n\n    ## indented\n"
    title, sections = markdown_sections(text)
    assert title is None
    assert [heading for heading, _ in sections] == [None, "Part"]
    body = sections[1][1]
    for line in ("> ## quoted", "- ## listed", "## fenced", "    ## indented"):
        assert line in body


def test_only_the_first_level1_heading_is_the_title_and_deeper_ones_stay() -> None:
    text = "# One\n\nA.\n\n# Two\n\n### Three\n\nB.\n"
    title, sections = markdown_sections(text)
    assert title == "One"
    assert sections == [(None, "\nA.\n\n# Two\n\n### Three\n\nB.\n")]


def test_a_lone_carriage_return_ends_a_line() -> None:
    title, sections = markdown_sections("# Title\r\rBody.\r## Part\rMore.")
    assert title == "Title"
    assert sections == [(None, "\nBody."), ("Part", "More.")]


def test_loaded_setext_document_falls_back_to_its_title_for_the_preamble() -> None:
    doc = load_document("guide.md", b"Guide\n=====\n\nIntro.\n\nSetup\n-----\n\nRun it.\n")
    assert doc.title == "Guide"
    assert doc.sections == [("Guide", "Intro."), ("Setup", "Run it.")]
