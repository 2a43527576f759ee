"""The chat page `llogos serve` answers at /: its files over plain HTTP (ETag and 304, the
Content-Security-Policy, the favicon, --no-webui), GET /props and the stream's timings it reads, and
the page itself in headless Chromium driven by Playwright against real servers: streaming, stop,
regenerate, edit, conversations kept across a reload, settings sent only when changed, the API key.
Every page checks that it logged no console error and asked no other origin for anything."""

import json
import os
import re
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import lazy_import, need
from tests.test_server import KEY, TINY, WAIT_S, Server, wait_until

lazy_import("fastapi")

CHROMIUM = Path("/usr/bin/chromium")   # Debian's package; `make test` installs it where it can
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
# Where the README's screenshots are written when set (make screenshots-free runs leave docs/ alone).
SCREENSHOTS = os.environ.get("LLOGOS_WEBUI_SCREENSHOTS")
# smol's replies to requests without max_tokens (the page sends none unless set): enough to stop a
# count part way, where a poem that ran to the end of the context took most of this file's time.
N_PREDICT = 128


@pytest.fixture(scope="module")
def env():
    """The user's own cache, compiled kernels included: these tests are about the page, and a first
    run's compile can take longer than a server is given to start on a busy machine."""
    e = dict(os.environ, NO_COLOR="1")
    e.pop("COLUMNS", None)
    return e


@pytest.fixture(scope="module")
def smol(env, tmp_path_factory):
    server = Server(env, tmp_path_factory.mktemp("smol") / "log", "-m", "smollm2-135m", "-np", "2", "-c", "512",
                    "--temp", "0", "-n", str(N_PREDICT), "--context-shift")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def keyed(env, tmp_path_factory):  
    need(TINY)
    server = Server(dict(env, LLOGOS_API_KEY="sesame"), tmp_path_factory.mktemp("keyed") / "log", "-m", str(TINY),
                    "-np", "1", "-c", "256", "--chat-template", "chatml")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class Page:
    """A fresh browser context on a server's page, recording console errors, the requests made, and
    the chat completion bodies sent."""

    def __init__(self, browser, server, viewport=DESKTOP, expected_errors=()):
        self.server, self.expected_errors = server, expected_errors
        self.context = browser.new_context(viewport=viewport, accept_downloads=True)
        self.page = self.context.new_page()
        self.errors, self.urls, self.sent = [], [], []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", self._request)
        self.page.set_default_timeout(WAIT_S * 1000)   # a reply's longest wait
        self.page.goto(server.url + "/")

    def _request(self, request):
        self.urls.append(request.url)
        if request.url.endswith("/v1/chat/completions"):
            self.sent.append(json.loads(request.post_data))

    def send(self, text: str):
        self.page.fill("#input", text)
        self.page.press("#input", "Enter")

    def wait_idle(self):
        self.page.wait_for_selector("#send:not([hidden])")

    def replies(self) -> list[str]:
        return self.page.locator(".message.assistant .body").all_inner_texts()

    def close(self):
        origin = urlsplit(self.server.url)[:2]
        elsewhere = [u for u in self.urls if urlsplit(u)[:2] != origin and not u.startswith(("blob:", "data:"))]
        errors = [e for e in self.errors if not any(x in e for x in self.expected_errors)]
        self.context.close()
        assert not elsewhere, elsewhere
        assert not errors, errors


@pytest.fixture
def page(browser, smol):
    p = Page(browser, smol)
    p.page.wait_for_selector("#model-name:text('smollm2-135m')")
    yield p
    p.close()


# ------------------------------------------------------------------------------------- plain HTTP

