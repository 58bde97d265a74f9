"""The chat UI in headless Chromium against real server processes.

Two servers, each with the sample corpus ingested through the API, answer with a stand-in LLM
that quotes the top passage (so answers are quick and checkable): one in blend mode, one in
condense mode with an API key (which the browser signs in with) and a rewrite model that
fails on demand. A third server, run under a root path behind a prefix-stripping proxy,
serves the page at a URL without its trailing slash. Chromium and chromedriver are Debian's
packages, installed by `scripts/browser`; Selenium drives them by path and downloads
nothing. With `CHATQNA_UI_SCREENSHOTS=1` the run also writes the documentation's
screenshots.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.wait import WebDriverWait

from tests.integration.conftest import REPO, SAMPLE_CORPUS, ServerProcess, start_server
from tests.standins.servers import serve_in_thread
from tests.standins.stripping_proxy import stripping_proxy

pytestmark = pytest.mark.slow


CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOTS = REPO / "site" / "docs" / "img"
API_KEY = "ui-test-key"
LLM_MODEL = "quote-top-passage"
REWRITE = "How many days after purchase can an annual plan be refunded?"
FIRST = "How do I get a refund for an annual plan?"
FOLLOW_UP = "How long do I have?"
UPLOAD_NAME = "starlight-garden.md"
UPLOAD_TEXT = (
    "# Starlight Garden\n\n## Watering the moonflowers\n"
    "The moonflower beds in the Starlight Garden are watered at 4:45 every morning with "
    "rain water from the copper cistern behind the greenhouse.\n"
)
PASSAGE = re.compile(
    r"Passages:\n\[1\] (?P<source>\S+)[^\n]*\n(?P<text>.*?)(?:\n\n\[2\] |\Z)", re.S
)


def quoted_answer(messages: list[dict[str, str]]) -> str:
    """What the stand-in LLM says: the top passage's first two sentences, and its file."""
    match = PASSAGE.search(messages[0]["content"])
    if match is None:
        return "I do not know: no passages were found."
    sentences = re.split(r"(?<=[.!?])\s+", match["text"].strip())
    return f"{' '.join(sentences[:2])} (Source: {match['source']})"


@dataclass
class RewriteControl:
    """Switches the stand-in rewrite model between failing (HTTP 500) and answering."""

    failing: bool = False
    calls: int = 0
    transcript: str = ""


def llm_app(token_delay: float) -> FastAPI:
    """An OpenAI-compatible chat server that streams `quoted_answer` word by word."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": LLM_MODEL, "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()
        words = quoted_answer(body["messages"]).split(" ")

        async def stream() -> AsyncIterator[str]:
            for index, word in enumerate(words):
                await asyncio.sleep(token_delay)
                piece = word if index == 0 else " " + word
                chunk = {"choices": [{"index": 0, "delta": {"content": piece}}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            yield f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app


def rewrite_app(control: RewriteControl) -> FastAPI:
    """The condense model: a fixed standalone question (as the JSON the rewrite prompt asks
    for), or HTTP 500 while `failing`; it keeps the transcript it was last sent."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "rewriter", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> JSONResponse:
        control.calls += 1
        control.transcript = (await request.json())["messages"][-1]["content"]
        if control.failing:
            return JSONResponse({"error": "overloaded"}, status_code=500)
        reply = json.dumps({"standalone_query": REWRITE})
        message = {"role": "assistant", "content": reply}
        return JSONResponse(
            {"object": "chat.completion", "choices": [{"index": 0, "message": message}]}
        )

    return app


@dataclass
class Servers:
    blend: ServerProcess
    condense: ServerProcess
    rewrites: RewriteControl


def ingest_corpus(server: ServerProcess, headers: dict[str, str]) -> None:
    files = [("files", (p.name, p.read_bytes(), "text/markdown")) for p in SAMPLE_CORPUS.iterdir()]
    response = httpx2.post(
        f"{server.url}/v1/dataprep/ingest", files=files, headers=headers, timeout=120
    )
    assert response.status_code == 200, response.text


