"""RediSearch queries of the Redis stores: the KNN leg, the BM25 leg and its tie-breaker.

Each function returns the arguments of one `FT.SEARCH` or `FT.AGGREGATE` command (built with
redis-py's `Query` where it has the options), for a node client or a pipeline to run; the
replies are parsed by `chatqna.retrieval.redis.replies`. The single-node and the cluster
store send the same commands (the cluster store to every primary).
"""

from __future__ import annotations

import re

import numpy as np
from redis.commands.search.query import Query

from chatqna.backends.protocols import SearchQuery
from chatqna.retrieval.query import TermUnion, WeightedQuery, query_tree
from chatqna.retrieval.redis.schema import BM25_SCORER

# The stored fields a search hit is built from (`embedding` as raw float32 bytes), and the
# digest of the version they belong to (`chatqna.retrieval.redis.consistency`).
RETURNED = ("chunk_id", "content", "source", "title", "chunk_index", "embedding", "digest")
DIALECT = 2  # KNN needs dialect 2
_QUERY_SPECIAL = re.compile(r"[^0-9A-Za-z\u0080-\U0010ffff]")

Args = list[str | int | float | bytes]


def _escape(token: str) -> str:
    return _QUERY_SPECIAL.sub(lambda m: "\\" + m.group(0), token)


def _render(node: str | TermUnion) -> str:
    if isinstance(node, str):
        return _escape(node)
    inner = " | ".join(_render(child) for child in node.children)
    if node.weight == 1.0:
        return f"({inner})"
    # repr() round-trips the float, so RediSearch multiplies by exactly the same weight.
    return f"({inner}) => {{ $weight: {node.weight!r}; }}"


def bm25_query(query: WeightedQuery) -> str | None:
    """The RediSearch query for a BM25 query tree (`query_tree`); None when it has no term.

    Terms come from the embedded BM25's tokeniser (lower-cased `\\w+`, stop words dropped),
    so no query syntax in user text survives (`@`, `|`, `-`, `%`, parentheses), and every
    character other than an ASCII letter or digit is escaped all the same. The history's
    terms form a union with a `$weight` attribute.
    """
    tree = query_tree(query)
    return None if tree is None else "@terms:" + _render(tree)


def search_text(query: SearchQuery) -> str | None:
    """The BM25 leg's RediSearch query for a search: its text, with its history's terms at
    the history's weight; None when neither has a term."""
    lexical = WeightedQuery.parse(query.text, query.bm25_history, query.bm25_history_weight)
    return bm25_query(lexical)


def knn_search(index: str, vector: np.ndarray, depth: int, *, fields: bool) -> Args:
    """`FT.SEARCH` for the `depth` nearest passages by cosine distance (`dist`), nearest
    first, each with its `digest`; with `fields`, every stored field of `RETURNED` comes
    back too (a cluster node returns `digest` alone: the index holds it, sortable)."""
    returned = [*RETURNED, "dist"] if fields else ["dist", "digest"]
    query = (
        Query(f"*=>[KNN {depth} @embedding $vec AS dist]")
        .sort_by("dist")
        .return_fields(*returned)
        .paging(0, depth)
        .dialect(DIALECT)
    )
    params: Args = ["PARAMS", 2, "vec", vector.astype(np.float32).tobytes()]
    return ["FT.SEARCH", index, *query.get_args(), *params]


def bm25_search(index: str, text_query: str, depth: int) -> Args:
    """`FT.SEARCH` for the best `depth + 1` BM25 hits (ids, scores and each hit's `digest`):
    one more than needed tells whether a tie straddles the cut."""
    query = Query(text_query).verbatim().scorer(BM25_SCORER).with_scores().return_fields("digest")
    return ["FT.SEARCH", index, *query.paging(0, depth + 1).dialect(DIALECT).get_args()]


def bm25_aggregate(
    index: str, text_query: str, depth: int, tie_field: str, *, digest: bool = False
) -> Args:
    """`FT.AGGREGATE` for the best `depth` BM25 hits with ties ordered by `tie_field`
    (`__key` or `chunk_id`), sorted on the server, each row with its `__key` (and with
    `digest` its `digest`): asked only when a tie straddles the cut, as FT.SEARCH orders
    ties by insertion. Scores come back printed to 12 digits."""
    loaded = ["@__key"] if tie_field == "__key" else ["@__key", f"@{tie_field}"]
    loaded += ["@digest"] if digest else []
    return [
        "FT.AGGREGATE", index, text_query, "VERBATIM", "SCORER", BM25_SCORER, "ADDSCORES",
        "LOAD", len(loaded), *loaded, "SORTBY", 4, "@__score", "DESC", f"@{tie_field}", "ASC",
        "LIMIT", 0, depth, "DIALECT", DIALECT,
    ]  # fmt: skip
