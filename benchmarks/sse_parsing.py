"""What reading an event stream costs the client: `SSEDecoder`, httpx lines, httpx-sse.

    .venv/bin/python benchmarks/sse_parsing.py [--tokens 200] [--repeats 7]

One chat stream as the service writes it (a metadata event, `--tokens` chunks, `[DONE]`) is
read through an `httpx.Response` in two read patterns: one event per network read (a server
that flushes every token, as under load) and 4 KiB reads. Each reader turns the stream into
(event, data) pairs; none decodes the JSON, which costs the same whichever parser ran:

- `sse-decoder`: `chatqna.upstream.sse.SSEDecoder` fed raw bytes, what the service, the
  CLI and the load benchmark use;
- `iter-lines`: httpx's `iter_lines()` plus a field loop (`event:` and `data:` lines only,
  not the whole standard: enough for streams whose events carry one data line);
- `httpx-sse`: `httpx_sse.EventSource.iter_sse()`, when that package is installed (the
  bench extra installs it).

Every reader must return the same events as `sse-decoder`, or the run stops. Prints
microseconds per event (best of `--repeats`) and the ratio to `sse-decoder`, and writes
JSON to `results/sse_parsing.json`. Run it on a quiet machine and compare the rows of one
run with each other: absolute times drift with the load, ratios much less.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from provenance import start_run, write_result

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from chatqna.api.chat_schemas import ChunkDelta  # noqa: E402
from chatqna.api.sse import DONE, ChunkWriter, data, event  # noqa: E402
from chatqna.upstream.sse import SSEDecoder  # noqa: E402

OUTPUT = Path(__file__).parent / "results" / "sse_parsing.json"
Reader = Callable[[httpx.Response], list[tuple[str, str]]]


def chat_events(tokens: int) -> list[bytes]:
    writer = ChunkWriter("bench-model")
    documents = [
        {"source": f"doc{i}.md", "title": "Title", "text": "word " * 40, "score": 0.5}
        for i in range(3)
    ]
    events = [event("metadata", {"source_documents": documents, "retrieval": {"k": 4}})]
    events += [data(writer.chunk(ChunkDelta(content=f"token{i} "))) for i in range(tokens)]
    return [*events, data(writer.chunk(ChunkDelta(), "stop")), DONE]


def reads(events: list[bytes], size: int | None) -> list[bytes]:
    """The network reads: one per event, or the whole body cut into `size`-byte reads."""
    if size is None:
        return list(events)
    body = b"".join(events)
    return [body[start : start + size] for start in range(0, len(body), size)]


def sse_decoder(response: httpx.Response) -> list[tuple[str, str]]:
    decoder = SSEDecoder()
    out: list[tuple[str, str]] = []
    for chunk in response.iter_raw():
        out.extend((item.event, item.data) for item in decoder.feed(chunk))
    return out


def iter_lines(response: httpx.Response) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    name = "message"
    for line in response.iter_lines():
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            out.append((name, line[5:].strip()))
            name = "message"
    return out


def httpx_sse_reader() -> Reader | None:
    try:
        from httpx_sse import EventSource
    except ImportError:
        return None

    def read(response: httpx.Response) -> list[tuple[str, str]]:
        return [(item.event, item.data) for item in EventSource(response).iter_sse()]

    return read


def response_over(chunks: list[bytes]) -> httpx.Response:
    def stream() -> Iterator[bytes]:
        yield from chunks

    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream())


def best_seconds(reader: Reader, chunks: list[bytes], repeats: int, streams: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        responses = [response_over(chunks) for _ in range(streams)]
        started = time.perf_counter()
        for response in responses:
            reader(response)
        best = min(best, time.perf_counter() - started)
    return best / streams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--streams", type=int, default=50, help="streams per timed repeat")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    start_run()

    events = chat_events(args.tokens)
    readers: dict[str, Reader] = {"sse-decoder": sse_decoder, "iter-lines": iter_lines}
    library = httpx_sse_reader()
    if library is not None:
        readers["httpx-sse"] = library
    rows = []
    for pattern, size in (("one event per read", None), ("4 KiB reads", 4096)):
        chunks = reads(events, size)
        expected = sse_decoder(response_over(chunks))
        assert len(expected) == len(events)
        baseline = None
        for name, reader in readers.items():
            assert reader(response_over(chunks)) == expected, name  # same events, or no row
            seconds = best_seconds(reader, chunks, args.repeats, args.streams)
            baseline = seconds if baseline is None else baseline
            rows.append(
                {
                    "reads": pattern,
                    "reader": name,
                    "us_per_event": round(seconds / len(events) * 1e6, 3),
                    "ratio_to_sse_decoder": round(seconds / baseline, 2),
                }
            )

    print(f"{'reads':<20} {'reader':<12} {'us/event':>9} {'ratio':>6}")
    for row in rows:
        print(
            f"{row['reads']:<20} {row['reader']:<12} {row['us_per_event']:>9.3f} "
            f"{row['ratio_to_sse_decoder']:>6.2f}"
        )
    result = {
        "benchmark": "sse_parsing",
        "tokens": args.tokens,
        "events_per_stream": len(events),
        "repeats": args.repeats,
        "streams_per_repeat": args.streams,
        "python": platform.python_version(),
        "httpx": httpx.__version__,
        "rows": rows,
    }
    write_result(args.output, result)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
