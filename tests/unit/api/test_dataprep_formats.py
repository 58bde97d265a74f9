"""Every format through `POST /v1/dataprep/ingest`, and a question answered from each."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.unit.api.conftest import ClientFactory
from tests.unit.ingest.office_files import handbook_docx, onboarding_pptx, price_list_xlsx

pytestmark = pytest.mark.anyio

CSV = b"Country,VAT rate,Invoice language\nGermany,19 %,German\nPortugal,23 %,Portuguese\n"
JSON = json.dumps(
    [
        {"plan": "Starter", "storage_quota": "5 GB"},
        {"plan": "Business", "storage_quota": "1 TB", "audit_log_retention": "400 days"},
    ]
).encode()
JSONL = (
    b'{"error_code": "E1042", "meaning": "webhook signature mismatch"}\n{"error_code": "E2001"}\n'
)

UPLOADS = [
    ("handbook.docx", handbook_docx()),
    ("onboarding.pptx", onboarding_pptx()),
    ("prices.xlsx", price_list_xlsx()),
    ("vat.csv", CSV),
    ("plans.json", JSON),
    ("errors.jsonl", JSONL),
]


async def _top(client: Any, question: str) -> dict[str, Any]:
    answer = await client.post("/v1/chatqna", json={"messages": question, "stream": False})
    assert answer.status_code == 200, answer.text
    top: dict[str, Any] = answer.json()["metadata"]["source_documents"][0]
    return top


@pytest.mark.parametrize(
    ("question", "source", "title", "evidence"),
    [
        ("daily allowance Lisbon", "handbook.docx", "Per diem", "Daily allowance: 37 EUR"),
        ("parental leave weeks", "handbook.docx", "Parental leave", "sixteen weeks"),
        ("VPN token expires", "onboarding.pptx", "Slide 2: Laptop setup", "Notes: Remind"),
        ("Payroll extension", "onboarding.pptx", "Slide 3: Contacts", "Extension: 4471"),
        ("Business monthly price seats", "prices.xlsx", "prices: Prices", "Seats: 50"),
        ("Portugal VAT rate", "vat.csv", "vat", "VAT rate: 23 %"),
        (
            "audit log retention days per plan",
            "plans.json",
            "plans",
            "audit_log_retention: 400 days",
        ),
        ("webhook signature mismatch error", "errors.jsonl", "errors", "error_code: E1042"),
    ],
)
async def test_each_format_is_ingested_and_answers_its_question(
    client_for: ClientFactory, question: str, source: str, title: str, evidence: str
) -> None:
    client = await client_for()
    response = await client.post(
        "/v1/dataprep/ingest",
        files=[("files", (name, data, "application/octet-stream")) for name, data in UPLOADS],
    )
    assert response.status_code == 200, response.text
    statuses = {item["name"]: item["status"] for item in response.json()["files"]}
    assert statuses == {name: "ingested" for name, _ in UPLOADS}
    top = await _top(client, question)
    assert (top["source"], top["title"]) == (source, title)
    assert evidence in top["text"]