def test_page_files_carry_etag_cache_and_csp_headers(smol):
    index = httpx.get(smol.url + "/")
    assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
    csp = index.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "connect-src 'self'" in csp and "script-src 'self'" in csp
    assert "http" not in csp and "*" not in csp and "unsafe" not in csp   # no other origin, nothing inline
    assert index.headers["cache-control"] == "no-cache"
    again = httpx.get(smol.url + "/", headers={"If-None-Match": index.headers["etag"]})
    assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == index.headers["etag"]
    assert httpx.get(smol.url + "/", headers={"If-None-Match": '"stale"'}).status_code == 200

    linked = re.findall(r'(?:src|href)="([^"]+)"', index.text)
    scripts = set(re.findall(r"from '\./([\w.]+)'", httpx.get(smol.url + "/app.js").text))
    assert {"style.css", "app.js", "favicon.svg"} <= set(linked) and scripts
    for name in set(linked) | scripts:
        r = httpx.get(f"{smol.url}/{name}")
        assert r.status_code == 200 and r.headers["etag"] and r.headers["content-security-policy"] == csp, name
        assert len(r.content) < 20_000, name   # small files, no bundle
    assert httpx.get(smol.url + "/app.js").headers["content-type"].startswith("text/javascript")
    icon = httpx.get(smol.url + "/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
    assert httpx.get(smol.url + "/nothing.js").status_code == 404


def test_no_webui_answers_404_and_the_api_still_works(env, tmp_path):  
    need(TINY)
    server = Server(env, tmp_path / "log", "-m", str(TINY), "-np", "1", "-c", "128", "--no-webui")
    try:
        for path in ("/", "/app.js", "/favicon.ico"):
            r = httpx.get(server.url + path)
            assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", path
        assert httpx.get(server.url + "/props").json()["default_generation_settings"]["n_ctx"] == 128
    finally:
        server.stop()


def test_props_report_what_serve_was_started_with(smol, keyed):
    props = httpx.get(smol.url + "/props").json()
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == 512 and props["total_slots"] == 2
    assert settings["params"]["temperature"] == 0.0 and settings["params"]["n_predict"] == N_PREDICT
    assert settings["params"]["seed"] == -1   # none given: a fresh one per request
    assert props["model_path"].endswith(".gguf") and "<|im_start|>" in props["chat_template"]
    assert httpx.get(keyed.url + "/props").status_code == 401
    keyed_settings = httpx.get(keyed.url + "/props", headers=KEY).json()["default_generation_settings"]
    assert keyed_settings["n_ctx"] == 256 and keyed_settings["params"]["n_predict"] == -1   # no -n: no limit
    assert httpx.get(keyed.url + "/").status_code == 200   # the page itself needs no key: it asks for one


def test_a_streams_last_chunk_carries_llama_servers_timings(smol):
    with httpx.stream("POST", smol.url + "/v1/chat/completions", timeout=60, content=json.dumps(
            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True})) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    timed = [c for c in chunks if "timings" in c]
    assert len(timed) == 1 and timed[0]["choices"][0]["finish_reason"] == "length"
    t = timed[0]["timings"]
    assert t["predicted_n"] == 4 and t["prompt_n"] + t["cache_n"] > 0 and t["predicted_per_second"] > 0
    assert all(type(t[k]) is int for k in ("prompt_n", "predicted_n", "cache_n"))   # counts, as llama-server's


# ---------------------------------------------------------------------------------------- the page

