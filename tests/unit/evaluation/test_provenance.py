"""Where a result was measured: a work tree with uncommitted changes is refused unless the
operator opts in, and a recorded command carries the settings it ran with, never a secret."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatqna.evaluation.provenance import (
    HIDDEN,
    DirtyWorkTree,
    measured_commit,
    recordable_environment,
    recorded_command,
)
from chatqna.settings import variables_set
from tests.unit.evaluation.conftest import git

OPT_IN = "set CHATQNA_BENCH_ALLOW_DIRTY=1"


def test_a_clean_checkout_is_measured_at_head(checkout: Path) -> None:
    head = git(checkout, "rev-parse", "HEAD")
    assert measured_commit(checkout, allow_dirty=False, opt_in=OPT_IN) == head


@pytest.mark.parametrize("staged", [False, True], ids=["unstaged", "staged"])
def test_a_changed_file_is_refused_with_the_way_to_opt_in(checkout: Path, staged: bool) -> None:
    (checkout / "bench.py").write_text("print('measure faster')\n")
    if staged:
        git(checkout, "add", "bench.py")
    with pytest.raises(DirtyWorkTree) as refused:
        measured_commit(checkout, allow_dirty=False, opt_in=OPT_IN)
    assert refused.value.changes == ["bench.py"]
    assert "bench.py" in str(refused.value) and OPT_IN in str(refused.value)


def test_with_the_opt_in_a_changed_file_is_stamped_dirty(checkout: Path) -> None:
    (checkout / "bench.py").write_text("print('measure faster')\n")
    head = git(checkout, "rev-parse", "HEAD")
    assert measured_commit(checkout, allow_dirty=True, opt_in=OPT_IN) == f"{head}+dirty"


def test_a_new_file_git_does_not_ignore_is_a_change(checkout: Path) -> None:
    (checkout / "helper.py").write_text("SPEED = 2\n")
    with pytest.raises(DirtyWorkTree, match=r"helper\.py"):
        measured_commit(checkout, allow_dirty=False, opt_in=OPT_IN)


def test_the_whole_work_tree_counts_when_run_from_a_subdirectory(checkout: Path) -> None:
    (checkout / "helper.py").write_text("SPEED = 2\n")
    (checkout / "benchmarks" / "probe.py").write_text("print('probe')\n")
    (checkout / "benchmarks" / "results" / "bench.json").write_text('{"rows": [1]}\n')
    with pytest.raises(DirtyWorkTree) as refused:
        measured_commit(checkout / "benchmarks", allow_dirty=False, opt_in=OPT_IN)
    assert sorted(refused.value.changes) == ["benchmarks/probe.py", "helper.py"]


def test_ignored_files_and_earlier_results_are_no_change(checkout: Path) -> None:
    (checkout / ".cache").mkdir()
    (checkout / ".cache" / "embeddings.npy").write_bytes(b"\0")
    (checkout / "benchmarks" / "results" / "bench.json").write_text('{"rows": [1]}\n')
    (checkout / "benchmarks" / "results" / "other.json").write_text("{}\n")
    head = git(checkout, "rev-parse", "HEAD")
    assert measured_commit(checkout, allow_dirty=False, opt_in=OPT_IN) == head


def test_outside_a_checkout_there_is_no_commit(tmp_path: Path) -> None:
    assert measured_commit(tmp_path, allow_dirty=False, opt_in=OPT_IN) is None


def test_a_recorded_command_starts_with_the_settings_it_ran_with() -> None:
    environ = {
        "MULTI_TURN_BLEND_ENABLED": "true",
        "retriever_k": "8",  # Settings reads names in any case
        "CHATQNA_DATA_DIR": "/tmp/a dir",
        "HOME": "/home/someone",  # not a setting
        "CHATQNA_BENCH_ALLOW_DIRTY": "1",  # nor is the opt-in
    }
    assert recorded_command("python benchmarks/turn_latency.py --repeat 20", environ) == (
        "CHATQNA_DATA_DIR='/tmp/a dir' MULTI_TURN_BLEND_ENABLED=true retriever_k=8 "
        "python benchmarks/turn_latency.py --repeat 20"
    )


def test_without_settings_the_command_is_as_typed() -> None:
    assert recorded_command("chatqna bench --dataset lab", {"PATH": "/bin"}) == (
        "chatqna bench --dataset lab"
    )


def test_no_secret_is_recorded() -> None:
    environ = {
        "OPENAI_API_KEY": "sk-secret",
        "chatqna_api_key": "secret",
        "REDIS_URL": "redis://user:pw-secret@redis:6379/0?password=secret&db=1",
        "LLM_ENDPOINT": "http://user:secret@llm:8000/v1",
        "TEI_EMBEDDING_ENDPOINT": "http://tei:80",
        "LLM_MODEL_ID": "Qwen/Qwen2.5-7B-Instruct",
    }
    recorded = recordable_environment(variables_set(environ))
    assert recorded == {
        "LLM_ENDPOINT": "http://llm:8000/v1",
        "LLM_MODEL_ID": "Qwen/Qwen2.5-7B-Instruct",
        "REDIS_URL": "redis://redis:6379/0?db=1",
        "TEI_EMBEDDING_ENDPOINT": "http://tei:80",
    }
    assert "secret" not in recorded_command("python x.py", environ)


@pytest.mark.parametrize(
    ("value", "recorded"),
    [
        # A password holding what ends an authority to a URL parser: `/`, `#`, `?`.
        ("redis://:s3cr/et@redis:6379", "redis://redis:6379"),
        ("http://bob:pa#ss@proxy:3128", "http://proxy:3128"),
        ("http://bob:p@ss@proxy:3128", "http://proxy:3128"),
        # Query parameters named like a signature or an authorisation are secrets too.
        ("http://llm:8000/v1?auth=abc", "http://llm:8000/v1"),
        ("https://store/x?X-Amz-Signature=abc&part=2", "https://store/x?part=2"),
        ("http://llm:8000/v1?sig=abc&model=m", "http://llm:8000/v1?model=m"),
        # Nothing to take out: the value as it was set.
        ("http://tei:80/embed?model=bge", "http://tei:80/embed?model=bge"),
        ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct"),
        # Cannot be parsed, so cannot be cleaned: hidden whole.
        ("http://u:pw@[::1:8080/", HIDDEN),
        ("http://[::1:8080/", HIDDEN),
        # An `@` after a `?`: a password, or a query value whose tail would pass as the host.
        ("http://bob:pa?ss@proxy:3128/v1", HIDDEN),
        ("http://llm:8000/v1?token=ab@cd", HIDDEN),
    ],
)
def test_credentials_are_taken_out_of_any_url(value: str, recorded: str) -> None:
    assert recordable_environment({"LLM_ENDPOINT": value}) == {"LLM_ENDPOINT": recorded}
