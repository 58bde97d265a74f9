"""Embedder throughput on 1,200-character chunks: the service's embedder against a plain
ONNX Runtime loop over the same model file, and the session options tried on the way.

    .venv/bin/python benchmarks/embedder_throughput.py \\
        --corpus PATH/TO/mtrag-clapnq/corpus.jsonl [--chunks 192] [--rounds 3]

The chunks are the ClapNQ passages joined and cut at word boundaries into pieces of about
1,200 characters (what `CHUNK_SIZE`'s default makes of prose); MiniLM truncates each at 256
tokens, so most run at full width. Every variant embeds the same chunks in batches of 32
(dataprep's `TEI_EMBEDDING_MAX_BATCH` default). The variants run round-robin, `--rounds`
times, so a load change on this shared machine hits all of them alike; the best round of
each is reported, with the median beside (every other round runs the variants in reverse
order, so a load change within a round does not favour the last ones). Writes
`results/embedder_throughput.json`.

Variants:
- `service`: `OnnxMiniLMEmbedder.embed_sync` as ingestion calls it (length-sorted groups);
- `plain ort`: tokenise the batch padded to its longest text, one `session.run`, mean-pool:
  the shortest loop over the same model file, default session options;
- `plain ort, threads=N`: the same with `intra_op_num_threads = N`;
- `plain ort, graph opt basic/extended`: lower graph optimisation levels (the default is all);
- `plain ort, no spinning`: intra-op threads sleep instead of spinning between runs;
- `plain ort, batch N`: other batch sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from provenance import start_run, write_result

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import onnxruntime  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from chatqna.backends.local_embedder import (  # noqa: E402
    MAX_TOKENS,
    OnnxMiniLMEmbedder,
    packaged_model_files,
)

CHUNK_CHARS = 1200
BATCH = 32


def chunks_of(corpus: Path, count: int) -> list[str]:
    words: list[str] = []
    pieces: list[str] = []
    with corpus.open() as stream:
        for line in stream:
            words += json.loads(line)["text"].split()
            while sum(len(w) + 1 for w in words) > CHUNK_CHARS + 200:
                piece, size = [], 0
                while words and size + len(words[0]) + 1 <= CHUNK_CHARS:
                    size += len(words[0]) + 1
                    piece.append(words.pop(0))
                pieces.append(" ".join(piece))
                if len(pieces) == count:
                    return pieces
    return pieces


class PlainLoop:
    """The shortest embedding loop over the packaged model: pad, run, pool, normalise."""

    def __init__(self, options: onnxruntime.SessionOptions, batch: int = BATCH) -> None:
        model, tokenizer = packaged_model_files()
        self.session = onnxruntime.InferenceSession(
            str(model), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self.tokenizer = Tokenizer.from_file(str(tokenizer))
        self.tokenizer.enable_truncation(max_length=MAX_TOKENS)
        self.tokenizer.enable_padding()
        self.batch = batch

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        rows = []
        for start in range(0, len(texts), self.batch):
            encodings = self.tokenizer.encode_batch(list(texts[start : start + self.batch]))
            ids = np.array([e.ids for e in encodings], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
            (hidden,) = self.session.run(
                ["last_hidden_state"],
                {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)},
            )
            weights = mask[:, :, None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / weights.sum(axis=1)
            rows.append(pooled / np.linalg.norm(pooled, axis=1, keepdims=True))
        return np.vstack(rows)


def options(**settings: Any) -> onnxruntime.SessionOptions:
    result = onnxruntime.SessionOptions()
    for name, value in settings.items():
        if name == "spinning":
            result.add_session_config_entry("session.intra_op.allow_spinning", value)
        else:
            setattr(result, name, value)
    return result


def variants() -> dict[str, Callable[[Sequence[str]], np.ndarray]]:
    level = onnxruntime.GraphOptimizationLevel
    service = OnnxMiniLMEmbedder(max_batch=BATCH)

    def service_embed(texts: Sequence[str]) -> np.ndarray:
        return np.vstack(
            [service.embed_sync(texts[i : i + BATCH]) for i in range(0, len(texts), BATCH)]
        )

    return {
        "service": service_embed,
        "plain ort": PlainLoop(options()).embed,
        "plain ort, threads=1": PlainLoop(options(intra_op_num_threads=1)).embed,
        "plain ort, threads=2": PlainLoop(options(intra_op_num_threads=2)).embed,
        "plain ort, graph opt basic": PlainLoop(
            options(graph_optimization_level=level.ORT_ENABLE_BASIC)
        ).embed,
        "plain ort, graph opt extended": PlainLoop(
            options(graph_optimization_level=level.ORT_ENABLE_EXTENDED)
        ).embed,
        "plain ort, no spinning": PlainLoop(options(spinning="0")).embed,
        "plain ort, batch 8": PlainLoop(options(), batch=8).embed,
        "plain ort, batch 64": PlainLoop(options(), batch=64).embed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--chunks", type=int, default=192)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--output",
        type=Path,
        default=Path(__file__).parent / "results" / "embedder_throughput.json",
    )
    args = parser.parse_args()
    start_run()
    texts = chunks_of(args.corpus, args.chunks)
    load_before = os.getloadavg()
    runs = variants()
    reference = runs["plain ort"](texts[:BATCH])
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for round_number in range(args.rounds):
        # Odd rounds run the variants in reverse: a load change within a round evens out.
        order = list(runs.items())
        for name, embed in order if round_number % 2 == 0 else order[::-1]:
            started = time.perf_counter()
            vectors = embed(texts)
            rates[name].append(len(texts) / (time.perf_counter() - started))
            # Every variant computes the same embeddings (int8 model: within 1e-3).
            assert np.allclose(vectors[:BATCH], reference, atol=2e-3), name
        print(f"round {round_number + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    best_plain = max(rates["plain ort"])
    rows = [
        {
            "variant": name,
            "chunks_per_s_best": round(max(values), 2),
            "chunks_per_s_median": round(statistics.median(values), 2),
            "vs_plain_ort": round(max(values) / best_plain, 3),
            "rounds": [round(v, 2) for v in values],
        }
        for name, values in rates.items()
    ]
    print(
        f"{len(texts)} chunks of ~{CHUNK_CHARS} characters, batches of {BATCH}, best of "
        f"{args.rounds} rounds; onnxruntime {onnxruntime.__version__}, {os.cpu_count()} cores"
    )
    print("| variant | chunks/s (best) | chunks/s (median) | vs plain ORT |")
    print("|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['variant']} | {r['chunks_per_s_best']:.1f} | {r['chunks_per_s_median']:.1f} "
            f"| {r['vs_plain_ort']:.2f} |"
        )
    lengths = [len(t) for t in texts]
    write_result(
        args.output,
        {
            "chunks": len(texts),
            "chunk_chars_mean": round(statistics.fmean(lengths), 1),
            "batch": BATCH,
            "rounds": args.rounds,
            "machine": {
                "onnxruntime": onnxruntime.__version__,
                "loadavg_before": [round(x, 2) for x in load_before],
            },
            "rows": rows,
        },
    )
    print(f"written to {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
