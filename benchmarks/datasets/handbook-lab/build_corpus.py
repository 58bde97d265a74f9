"""Regenerate `corpus.jsonl` of the handbook lab from the packaged sample corpus.

    .venv/bin/python benchmarks/datasets/handbook-lab/build_corpus.py

One passage per `##` section of every `chatqna/sample_corpus/*.md` file, parsed with the
project's own loader, in file-name order and then section order:
`{"id": "<file stem>#<slugified heading>", "title": "<doc title> - <heading>",
"text": "<section text>", "domain": "handbook"}`. The unit test
`tests/repo/test_handbook_lab.py` checks that the committed file still equals
`build_passages(...)`, so the lab cannot drift from the sample corpus.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from chatqna.ingest.loaders import load_document

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
CORPUS_DIR = REPO / "chatqna" / "sample_corpus"
OUTPUT = HERE / "corpus.jsonl"
DOMAIN = "handbook"

_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def slugify(heading: str) -> str:
    """`"Billing dates and renewal"` -> `"billing-dates-and-renewal"`."""
    return _NON_ALNUM.sub("-", heading.lower()).strip("-")


def build_passages(corpus_dir: Path | str = CORPUS_DIR) -> list[dict[str, str]]:
    """Every `##` section of the Markdown files in `corpus_dir`, as benchmark passages."""
    passages: list[dict[str, str]] = []
    seen: set[str] = set()
    for path in sorted(Path(corpus_dir).glob("*.md")):
        doc = load_document(path.name, path.read_bytes())
        for heading, text in doc.sections:
            passage_id = f"{path.stem}#{slugify(heading)}"
            if passage_id in seen:
                raise ValueError(f"duplicate passage id {passage_id!r} in {path.name}")
            seen.add(passage_id)
            passages.append(
                {
                    "id": passage_id,
                    "title": f"{doc.title} - {heading}",
                    "text": text,
                    "domain": DOMAIN,
                }
            )
    return passages


def to_jsonl(passages: list[dict[str, str]]) -> str:
    return "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in passages)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--corpus-dir", type=Path, default=CORPUS_DIR)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    passages = build_passages(args.corpus_dir)
    args.output.write_text(to_jsonl(passages), encoding="utf-8")
    print(f"wrote {len(passages)} passages to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
