"""The configuration under test against its references, with paired bootstrap intervals.

`shipped_references(settings, depth)` names the rows, each a `Mode`:

| row                      | query side                                  | retrieval            |
|--------------------------|---------------------------------------------|----------------------|
| `default blend`          | the blend as `Settings` configures it       | as `Settings` ships  |
| `stateless`              | the latest message                          | as `Settings` ships  |
| `stateless, dense only`  | the latest message                          | dense only           |
| `seed blend`             | a = 0.7, 6 messages oldest first, BM25 plain | equal-weight RRF of  |
|                          |                                             | each leg's best k    |
| `gold rewrite`           | the dataset's standalone rewrite            | as `Settings` ships  |

"As `Settings` ships" is hybrid search (when enabled) with the configured fusion weights and
`FUSION_CANDIDATES` passages per leg. Every row runs without the reranker (the retrieval
stage alone) and with the embedded similarity reranker. Each reference is compared with the
`default blend` of the same reranker setting: per turn, `default - reference`, its mean and
95% interval from resampling conversations (`paired_bootstrap`), on follow-ups and on first
turns. `turn_1_identical` says whether the default's first-turn rankings are exactly the
stateless ones under the same retrieval (they must be: the blend never runs on turn 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from chatqna.evaluation.dataset import EvalTurn
from chatqna.evaluation.metrics import paired_bootstrap, summarise
from chatqna.evaluation.modes import Mode, ModeResult, turn_groups
from chatqna.evaluation.strategies import SEED, QueryStrategy
from chatqna.multiturn.strategy import MultiTurnConfig
from chatqna.retrieval.fusion import FUSION_CANDIDATES
from chatqna.settings import Settings

SEED_BLEND = QueryStrategy("blend", SEED)
STATELESS = QueryStrategy("stateless")
REPORTED = ("R@5", "nDCG@5", "R@10")


@dataclass(frozen=True)
class Reference:
    """A named mode; `under_test` marks the configuration the others are compared with."""

    name: str
    mode: Mode
    under_test: bool = False


def default_strategy(settings: Settings) -> QueryStrategy:
    """The blend as the service runs it with these settings' blend values: alpha, history
    window, order and roles, the assistant messages' share, the BM25 history weight, the
    self-contained similarity and the reranker's query (`MULTI_TURN_RERANK_QUERY`).

    `MULTI_TURN_MODE` and `MULTI_TURN_BLEND_ENABLED` are not read: the row measures the blend
    these settings configure whether or not they switch it on (with the blend off, the
    service serves the `stateless` row). History translation does not run: the harness
    plans without the LLM, as the service does for history it detects as English."""
    return QueryStrategy("blend", MultiTurnConfig.from_settings(settings))


def condense_strategy(settings: Settings) -> QueryStrategy:
    """Condense as `MULTI_TURN_MODE=condense` serves it with these settings: the history
    window, the rewrite's timeout and its length cap."""
    return QueryStrategy("condense_llm", MultiTurnConfig.from_settings(settings))


def shipped_references(settings: Settings, depth: int) -> list[Reference]:
    hybrid = settings.retriever_hybrid_retrieval_enabled
    dense, sparse = settings.rrf_dense_weight, settings.rrf_bm25_weight
    references = []
    for rerank in (False, True):
        suffix = ", rerank" if rerank else ""

        def shipped(query: QueryStrategy, rerank: bool = rerank) -> Mode:
            return Mode(
                query,
                hybrid,
                rerank,
                candidates=FUSION_CANDIDATES,
                dense_weight=dense,
                bm25_weight=sparse,
            )

        references += [
            Reference(f"default blend{suffix}", shipped(default_strategy(settings)), True),
            Reference(f"stateless{suffix}", shipped(STATELESS)),
            Reference(f"stateless, dense only{suffix}", Mode(STATELESS, False, rerank)),
            Reference(f"seed blend{suffix}", Mode(SEED_BLEND, True, rerank, 1.0, depth)),
            Reference(f"gold rewrite{suffix}", shipped(QueryStrategy("condense_gold"))),
        ]
    return references


