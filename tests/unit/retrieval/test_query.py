"""The BM25 query: the shared tokeniser, weighted queries and the query tree."""

from __future__ import annotations

from chatqna.retrieval import query as query_module
from chatqna.retrieval.query import (
    FANOUT,
    MAX_QUERY_TERMS,
    MAX_TOKEN_BYTES,
    STOP_WORDS,
    TermUnion,
    WeightedQuery,
    informative_terms,
    query_tree,
    tokenize,
)


def q(text: str, history: str = "", weight: float = 0.0) -> WeightedQuery:
    return WeightedQuery.parse(text, history, weight)


def test_tokenize_lowercases() -> None:
    assert tokenize("Refund POLICY Invoice") == ["refund", "policy", "invoice"]


def test_tokenize_drops_stop_words() -> None:
    assert tokenize("How long do I have to return it?") == ["long", "return"]
    assert {"the", "and", "how", "do", "i"} <= STOP_WORDS


def test_tokenize_splits_on_non_word_characters() -> None:
    assert tokenize("e-mail: support@example.com/help (24h)") == [
        "e",
        "mail",
        "support",
        "example",
        "com",
        "help",
        "24h",
    ]
    # Underscores and digits are word characters.
    assert tokenize("snake_case v2.0") == ["snake_case", "v2", "0"]


def test_tokenize_stop_words_are_matched_after_lowercasing() -> None:
    assert tokenize("THE And OF") == []


def test_tokenize_empty() -> None:
    assert tokenize("") == []
    assert tokenize("  ... !!! ") == []


def test_tokenize_drops_tokens_redisearch_could_not_match() -> None:
    longest = "a" * MAX_TOKEN_BYTES
    assert tokenize(f"{longest} {longest}b refund") == [longest, "refund"]
    # The limit counts UTF-8 bytes: 33 two-byte letters are 66 bytes.
    assert tokenize("é" * 32 + " " + "é" * 33) == ["é" * 32]


def test_history_terms_are_weighted_and_never_override_query_terms() -> None:
    parsed = q("How long do I have?", "export my data long", 0.5)
    assert parsed == WeightedQuery(("long",), ("export", "data"), 0.5)
    assert q("How long?", "export data", 0.0) == WeightedQuery(("long",))
    # Nothing new in the history: no weighted union at all.
    assert q("long data", "data long", 0.5) == WeightedQuery(("long", "data"))
    assert q("", "", 0.5).empty and not q("", "export", 0.5).empty


def test_query_tree_keeps_every_union_narrow() -> None:
    terms = [f"t{i:02d}" for i in range(20)]
    tree = query_tree(WeightedQuery(tuple(terms)))
    assert tree is not None

    def widths(node: TermUnion) -> list[int]:
        nested = [
            w for child in node.children if isinstance(child, TermUnion) for w in widths(child)
        ]
        return [len(node.children), *nested]

    def leaves(node: TermUnion) -> list[str]:
        out: list[str] = []
        for child in node.children:
            out += [child] if isinstance(child, str) else leaves(child)
        return out

    assert max(widths(tree)) <= FANOUT
    assert leaves(tree) == terms
    # Only the last child of a union nests (RediSearch folds a leading group into its parent).
    assert all(isinstance(c, str) for c in tree.children[:-1])
    with_history = query_tree(WeightedQuery(tuple(terms), ("h1", "h2"), 0.3))
    assert with_history is not None and len(with_history.children) == FANOUT
    assert with_history.children[-1] == TermUnion(("h1", "h2"), 0.3)
    assert query_tree(WeightedQuery((), ("h1", "h2"), 0.3)) == TermUnion(("h1", "h2"), 0.3)
    assert query_tree(WeightedQuery(())) is None


def longest_message(chars: int = 8000) -> str:
    """A message of `chars` characters (the API's default limit), every word distinct."""
    words: list[str] = []
    while sum(len(w) + 1 for w in words) + 8 <= chars:
        words.append(f"w{len(words)}")
    return " ".join(words)


def depth(node: str | TermUnion) -> int:
    if isinstance(node, str):
        return 0
    return 1 + max(depth(child) for child in node.children)


def test_a_long_text_keeps_its_most_informative_terms() -> None:
    assert len(q(longest_message()).terms) == MAX_QUERY_TERMS
    # Repeated most first, then longer, then earlier; kept in first-seen order.
    text = "beta alpha gamma alpha delta epsilon epsilon zeta"
    assert informative_terms(_distinct(text), text, limit=3) == ("alpha", "gamma", "epsilon")
    assert informative_terms(_distinct(text), text, limit=5) == (
        "beta", "alpha", "gamma", "delta", "epsilon",
    )  # fmt: skip
    # Up to the cap every term stays, in order: an ordinary question is untouched.
    words = [f"t{i}" for i in range(MAX_QUERY_TERMS)]
    assert q(" ".join(words)).terms == tuple(words)


def test_the_history_is_capped_apart_and_never_brings_back_a_dropped_term() -> None:
    text = longest_message()
    history = " ".join(f"h{i}" for i in range(3 * MAX_QUERY_TERMS))
    dropped = next(t for t in tokenize(text) if t not in q(text).terms)
    parsed = q(text, f"{history}\n{dropped}", 0.3)
    assert len(parsed.terms) == len(parsed.history_terms) == MAX_QUERY_TERMS
    assert dropped not in parsed.history_terms


def test_the_tree_of_any_accepted_message_stays_shallow() -> None:
    text = longest_message()
    for query in (q(text), q(text, text.replace("w", "h"), 0.3), q("", text, 0.3)):
        tree = query_tree(query)
        assert tree is not None and depth(tree) <= 20


def _distinct(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(tokenize(text)))


def test_remembered_terms_are_the_terms_of_the_text() -> None:
    texts = [
        "How long do I have to return it?",
        "",
        "the and of",
        "Refund refund REFUND policy",
        "İstanbul straße ΣΊΣΥΦΟΣ 中文 \U00020000 e-mail_x v2.0",
        "x" * (MAX_TOKEN_BYTES + 1) + " kept",
    ]
    long_text = longest_message(600)
    for text in [*texts, long_text, long_text + "\n" + texts[0]]:
        query_module._joined_terms.cache_clear()
        cold = query_module._line_terms(text)
        assert cold == list(_distinct(text))
        assert query_module._line_terms(text) == cold  # a second time, from the cache if short


def test_only_short_texts_are_remembered() -> None:
    query_module._joined_terms.cache_clear()
    limit = query_module._CACHED_TEXT_CHARS
    words = "return policy " * limit
    short, long = "refund policy", words[: limit + 1]
    q(long, f"{short}\n{long}", 0.5)
    assert query_module._joined_terms.cache_info().currsize == 1
    q(words[:limit])
    assert query_module._joined_terms.cache_info().currsize == 2
