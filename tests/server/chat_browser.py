"""A real ``hetero serve`` and a headless Chromium driven by Selenium, for the chat page's browser tests
(test_server_chat_page_browser.py) and its screenshot in the docs (scripts/page_screenshot.py).

Chromium and its driver are Debian's (``apt-get install chromium chromium-driver``; Playwright's own
browser download is unreachable here), pointed at explicitly so that Selenium Manager never goes
looking for a browser on the network. ``browser_missing()`` says what is not installed."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
CHROMEDRIVER_NAMES = ("chromedriver",)
# Headless, and nothing that reaches out to the network or needs a desktop.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)
SERVE_START_TIMEOUT_S = 300  # the real model loads (and on a first run converts) on 2 shared cores
ANSWER_TIMEOUT_S = 180


def _which(names) -> str | None:
    return next((path for path in map(shutil.which, names) if path), None)


def browser_missing() -> str | None:
    """Why the browser tests cannot run here (what to install), or None when they can."""
    missing = []
    if importlib.util.find_spec("selenium") is None:
        missing.append("selenium (pip install -r requirements.txt)")
    if _which(CHROMIUM_NAMES) is None:
        missing.append("chromium (apt-get install chromium)")
    if _which(CHROMEDRIVER_NAMES) is None:
        missing.append("chromedriver (apt-get install chromium-driver)")
    return "the headless browser tests need " + ", ".join(missing) if missing else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def hetero_serve(*args: str, env: dict[str, str] | None = None):
    """``hetero serve ARGS`` on a free loopback port, as a user starts it; yields its base URL once
    ``/health`` answers, and stops it with Ctrl-C (its output is in the error if it fails to start)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "hetero_core", "serve", "--port", str(port), "--log-level", "warning", *args],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVE_START_TIMEOUT_S
        while process.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(base_url + "/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        else:
            process.kill()
            raise RuntimeError(f"hetero serve did not start: {process.communicate()[0]}")
        yield base_url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()


@contextlib.contextmanager
def chromium(width: int = 1200, height: int = 820):
    """A headless Chromium under Selenium, with a fresh profile removed afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="hetero-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = _which(CHROMIUM_NAMES)
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(
            options=options, service=Service(executable_path=_which(CHROMEDRIVER_NAMES))
        )
        try:
            yield driver
        finally:
            driver.quit()


class ChatPage:
    """The chat page in ``driver``, as a user works it: the elements by their ids in server/page/."""

    def __init__(self, driver, base_url: str) -> None:
        self.driver, self.base_url = driver, base_url

    def open(self) -> ChatPage:
        self.driver.get(self.base_url + "/")
        return self

    def element(self, element_id: str):
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.ID, element_id)

    def text(self, element_id: str) -> str:
        return self.element(element_id).get_property("textContent")

    def wait_for(self, condition, timeout_s: float = 30, what: str = "the page"):
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, timeout_s).until(
            lambda _: condition(), message=f"waiting for {what}"
        )

    def wait_for_model(self) -> str:
        self.wait_for(lambda: self.text("model") not in ("", "…"), what="the model name")
        return self.text("model")

    def fill(self, element_id: str, value: str) -> None:
        field = self.element(element_id)
        field.clear()
        field.send_keys(value)

    def enter_key(self, key: str) -> None:
        self.wait_for(lambda: self.element("key-form").is_displayed(), what="the API key form")
        self.fill("api-key", key)
        self.element("key-submit").click()

    def send(self, question: str) -> int:
        """Type ``question`` and press Send; the number its answer will have (see ``wait_for_answer``)."""
        self.wait_for(lambda: self.element("send").is_enabled(), what="the send button")
        number = len(self.answers())
        self.fill("prompt", question)
        self.element("send").click()
        return number

    def answers(self) -> list:
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, "#log .message.assistant")

    def last_answer(self):
        answers = self.answers()
        return answers[-1] if answers else None

    def ask(self, question: str, timeout_s: float = ANSWER_TIMEOUT_S) -> str:
        """Send ``question`` and wait until its answer has streamed in; the answer's text."""
        self.wait_for_answer(self.send(question), "done", timeout_s=timeout_s)
        return self.last_answer().get_property("textContent")

    def wait_for_answer(
        self, number: int, state: str, min_chars: int = 0, timeout_s: float = ANSWER_TIMEOUT_S
    ):
        """Wait until answer ``number`` (counted from 0) is in ``state`` (streaming, done, stopped) with
        at least ``min_chars`` of text; an error on the page fails at once, with its message."""

        def reached() -> bool:
            answers = self.answers()
            return len(answers) > number and (
                answers[number].get_attribute("data-state") == state
                and len(answers[number].get_property("textContent")) >= min_chars
            )

        self.wait_for(
            lambda: self.error() or reached(), timeout_s=timeout_s, what=f"answer {number}: {state}"
        )
        if self.error():
            raise AssertionError(f"the page shows an error: {self.error()}")

    def error(self) -> str:
        element = self.element("error")
        return element.get_property("textContent") if element.is_displayed() else ""