def compare_references(
    references: Sequence[Reference],
    results: Sequence[ModeResult],
    turns: Sequence[EvalTurn],
    *,
    samples: int = 1000,
) -> dict[str, Any]:
    """Per row: metrics, and paired differences with the row under test of its reranker
    setting; plus whether that row's first turns equal stateless."""
    by_rerank = {
        r.mode.rerank: res for r, res in zip(references, results, strict=True) if r.under_test
    }
    splits = turn_groups(turns)
    rows = []
    for reference, result in zip(references, results, strict=True):
        row: dict[str, Any] = {
            "name": reference.name,
            "label": reference.mode.label,
            "under_test": reference.under_test,
            "rerank": reference.mode.rerank,
        }
        for split, members in splits.items():
            groups = [t.conversation_id for t in members]
            summary = summarise([result.per_turn[t.key] for t in members], groups, samples=samples)
            row[split] = {name: summary[name] for name in REPORTED if name in summary}
        tested = by_rerank.get(reference.mode.rerank)
        if tested is not None and not reference.under_test:
            row["default_minus_this"] = {
                split: {
                    name: paired_bootstrap(
                        [tested.per_turn[t.key][name] for t in members],
                        [result.per_turn[t.key][name] for t in members],
                        [t.conversation_id for t in members],
                        samples=samples,
                    )
                    for name in REPORTED
                }
                for split, members in splits.items()
                if members
            }
        rows.append(row)
    identical = {}
    for result in results:
        tested = by_rerank.get(result.mode.rerank)
        if tested is not None and result.mode == replace(tested.mode, query=STATELESS):
            identical["rerank" if result.mode.rerank else "no rerank"] = all(
                tested.rankings[t.key] == result.rankings[t.key] for t in splits["turn_1"]
            )
    return {"rows": rows, "turn_1_identical": identical}


def comparison_markdown(comparison: dict[str, Any], heading: str = "") -> list[str]:
    """The comparison as a Markdown table (mean [95% interval])."""

    def cell(value: dict[str, float] | None) -> str:
        if value is None:
            return "-"
        return f"{value['mean']:+.3f} [{value['low']:+.3f}, {value['high']:+.3f}]"

    def plain(value: dict[str, float] | None) -> str:
        return "-" if value is None else f"{value['mean']:.3f}"

    lines = [
        "## The defaults against the references" + (f" {heading}" if heading else ""),
        "",
        "Paired differences (default blend minus the row), 95% intervals from resampling "
        "conversations. First-turn rankings of the default equal stateless (same retrieval): "
        + ", ".join(f"{k}: {v}" for k, v in comparison["turn_1_identical"].items())
        + ".",
        "",
        "| row | mode | follow-up R@5 | turn 1 R@5 | default - row, follow-up R@5 "
        "| default - row, follow-up nDCG@5 | default - row, turn 1 R@5 |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in comparison["rows"]:
        diff = row.get("default_minus_this", {})
        follow = diff.get("follow_ups", {})
        first = diff.get("turn_1", {})
        lines.append(
            f"| {row['name']} | {row['label']} | {plain(row['follow_ups'].get('R@5'))} | "
            f"{plain(row.get('turn_1', {}).get('R@5'))} | {cell(follow.get('R@5'))} | "
            f"{cell(follow.get('nDCG@5'))} | {cell(first.get('R@5'))} |"
        )
    return lines


def side_by_side_markdown(comparisons: dict[str, dict[str, Any]]) -> list[str]:
    """Each comparison row's follow-up R@5 with reference and with own history, and the
    default's paired difference with it under each (mean [95% interval])."""
    kinds = list(comparisons)
    lines = [
        "## Reference history and own history, side by side",
        "",
        "Follow-up R@5; `default - row` is the paired difference with the default blend of "
        "the same reranker setting and history, 95% intervals from resampling conversations. "
        "Own history replaces every earlier assistant message by the system's own answer "
        "(without an LLM: the first 800 characters of its top passage).",
        "",
        "| row | "
        + " | ".join(f"{kind} history | default - row ({kind})" for kind in kinds)
        + " |",
        "|---|" + "---|---|" * len(kinds),
    ]
    rows = {kind: comparisons[kind]["rows"] for kind in kinds}
    for position, row in enumerate(rows[kinds[0]]):
        cells = []
        for kind in kinds:
            other = rows[kind][position]
            value = other["follow_ups"].get("R@5")
            diff = other.get("default_minus_this", {}).get("follow_ups", {}).get("R@5")
            cells.append("-" if value is None else f"{value['mean']:.3f}")
            cells.append(
                "-"
                if diff is None
                else f"{diff['mean']:+.3f} [{diff['low']:+.3f}, {diff['high']:+.3f}]"
            )
        lines.append(f"| {row['name']} | " + " | ".join(cells) + " |")
    identical = {kind: all(comparisons[kind]["turn_1_identical"].values()) for kind in kinds}
    lines += [
        "",
        "First-turn rankings of the default equal stateless: "
        + ", ".join(f"{kind} history: {value}" for kind, value in identical.items())
        + ".",
    ]
    return lines