def test_reply_streams_in_pieces_and_the_conversation_survives_a_reload(page):
    """The first reply cannot end before the page has shown three different texts of it (it runs
    until stopped), so the polling's pace does not matter; its regeneration ends by itself and
    shows its speeds."""
    assert "512" in page.page.inner_text("#model-ctx")
    requests = []

    def first_endless(route):
        requests.append(route.request)
        if len(requests) == 1:
            body = json.loads(route.request.post_data) | {"max_tokens": 1_000_000, "ignore_eos": True}
            route.continue_(post_data=json.dumps(body))
        else:
            route.continue_()
    page.page.route("**/v1/chat/completions", first_endless)
    page.send("Write a short poem about the sea.")
    seen = set()   # polled only until it has grown: each poll is two round trips to the browser

    def grown() -> bool:
        seen.add(page.page.inner_text(".message.assistant .body"))
        return len({s for s in seen if s.strip()}) >= 3   # it grew in several steps
    wait_until(grown)
    page.page.click("#stop")
    page.wait_idle()
    page.page.click("text=Regenerate")
    page.page.wait_for_selector(".message.assistant .meta:has-text('Generation:')")   # the stopped one has no speeds
    page.wait_idle()
    reply = page.replies()[0]
    assert reply and len(page.replies()) == 1 and len(requests) == 2
    assert re.search(r"Prompt: \d+ tokens?, [\d.]+ t/s.*Generation: \d+ tokens?, [\d.]+ t/s",
                     page.page.inner_text(".message.assistant .meta"))
    body = page.sent[0]
    assert body["stream"] is True and body["messages"] == [{"role": "user", "content": "Write a short poem about the sea."}]
    assert not {"temperature", "top_k", "top_p", "min_p", "max_tokens", "seed"} & body.keys()   # nothing changed

    page.page.reload()
    page.page.wait_for_selector(".message.assistant")
    assert page.replies() == [reply]
    assert page.page.inner_text("#conversations li.current .title") == "Write a short poem about the sea."


def stored_reply(page: Page) -> str:
    """The page's one conversation's last reply as the page stored it: the text the server sent. Its
    rendering is not compared, as a count cut after "9" renders differently from one cut after "10"."""
    [conversation] = json.loads(page.page.evaluate("localStorage.getItem('llogos.conversations')"))
    return conversation["messages"][-1]["content"]


def test_stop_frees_the_slot_then_regenerate_and_edit_resend(page, smol):
    """The counts cannot end before the test stops them (no end of text, no limit, the context
    shifted), each is stopped past 40 characters shown (20 or more sent, whatever the rendering adds)
    and compared as sent, and the engine's slot gauge says when the cancel has been taken: nothing
    here waits on how fast the machine is."""
    def endless(route):
        body = json.loads(route.request.post_data)
        if body["messages"][-1]["content"].startswith("Count"):
            body |= {"max_tokens": 1_000_000, "ignore_eos": True}
        route.continue_(post_data=json.dumps(body))
    page.page.route("**/v1/chat/completions", endless)
    cancelled, generated = 'llogos_requests_total{outcome="cancelled"}', "llogos_generated_tokens_total"
    before = smol.metrics()[cancelled]
    page.send("Count from 1 to 1000, one number per line.")
    wait_until(lambda: len(page.replies()[0]) > 40)   # polled here: the page's CSP forbids Playwright's eval
    page.page.click("#stop")
    page.wait_idle()
    assert "Stopped." in page.page.inner_text(".message.assistant .meta")
    stopped = stored_reply(page)
    wait_until(lambda: smol.metrics()[cancelled] > before)
    at_cancel = smol.metrics()[generated]
    # The step in flight when the cancel came may still emit its token; after it, nothing runs on.
    wait_until(lambda: smol.metrics()["llogos_slots_busy"] == 0)
    after = smol.metrics()[generated]
    time.sleep(1.5)
    assert smol.metrics()[generated] == after <= at_cancel + 1

    page.page.click("text=Regenerate")
    wait_until(lambda: page.page.is_visible("#stop") and len(page.replies()[0]) > 40)
    page.page.click("#stop")   # greedy: the same count again; no need to wait for 1000
    page.wait_idle()
    assert len(page.replies()) == 1 and stored_reply(page)[:20] == stopped[:20]
    assert page.sent[1]["messages"] == page.sent[0]["messages"]

    page.page.click("text=Edit")
    page.page.fill("textarea.edit", "Say hello.")
    page.page.press("textarea.edit", "Enter")
    page.wait_idle()
    assert page.sent[2]["messages"] == [{"role": "user", "content": "Say hello."}]
    assert page.page.locator(".message.user").all_inner_texts() == ["Say hello."] and len(page.replies()) == 1