def start_with_corpus(root: Path, name: str, headers: dict[str, str], **env: str) -> ServerProcess:
    server = start_server(root / name, root / f"{name}.log", **env)
    try:
        ingest_corpus(server, headers)
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """Both servers start (and ingest the sample corpus through the API) side by side."""
    root = tmp_path_factory.mktemp("chat-ui")
    control = RewriteControl()
    with serve_in_thread(llm_app(0.03)) as llm, serve_in_thread(rewrite_app(control)) as rewriter:
        common = {"LLM_ENDPOINT": llm, "LLM_MODEL_ID": LLM_MODEL}
        with ThreadPoolExecutor(2) as pool:
            blend = pool.submit(
                start_with_corpus,
                root,
                "blend",
                {},
                MULTI_TURN_BLEND_ENABLED="true",
                MULTI_TURN_TRANSLATE_HISTORY="false",
                **common,
            )
            condense = pool.submit(
                start_with_corpus,
                root,
                "condense",
                {"Authorization": f"Bearer {API_KEY}"},
                MULTI_TURN_MODE="condense",
                CONDENSE_LLM_ENDPOINT=rewriter,
                CONDENSE_LLM_MODEL_ID="rewriter",
                CHATQNA_API_KEY=API_KEY,
                **common,
            )
            futures = [blend, condense]
        started = [f.result() for f in futures if f.exception() is None]
        if len(started) < len(futures):
            for server in started:
                server.stop()
            raise next(e for f in futures if (e := f.exception()) is not None)
        try:
            yield Servers(started[0], started[1], control)
        finally:
            for server in started:
                server.stop()


