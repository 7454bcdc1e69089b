"""The OpenAI-compatible HTTP server (``hetero serve``); needs the ``hetero-core[server]`` extra."""

SERVER_EXTRA_HINT = (
    "the server needs FastAPI, uvicorn, prometheus-client and httpx: pip install 'hetero-core[server]'"
)