def test_settings_start_from_the_servers_defaults_and_only_changes_are_sent(page):
    page.page.click("#open-settings")
    assert page.page.input_value("#setting-temperature") == "0"   # serve's --temp 0, not the page's own
    assert page.page.input_value("#setting-top_k") == "40"
    page.page.fill("#setting-temperature", "0.7")
    page.page.fill("#setting-max_tokens", "3")
    page.page.fill("#setting-system", "You are terse.")
    page.page.click("#save-settings")
    page.send("Hi")
    page.wait_idle()
    body = page.sent[0]
    assert body["temperature"] == 0.7 and body["max_tokens"] == 3
    assert body["messages"][0] == {"role": "system", "content": "You are terse."}
    assert not {"top_k", "top_p", "min_p", "seed"} & body.keys()
    assert "Cut at the token limit." in page.page.inner_text(".message.assistant .meta")

    page.page.reload()
    page.page.click("#open-settings")
    assert page.page.input_value("#setting-temperature") == "0.7"   # kept in the browser
    page.page.click("#reset-settings")
    page.page.click("#save-settings")
    assert page.page.evaluate("localStorage.getItem('llogos.settings')") == "{}"


def test_a_conversation_near_the_context_is_warned_about(page):
    page.page.click("#open-settings")
    page.page.fill("#setting-max_tokens", "2")
    page.page.click("#save-settings")
    assert page.page.is_hidden("#status")
    page.send("apple " * 430)
    page.wait_idle()
    assert re.search(r"fills \d+ of the context's 512 tokens", page.page.inner_text("#status"))


def test_sidebar_renames_deletes_exports_and_starts_new_chats(page):
    stored = [{"id": f"c{i}", "title": f"Chat {i}", "created": i, "updated": i,
               "messages": [{"role": "user", "content": f"question {i}"},
                            {"role": "assistant", "content": f"answer {i}", "reasoning": ""}]} for i in (1, 2)]
    page.page.evaluate("c => localStorage.setItem('llogos.conversations', JSON.stringify(c))", stored)
    page.page.reload()
    titles = page.page.locator("#conversations .title")
    assert titles.all_inner_texts() == ["Chat 2", "Chat 1"]
    assert page.replies() == ["answer 2"]   # the latest opens

    page.page.click("#conversations li:nth-child(2) .title")
    assert page.replies() == ["answer 1"]
    page.page.click("#conversations li:nth-child(2) [aria-label=Rename]")
    page.page.fill("#conversations .rename", "Renamed")
    page.page.press("#conversations .rename", "Enter")
    assert "Renamed" in titles.all_inner_texts()

    with page.page.expect_download() as download:
        page.page.click("#export")
    exported = json.loads(Path(download.value.path()).read_text())
    assert sorted(c["title"] for c in exported) == ["Chat 2", "Renamed"]
    assert {c["id"]: c["messages"] for c in exported} == {c["id"]: c["messages"] for c in stored}

    delete = "#conversations li:has-text('Chat 2') [aria-label=Delete]"
    page.page.click(delete)
    page.page.click(delete)   # the second click confirms
    assert titles.all_inner_texts() == ["Renamed"]
    page.page.click("#new-chat")
    assert page.replies() == [] and page.page.is_visible("#empty")


def test_markdown_code_blocks_copy_and_math_stays_text(browser, smol):
    p = Page(browser, smol)
    p.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=smol.url)
    text = ("# Title\n\nSome *em*, **strong**, `x = 1`, a [link](https://example.com) and "
            "[bad](javascript:alert(1)).\n\n- one\n- two\n\n1. first\n2. second\n\n"
            "Math: $a_b * c_d$ and $$\\sum_i x_i$$\n\n```python\nprint('<b>hi</b>')\n```\n")
    p.page.evaluate("""async text => {
        const { render } = await import(new URL('markdown.js', document.baseURI).href);
        const box = document.createElement('div');
        box.id = 'sample';
        box.className = 'message assistant';
        box.append(render(text));
        document.body.append(box);
    }""", text)
    sample = p.page.locator("#sample")
    assert sample.locator("h1").inner_text() == "Title"
    assert sample.locator("em").first.inner_text() == "em" and sample.locator("strong").inner_text() == "strong"
    assert sample.locator("p code").inner_text() == "x = 1"
    link = sample.locator("a")
    assert link.count() == 1 and link.get_attribute("rel") == "noopener noreferrer"
    assert sample.locator("ul li").all_inner_texts() == ["one", "two"]
    assert sample.locator("ol li").all_inner_texts() == ["first", "second"]
    assert sample.locator(".math").all_inner_texts() == ["$a_b * c_d$", "$$\\sum_i x_i$$"]
    assert sample.locator("pre code").inner_text() == "print('<b>hi</b>')" and sample.locator("pre b").count() == 0
    sample.locator(".copy").click()
    assert p.page.evaluate("navigator.clipboard.readText()") == "print('<b>hi</b>')"
    p.close()


