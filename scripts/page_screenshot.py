"""The chat page's screenshot in docs/server.md (docs/figures/chat-page.png): a real ``hetero serve`` on
the embedded SmolLM2, the page in headless Chromium asked "What is the capital of France?", the window
saved once the answer has streamed in. Needs what the browser tests need (tests/server/chat_browser.py:
chromium, chromium-driver, selenium).

    .venv/bin/python scripts/page_screenshot.py [--out docs/figures/chat-page.png]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the browser helpers live with the tests that use them

from tests.server.chat_browser import ChatPage, browser_missing, chromium, hetero_serve  # noqa: E402

QUESTION = "What is the capital of France?"
SYSTEM_PROMPT = "You are a helpful assistant."


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "docs" / "figures" / "chat-page.png")
    parser.add_argument("--width", type=int, default=1100)
    parser.add_argument("--height", type=int, default=720)
    args = parser.parse_args()
    if missing := browser_missing():
        print(f"page_screenshot: {missing}", file=sys.stderr)
        return 2
    with hetero_serve("--temperature", "0") as base_url, chromium(args.width, args.height) as driver:
        # The page's viewport exactly this size (a window's size counts what Chromium draws around it).
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": args.width, "height": args.height, "deviceScaleFactor": 1, "mobile": False},
        )
        page = ChatPage(driver, base_url).open()
        page.wait_for_model()
        page.fill("system", SYSTEM_PROMPT)
        page.fill("temperature", "0")
        page.fill("max-tokens", "64")
        answer = page.ask(QUESTION)
        page.wait_for(lambda: page.text("gauge-tokens") not in ("–", "0"), what="the server's gauges")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(args.out))
    print(f"{args.out}: {args.out.stat().st_size} bytes; the answer: {answer!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
