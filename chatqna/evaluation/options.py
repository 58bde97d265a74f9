"""The options of `chatqna bench`, and the service settings its grid options default to.

Grids are comma-separated lists; every value is tried. A grid option that is not given
takes the value the service would run with, from the `Settings` the command loads (so the
environment applies as it does for `chatqna serve`): a bare run measures the configuration
the service ships, beside stateless and the gold rewrite. This module stays light (typer
and the standard library): the CLI imports it to declare the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from chatqna.retrieval.fusion import FUSION_CANDIDATES

if TYPE_CHECKING:
    from chatqna.settings import Settings

# Each grid option (by the CLI's parameter name) and the `Settings` field it defaults to.
SERVICE_DEFAULTS = {
    "alphas": "multi_turn_blend_alpha",
    "history_turns": "multi_turn_history_turns",
    "history_order": "multi_turn_history_order",
    "bm25_weights": "rrf_bm25_weight",
    "bm25_history_weights": "multi_turn_bm25_history_weight",
    "history_roles": "multi_turn_history_roles",
    "assistant_weights": "multi_turn_assistant_weight",
    "self_contained_similarities": "multi_turn_self_contained_similarity",
}

# `--fusion-candidates` when not given: the passages per leg the service fuses.
SERVED_FUSION_CANDIDATES = str(FUSION_CANDIDATES)


def with_service_defaults(options: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """`options` with each grid option not given (None) set to the service's value, written
    as the option would be typed."""
    return {
        **options,
        **{
            name: str(getattr(settings, field))
            for name, field in SERVICE_DEFAULTS.items()
            if options.get(name) is None
        },
    }


def _grid(option: str, text: str) -> Any:
    """A grid option whose default is the service's setting, as its help says."""
    variable = SERVICE_DEFAULTS[option].upper()
    return typer.Option(help=f"{text} (default: the service's setting, {variable})")


Datasets = Annotated[
    list[Path] | None,
    typer.Option(
        "--dataset", help="Dataset directory (corpus + conversations); repeat for several"
    ),
]
OutputDir = Annotated[Path | None, typer.Option(help="Where results go")]
Alphas = Annotated[str | None, _grid("alphas", "Blend alphas to try")]
HistoryTurns = Annotated[str | None, _grid("history_turns", "Blend history windows")]
WithLlm = Annotated[
    bool,
    typer.Option(
        "--llm/--no-llm",
        help="Run condense with the LLM, as MULTI_TURN_MODE=condense serves it; own history "
        "holds the LLM's answers (with --service, the service's), not the top passage",
    ),
]
Samples = Annotated[int, typer.Option(help="Bootstrap samples")]
CacheDir = Annotated[Path | None, typer.Option(help="Embedding cache")]
ServiceUrl = Annotated[
    str | None,
    typer.Option(
        help="Score a running service instead (it runs its own settings: the grid options "
        "do not apply)"
    ),
]
Ingest = Annotated[bool, typer.Option(help="With --service: upload the corpus first")]
HistoryOrder = Annotated[
    str | None,
    _grid("history_order", "Blend history orders: chronological, newest_first or both"),
]
Bm25Weights = Annotated[str | None, _grid("bm25_weights", "BM25 fusion weights for hybrid")]
Bm25HistoryWeights = Annotated[
    str | None,
    _grid("bm25_history_weights", "Blend: weights of the history-aware BM25 leg (0 = off)"),
]
HistoryRoles = Annotated[
    str | None,
    _grid(
        "history_roles",
        "Blend history roles, comma-separated: user_assistant, user, separate "
        "(both = user_assistant,user)",
    ),
]
AssistantWeights = Annotated[
    str | None,
    _grid("assistant_weights", "Separate roles: the assistant messages' shares to try"),
]
History = Annotated[
    str,
    typer.Option(
        help="Assistant turns in the history: reference (the dataset's), own (the "
        "system's own answers, replayed turn by turn) or both"
    ),
]
PassageContext = Annotated[
    str, typer.Option(help="What each passage's legs see besides its text: title or none")
]
SelfContained = Annotated[
    str | None,
    _grid(
        "self_contained_similarities",
        "Blend: similarities to the previous question at which a follow-up is "
        "searched on its own (0 = never)",
    ),
]
FusionCandidates = Annotated[
    str,
    typer.Option(
        help=f"Hybrid: passages per leg fused by RRF, at least the depth (the service fuses "
        f"{FUSION_CANDIDATES})"
    ),
]
Render = Annotated[
    Path | None, typer.Option(help="Only redraw tables and chart from a results.json")
]
RerankerEndpoint = Annotated[
    str | None,
    typer.Option(help="Rerank with this TEI-compatible /rerank server (TEI_RERANKING_ENDPOINT)"),
]
EmbeddedReranker = Annotated[
    str | None,
    typer.Option(help="Without an endpoint: none or similarity (CHATQNA_EMBEDDED_RERANKER)"),
]