def test_reasoning_is_folded_under_the_answer(browser, smol):
    p = Page(browser, smol)
    chunks = [{"choices": [{"index": 0, "delta": {"reasoning_content": "Think of the sea."}}]},
              {"choices": [{"index": 0, "delta": {"content": "Waves."}, "finish_reason": "stop"}],
               "timings": {"prompt_n": 5, "prompt_per_second": 50.0, "predicted_n": 2, "predicted_per_second": 9.5,
                           "cache_n": 0}}]
    sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    p.page.route("**/v1/chat/completions",
                 lambda route: route.fulfill(status=200, content_type="text/event-stream", body=sse))
    p.send("Sea?")
    p.wait_idle()
    answer = p.page.locator(".message.assistant")
    assert answer.locator(".body").inner_text() == "Waves."
    fold = answer.locator("details.reasoning")
    assert fold.get_attribute("open") is None and not p.page.is_visible(".reasoning-body")
    assert answer.locator("> *").all() and answer.evaluate(
        "node => node.querySelector('.body').compareDocumentPosition(node.querySelector('details')) & 4")
    fold.locator("summary").click()
    assert p.page.inner_text(".reasoning-body") == "Think of the sea."
    assert "Prompt: 5 tokens, 50.0 t/s · Generation: 2 tokens, 9.5 t/s" in answer.locator(".meta").inner_text()
    p.close()


def test_api_key_is_asked_once_and_kept(browser, keyed):
    p = Page(browser, keyed, expected_errors=("401",))   # the first, keyless requests: how the page learns
    p.page.wait_for_selector("#key-dialog[open]")
    p.page.fill("#key-input", "sesame")
    p.page.press("#key-input", "Enter")
    p.page.wait_for_selector(f"#model-name:text('{TINY.name}')")
    assert "256" in p.page.inner_text("#model-ctx")
    p.page.reload()
    p.page.wait_for_selector(f"#model-name:text('{TINY.name}')")
    assert not p.page.is_visible("#key-dialog")
    p.close()


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_page_fits_desktop_and_phone_widths(browser, smol, viewport, tmp_path):
    p = Page(browser, smol, viewport)
    p.page.evaluate("localStorage.setItem('llogos.settings', JSON.stringify({max_tokens: 90}))")   # a reply's time
    p.page.reload()
    p.page.wait_for_selector("#model-name:text('smollm2-135m')")
    p.send("Write a Python function that adds two numbers.")
    p.wait_idle()
    width = p.page.evaluate("document.documentElement.scrollWidth")
    assert width <= viewport["width"]   # nothing wider than the window: no sideways scrolling
    assert p.page.is_visible("#input") and p.page.is_visible("#send")
    sidebar = p.page.locator("#sidebar")
    assert (sidebar.bounding_box()["x"] >= 0) == (viewport is DESKTOP)   # a phone's is slid out of sight
    if viewport is PHONE:
        p.page.click("#menu")
        p.page.wait_for_timeout(300)
        assert sidebar.bounding_box()["x"] >= 0
        p.page.click("#scrim", position={"x": viewport["width"] - 10, "y": 400})
        p.page.wait_for_timeout(300)
    name = "webui-desktop.png" if viewport is DESKTOP else "webui-phone.png"
    shot = Path(SCREENSHOTS or tmp_path) / name
    p.page.screenshot(path=str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    p.close()