@pytest.fixture(scope="session")
def chromium() -> None:
    """Install Chromium and chromedriver from apt when missing (`scripts/browser`)."""
    result = subprocess.run(
        [str(REPO / "scripts" / "browser")], capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, f"scripts/browser failed:\n{result.stderr}"


@pytest.fixture
def browser(chromium: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[WebDriver]:
    """Chromium by its Debian path with a fresh profile; with both paths given Selenium
    Manager is never consulted, and SE_OFFLINE keeps it off the network if it were."""
    monkeypatch.setenv("SE_OFFLINE", "true")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="chromium-", dir=tmp_path)
    for flag in (
        "--headless=new",
        "--no-sandbox",  # the tests run as root
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1280,960",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


# --- page helpers -------------------------------------------------------------------------


def wait_for(driver: WebDriver, check: Callable[[WebDriver], Any], timeout: float = 30) -> Any:
    return WebDriverWait(driver, timeout, poll_frequency=0.03).until(check)


def open_page(driver: WebDriver, url: str) -> None:
    driver.get(url + "/")
    wait_for(driver, lambda d: d.execute_script("return document.documentElement.dataset.ready"))


def navigation_status(driver: WebDriver) -> int:
    """The HTTP status of the page the browser shows."""
    script = "return performance.getEntriesByType('navigation')[0].responseStatus"
    return int(driver.execute_script(script))


def turns(driver: WebDriver) -> list[WebElement]:
    return driver.find_elements(By.CSS_SELECTOR, "#messages .turn-assistant")


def state(turn: WebElement) -> str:
    return str(turn.get_attribute("data-state"))


def wait_settled(driver: WebDriver, count: int) -> WebElement:
    """The `count`-th assistant turn, once it is done or failed."""
    wait_for(
        driver,
        lambda d: len(turns(d)) == count and state(turns(d)[-1]) in ("done", "failed"),
    )
    return turns(driver)[-1]


def sources(turn: WebElement) -> list[str]:
    return [e.text for e in turn.find_elements(By.CSS_SELECTOR, ".source .source-name")]


def retrieval_summary(turn: WebElement) -> str:
    return str(turn.find_element(By.CSS_SELECTOR, ".retrieval summary").text)


def retrieval_details(turn: WebElement) -> dict[str, str]:
    """The expanded retrieval report as {label: value}."""
    turn.find_element(By.CSS_SELECTOR, ".retrieval summary").click()
    pairs = turn.find_elements(By.CSS_SELECTOR, ".retrieval-details > div")
    return {
        p.find_element(By.TAG_NAME, "dt").text: p.find_element(By.TAG_NAME, "dd").text
        for p in pairs
    }


def ask(driver: WebDriver, question: str, *, with_enter: bool = True) -> None:
    box = driver.find_element(By.ID, "question")
    box.send_keys(question)
    if with_enter:
        box.send_keys(Keys.ENTER)
    else:
        driver.find_element(By.ID, "send").click()


def screenshot(driver: WebDriver, name: str) -> None:
    if os.environ.get("CHATQNA_UI_SCREENSHOTS") == "1":
        driver.save_screenshot(str(SCREENSHOTS / f"ui-{name}.png"))


def no_horizontal_overflow(driver: WebDriver) -> bool:
    return bool(
        driver.execute_script(
            "const c = document.getElementById('conversation');"
            "return document.documentElement.scrollWidth <= window.innerWidth"
            " && c.scrollWidth <= c.clientWidth;"
        )
    )


# The metadata's `retrieval` for a follow-up the self-contained check searched alone.
SELF_CONTAINED_RETRIEVAL = {
    "multi_turn_mode": "blend",
    "raw_query": "How long is data kept after cancellation of a plan?",
    "history_messages": 2,
    "strategy": "stateless",
    "query": "How long is data kept after cancellation of a plan?",
    "blend": {
        "enabled": True,
        "executed": False,
        "reason": "self_contained",
        "alpha": 0.7,
        "history_turns": 2,
        "history_messages": 0,
        "history_order": "newest_first",
        "history_roles": "user_assistant",
        "question_similarity": 0.6213,
        "translation": {},
    },
    "bm25_history": {"ran": False, "weight": 0.3},
    "hybrid": True,
    "reranker": None,
    "rerank": {"ran": False, "reason": "embedded_default", "query_kind": None, "query": None},
    "k": 4,
    "top_n": 3,
}


# --- tests --------------------------------------------------------------------------------


def test_conversation_follow_up_upload_and_new_chat(
    servers: Servers, browser: WebDriver, tmp_path: Path
) -> None:
    open_page(browser, servers.blend.url)
    wait_for(browser, lambda d: d.find_element(By.ID, "model").text == f"Answers by {LLM_MODEL}")
    assert not browser.find_element(By.ID, "key-toggle").is_displayed()  # no key needed here
    box = browser.find_element(By.ID, "question")
    assert browser.switch_to.active_element != box
    box.click()

    # Turn 1, sent with Enter; the answer grows in place while the stream runs.
    ask(browser, FIRST)
    answer = wait_for(
        browser,
        lambda d: (
            (t := turns(d))
            and state(t[0]) == "streaming"
            and t[0].find_element(By.CSS_SELECTOR, ".answer").text
            and t[0]
        ),
    )
    partial = answer.find_element(By.CSS_SELECTOR, ".answer").text
    assert answer.find_element(By.CSS_SELECTOR, ".answer").get_attribute("aria-busy") == "true"
    first = wait_settled(browser, 1)
    text = first.find_element(By.CSS_SELECTOR, ".answer").text
    assert state(first) == "done" and len(text) > len(partial) and text.startswith(partial)
    assert "30 days" in text and "refunds.md" in text
    assert first.find_element(By.CSS_SELECTOR, ".answer").get_attribute("aria-live") == "polite"
    assert sources(first)[0] == "refunds.md"
    assert "Blend skipped" in retrieval_summary(first)
    assert "no earlier messages" in retrieval_summary(first)
    assert box.get_attribute("value") == ""

    # Turn 2: a pronoun-only follow-up, sent with the button; the blend ran on the history.
    ask(browser, FOLLOW_UP, with_enter=False)
    second = wait_settled(browser, 2)
    assert state(second) == "done"
    assert "refunds.md" in sources(second)
    summary = retrieval_summary(second)
    assert "Blend ran" in summary and "2 earlier messages" in summary and "α 0.7" in summary
    # Each source expands to its text and its per-stage scores.
    top = second.find_elements(By.CSS_SELECTOR, ".source details")[0]
    top.find_element(By.TAG_NAME, "summary").click()
    assert top.find_element(By.CSS_SELECTOR, ".source-text").is_displayed()
    stages = [e.text for e in top.find_elements(By.CSS_SELECTOR, ".score-list dt")]
    assert stages == ["dense", "bm25", "fusion"], "the embedded default does not rerank"
    details = retrieval_details(second)
    assert details["Blend"] == "ran" and details["Alpha (query weight)"] == "0.7"
    assert details["Messages blended"] == "2" and details["Mode"] == "blend"
    assert details["Reranker"] == "none (fused order kept)"
    similarity = float(details["Similarity to the previous question"])
    assert 0.0 <= similarity < 0.4, "a pronoun-only follow-up is blended"
    # A follow-up alike to the previous question is searched alone, and says why.
    alone = browser.execute_async_script(
        "const [retrieval, done] = arguments;"
        "import('/ui/render.js').then((m) => done(m.describeRetrieval(retrieval)));",
        SELF_CONTAINED_RETRIEVAL,
    )
    assert alone["badge"] == "Searched alone" and "previous question" in alone["summary"]
    assert ["Similarity to the previous question", "0.62"] in alone["rows"]
    user_turns = browser.find_elements(By.CSS_SELECTOR, "#messages .turn-user")
    browser.execute_script("arguments[0].scrollIntoView()", user_turns[1])
    screenshot(browser, "conversation")

    # Upload a file through the panel, then find it as a source.
    upload = tmp_path / UPLOAD_NAME
    upload.write_text(UPLOAD_TEXT)
    browser.find_element(By.ID, "upload-toggle").click()
    browser.find_element(By.ID, "upload-files").send_keys(str(upload))
    browser.find_element(By.CSS_SELECTOR, "#upload-form button[type=submit]").click()
    status = browser.find_element(By.ID, "upload-status")
    wait_for(browser, lambda d: status.get_attribute("data-state") in ("done", "failed"))
    assert status.text == f"Added {UPLOAD_NAME} (ingested, 1 chunk)."
    screenshot(browser, "upload")
    browser.find_element(By.ID, "upload-toggle").click()

    # New chat clears the conversation and its history.
    browser.find_element(By.ID, "new-chat").click()
    assert turns(browser) == []
    assert browser.find_element(By.ID, "empty").is_displayed()
    assert browser.switch_to.active_element == browser.find_element(By.ID, "question")
    ask(browser, "When are the moonflower beds watered?")
    fresh = wait_settled(browser, 1)
    assert sources(fresh)[0] == UPLOAD_NAME
    assert "4:45 every morning" in fresh.find_element(By.CSS_SELECTOR, ".answer").text
    assert "no earlier messages" in retrieval_summary(fresh)  # the old turns are gone

    # Phone size: one column, nothing wider than the screen, sources still readable.
    browser.set_window_size(390, 844)
    fresh.find_elements(By.CSS_SELECTOR, ".source summary")[0].click()
    wait_for(browser, lambda d: d.execute_script("return window.innerWidth") <= 390)
    assert no_horizontal_overflow(browser)
    assert browser.find_element(By.ID, "send").is_displayed()
    screenshot(browser, "phone")


def test_api_key_sign_in_and_condense_failure_retry(servers: Servers, browser: WebDriver) -> None:
    # Without the key even the page is refused, with a challenge that makes a browser ask.
    browser.get(servers.condense.url + "/")
    assert navigation_status(browser) == 401
    assert browser.find_elements(By.ID, "question") == []
    refused = httpx2.get(servers.condense.url + "/", timeout=10)
    assert refused.headers["www-authenticate"] == 'Basic realm="ChatQnA", charset="UTF-8"'

    # Signed in as through the browser's prompt (any user name, the key as the password): the
    # browser keeps the sign-in and sends it with the page's files and its API calls.
    signed_in = servers.condense.url.replace("http://", f"http://reader:{API_KEY}@")
    open_page(browser, signed_in)
    assert navigation_status(browser) == 200
    wait_for(browser, lambda d: d.find_element(By.ID, "model").text == f"Answers by {LLM_MODEL}")
    assert not browser.find_element(By.ID, "key-toggle").is_displayed()
    assert browser.execute_script("return sessionStorage.getItem('chatqna.apiKey')") is None

    ask(browser, FIRST)
    first = wait_settled(browser, 1)
    assert state(first) == "done" and sources(first)[0] == "refunds.md"
    assert "first question, nothing to rewrite" in retrieval_summary(first)

    # The rewrite fails: the turn is not answered, and the page says so with a Retry button.
    servers.rewrites.failing = True
    ask(browser, FOLLOW_UP)
    failed = wait_settled(browser, 2)
    assert state(failed) == "failed"
    problem = failed.find_element(By.CSS_SELECTOR, ".problem")
    assert problem.get_attribute("role") == "alert"
    assert "could not be rewritten" in problem.text
    assert "Reason: http_error" in problem.text
    assert failed.find_elements(By.CSS_SELECTOR, ".source") == []
    retry = failed.find_element(By.CSS_SELECTOR, "button.retry")
    assert browser.switch_to.active_element == retry  # Enter or Space retries from here
    screenshot(browser, "condense-retry")

    servers.rewrites.failing = False
    calls = servers.rewrites.calls
    retry.send_keys(Keys.ENTER)
    answered = wait_settled(browser, 2)
    assert state(answered) == "done" and servers.rewrites.calls == calls + 1
    assert FIRST in servers.rewrites.transcript  # the retry sent the whole conversation
    assert f"Searched for “{REWRITE}”" in retrieval_summary(answered)
    details = retrieval_details(answered)
    assert details["Condense"] == "ok" and details["Standalone query"] == REWRITE
    assert "refunds.md" in sources(answered)
    assert answered.find_elements(By.CSS_SELECTOR, ".problem *") == []

    # Stop ends a streaming answer and hands the composer back.
    ask(browser, "And for monthly plans?")
    wait_for(browser, lambda d: len(turns(d)) == 3 and state(turns(d)[-1]) == "streaming")
    browser.find_element(By.ID, "stop").click()
    wait_for(browser, lambda d: state(turns(d)[-1]) == "stopped")
    assert browser.find_element(By.ID, "send").is_displayed()
    assert not browser.find_element(By.ID, "stop").is_displayed()

    # The key panel is the fallback when a request is refused after all; here, a wrong key
    # saved in the tab, which is sent as Bearer in place of the browser's sign-in.
    browser.execute_script("sessionStorage.setItem('chatqna.apiKey', 'stale-key')")
    open_page(browser, servers.condense.url)
    key = wait_for(browser, lambda d: (e := d.find_element(By.ID, "api-key")).is_displayed() and e)
    assert browser.switch_to.active_element == key
    reason = browser.find_element(By.ID, "key-reason").text
    assert reason == "The key saved in this tab was not accepted."
    key.send_keys("wrong-key", Keys.ENTER)
    status = browser.find_element(By.ID, "key-status")
    wait_for(browser, lambda d: status.text == "That key was not accepted.")
    screenshot(browser, "api-key")
    key.clear()
    key.send_keys(API_KEY, Keys.ENTER)
    wait_for(browser, lambda d: not d.find_element(By.ID, "key-panel").is_displayed())
    stored = browser.execute_script("return sessionStorage.getItem('chatqna.apiKey')")
    assert stored == API_KEY
    ask(browser, FIRST)
    assert state(wait_settled(browser, 1)) == "done"


def test_under_a_path_prefix_the_page_works_without_its_trailing_slash(
    browser: WebDriver, tmp_path: Path
) -> None:
    """Behind a proxy that strips `/chat` and does not redirect `/chat` to `/chat/` (Traefik,
    Caddy), the page opened at `/chat` loads its files and calls the API under the prefix."""
    with serve_in_thread(llm_app(0.0)) as llm:
        server = start_server(
            tmp_path / "data",
            tmp_path / "prefix.log",
            CHATQNA_ROOT_PATH="/chat",
            LLM_ENDPOINT=llm,
            LLM_MODEL_ID=LLM_MODEL,
        )
        try:
            with serve_in_thread(stripping_proxy(server.url, "/chat")) as proxy:
                browser.get(proxy + "/chat")
                wait_for(
                    browser,
                    lambda d: d.execute_script("return document.documentElement.dataset.ready"),
                )
                assert browser.current_url == proxy + "/chat"  # no redirect added the slash
                model = browser.find_element(By.ID, "model")
                wait_for(browser, lambda d: model.text == f"Answers by {LLM_MODEL}")
                ask(browser, FIRST)
                assert state(wait_settled(browser, 1)) == "done"
                fetched = browser.execute_script(
                    "return performance.getEntriesByType('resource')"
                    ".map((e) => new URL(e.name).pathname)"
                )
        finally:
            server.stop()
    assert {"/chat/ui/app.js", "/chat/ui/chat.css", "/chat/v1/models"} <= set(fetched)
    assert "/chat/v1/chatqna" in fetched
    assert [path for path in fetched if not path.startswith("/chat/")] == []
