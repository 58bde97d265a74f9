"""The deployment files the checks read, and `Problem`, what each check reports."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = "docker-compose.yaml"
OVERRIDE_FILES = ("compose.gpu.yaml",)
SCRAPE_CONFIG = "deploy/prometheus/prometheus.yml"
ENV_EXAMPLE = ".env.example"


@dataclass(frozen=True)
class Problem:
    """One inconsistency: a kind tests can match on, where it is, and what is wrong."""

    kind: str
    where: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.where}: {self.detail}"
