"""The chat page in a real headless Chromium (Selenium) against a real ``hetero serve``: a question typed
and sent, its answer streamed in, the conversation kept, the settings sent, errors shown, the stop button,
and the API key asked for. The mock executor's answers are checked against the API's own answer to the
same request; one test has the real SmolLM2 say what the capital of France is."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.chat_browser import ChatPage, browser_missing, chromium, hetero_serve

pytestmark = [
    pytest.mark.slow,  # starts hetero serve and a browser
    pytest.mark.skipif(browser_missing() is not None, reason=browser_missing() or ""),
]
MAX_TOKENS = 12
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome", "Madrid"]}},
    "required": ["city"],
    "additionalProperties": False,
}


def api_answer(base_url: str, messages: list[dict], api_key: str | None = None, **params) -> str:
    """What the API itself answers (not streamed) to the request the page should have sent."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    response = httpx.post(
        base_url + "/v1/chat/completions",
        json={"model": "mock", "messages": messages, **params},
        headers=headers,
        timeout=120,
    )
    response.raise_for_status()
    return response.json()["choices"][0]["message"]["content"]


def test_the_page_streams_answers_keeps_the_conversation_and_sends_its_settings():
    with hetero_serve("--executor", "mock", "--max-model-len", "4096") as base_url, chromium() as driver:
        page = ChatPage(driver, base_url).open()
        assert page.wait_for_model() == "mock"
        page.fill("system", "Be brief.")
        page.fill("temperature", "0")
        page.fill("max-tokens", str(MAX_TOKENS))
        params = {"temperature": 0, "max_tokens": MAX_TOKENS}
        first = page.ask("Hello there")
        system = {"role": "system", "content": "Be brief."}
        history = [system, {"role": "user", "content": "Hello there"}]
        assert first == api_answer(base_url, history, **params) and len(first) == MAX_TOKENS
        assert (
            page.text("metric-usage").endswith(f"/ {MAX_TOKENS}") and page.text("metric-finish") == "length"
        )
        assert float(page.text("metric-tps")) > 0
        page.wait_for(lambda: page.text("gauge-tokens") not in ("–", "0"), what="the server's token counter")

        second = page.ask("And then?")  # sent with the first exchange before it
        history += [{"role": "assistant", "content": first}, {"role": "user", "content": "And then?"}]
        assert second == api_answer(base_url, history, **params)

        page.fill("schema", '{"type": "object"')  # a mistake in the box: said on the page, nothing sent
        page.send("Which city?")
        page.wait_for(lambda: "JSON schema: not valid JSON" in page.error(), what="the schema error")
        page.fill("schema", json.dumps(CITY_SCHEMA))
        page.fill("max-tokens", "2000")
        assert json.loads(page.ask("Which city?"))["city"] in ("Paris", "Rome", "Madrid")

        page.element("clear").click()
        page.fill("schema", "")
        page.fill("max-tokens", "0")  # the server refuses it: its error.message is shown, the question kept
        page.send("Too short")
        page.wait_for(lambda: "max_tokens" in page.error(), what="the server's error message")
        assert page.element("prompt").get_property("value") == "Too short"
        assert page.last_answer() is None


def test_the_page_asks_for_the_api_key_sends_it_and_stops_an_answer():
    with (
        hetero_serve(
            "--executor",
            "mock",
            "--api-key",
            "sk-page",
            env={"HETERO_EXECUTOR__MOCK__DECODE_LATENCY_PER_STEP": "0.05"},
        ) as base_url,
        chromium() as driver,
    ):
        page = ChatPage(driver, base_url).open()
        page.enter_key("sk-wrong")
        page.wait_for(lambda: "wrong API key" in page.text("key-reason"), what="the refusal")
        page.enter_key("sk-page")
        assert page.wait_for_model() == "mock" and not page.element("key-form").is_displayed()
        page.fill("max-tokens", "4")
        assert page.ask("Hi") == api_answer(
            base_url, [{"role": "user", "content": "Hi"}], "sk-page", max_tokens=4, temperature=0.7
        )

        page.fill("max-tokens", "1000")  # 50 s of answer at 0.05 s a token: stopped after a few
        number = page.send("Tell me everything")
        page.wait_for_answer(number, "streaming", min_chars=3)
        page.element("stop").click()
        page.wait_for_answer(number, "stopped")
        # The server saw the client go and stopped generating (the page's gauges, from /metrics).
        page.wait_for(lambda: page.text("gauge-requests") == "0 / 0", timeout_s=30, what="the request to end")
        assert page.element("send").is_enabled() and not page.element("stop").is_enabled()
        assert page.error() == ""


def test_the_real_model_answers_a_question_in_the_page(smollm2_dir):
    with (
        hetero_serve(
            "--model", str(smollm2_dir), "--executor", "torch", "--served-model-name", "smollm2"
        ) as base_url,
        chromium() as driver,
    ):
        page = ChatPage(driver, base_url).open()
        assert page.wait_for_model() == "smollm2"
        page.fill("temperature", "0")
        page.fill("max-tokens", "40")
        answer = page.ask("What is the capital of France?")
        assert "Paris" in answer, answer
        completion_tokens = int(page.text("metric-usage").split("/")[1])
        assert 1 <= completion_tokens <= 40
