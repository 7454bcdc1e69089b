"""lm-eval's ``local-completions`` loglikelihood requests, replayed against ``hetero serve`` on the real
embedded SmolLM2 in fp32, score a small multiple-choice set as HF transformers does on the same checkpoint.

lm-eval itself is too heavy a test dependency for CI (it pulls datasets, evaluate, sqlitedict, ...), so this
file, CI's proof, replays its request shapes from its source (``lm_eval/models/openai_completions.py`` and
``api_models.py``; the real lm-eval runs in ``tests/bench/test_bench_lm_eval.py`` where it is installed):
each (context, continuation) pair is encoded as lm-eval's ``_encode_pair`` does (trailing spaces of the
context move to the continuation), the whole token list is sent as the prompt with ``echo=True,
logprobs=1, max_tokens=1, temperature=0, seed=1234``, and ``parse_logprobs`` sums
``token_logprobs[ctxlen:-1]`` and calls it greedy when each equals ``max(top_logprobs[i].values())``.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("openai")

from hetero_core.builder import build_engine  # noqa: E402
from hetero_core.plugin_system.discovery import load_plugins  # noqa: E402
from hetero_core.settings import load_settings  # noqa: E402
from tests.server.live_server import LiveServer  # noqa: E402

pytestmark = pytest.mark.slow
TOLERANCE = 1e-3  # fp32 both sides, summed over a continuation's tokens
QUESTIONS = [  # (context, choices, the right one)
    ("Question: What is the capital of France?\nAnswer:", [" Paris", " Berlin", " Madrid", " Rome"], 0),
    ("Question: How many legs does a spider have?\nAnswer:", [" six", " eight", " four"], 1),
    ("The opposite of hot is", [" cold", " warm", " loud"], 0),
    ("The largest ocean on Earth is the", [" Pacific Ocean", " Indian Ocean", " Southern Ocean of ice"], 0),
    ("Water freezes at zero degrees ", ["Celsius", "Fahrenheit"], 0),  # a trailing space, as lm-eval moves it
]


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return transformers.AutoTokenizer.from_pretrained(smollm2_dir)


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's ``TemplateLM._encode_pair``."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation, context = context[-n_spaces:] + continuation, context[:-n_spaces]
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    context_enc = tokenizer.encode(context, add_special_tokens=False)
    return context_enc, whole[len(context_enc) :]


@pytest.fixture(scope="module")
def requests(tokenizer):
    """lm-eval's loglikelihood requests: (whole token list, ctxlen), one per (question, choice)."""
    pairs = [
        encode_pair(tokenizer, context, choice) for context, choices, _ in QUESTIONS for choice in choices
    ]
    return [(context + continuation, len(context)) for context, continuation in pairs]


@pytest.fixture(scope="module")
def hf_scores(smollm2_dir, requests):
    """HF's (loglikelihood, is_greedy) per request, as lm-eval's ``hf`` model computes them."""
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    scores = []
    for tokens, ctxlen in requests:
        with torch.inference_mode():
            logprobs = torch.log_softmax(model(torch.tensor([tokens])).logits[0].float(), dim=-1)
        rows = logprobs[ctxlen - 1 : len(tokens) - 1]
        continuation = torch.tensor(tokens[ctxlen:])
        chosen = rows.gather(1, continuation[:, None])[:, 0]
        scores.append((chosen.sum().item(), bool((rows.argmax(dim=-1) == continuation).all())))
    return scores


@pytest.fixture(scope="module")
def server(smollm2_dir):
    settings = load_settings(model=str(smollm2_dir), executor="torch", dtype="float32", max_num_blocks=256)
    with LiveServer(build_engine(settings, load_plugins(entry_points=[])), model_name="smollm2") as live:
        yield live


def parse_logprobs(choice, ctxlen: int, generated: int) -> tuple[float, bool]:
    """lm-eval's ``LocalCompletionsAPI.parse_logprobs`` (``generated``: the answer's tokens, dropped)."""
    end = len(choice.logprobs.token_logprobs) - generated
    token_logprobs = choice.logprobs.token_logprobs[ctxlen:end]
    top_logprobs = choice.logprobs.top_logprobs[ctxlen:end]
    greedy = all(tok == max(top.values()) for tok, top in zip(token_logprobs, top_logprobs))
    return sum(token_logprobs), greedy


def accuracy(scores: list[tuple[float, bool]]) -> float:
    right, start = 0, 0
    for _, choices, answer in QUESTIONS:
        options = [loglikelihood for loglikelihood, _ in scores[start : start + len(choices)]]
        right += options.index(max(options)) == answer
        start += len(choices)
    return right / len(QUESTIONS)


@pytest.mark.parametrize("max_tokens", [1, 0])
def test_lm_eval_loglikelihoods_equal_hf(server, requests, hf_scores, max_tokens):
    client = server.client()
    scores = []
    for tokens, ctxlen in requests:  # lm-eval's batch_size 1: one token list per request
        answer = client.completions.create(
            model="smollm2",
            prompt=[tokens],
            temperature=0,
            max_tokens=max_tokens,
            logprobs=1,
            seed=1234,
            echo=True,
        )
        [choice] = answer.choices
        lp = choice.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(tokens) + max_tokens
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert answer.usage.completion_tokens == max_tokens
        scores.append(parse_logprobs(choice, ctxlen, max_tokens))
    for (got, got_greedy), (want, want_greedy) in zip(scores, hf_scores):
        assert math.isclose(got, want, abs_tol=TOLERANCE), (got, want)
        assert got_greedy == want_greedy
    assert accuracy(scores) == accuracy(hf_scores)


def test_batched_and_streamed_echo_agree_with_single_requests(server, requests, tokenizer):
    client = server.client()
    prompts = [tokens for tokens, _ in requests[:3]]
    batched = client.completions.create(
        model="smollm2", prompt=prompts, temperature=0, max_tokens=2, logprobs=2, echo=True
    )
    for choice, tokens in zip(sorted(batched.choices, key=lambda c: c.index), prompts):
        lp = choice.logprobs
        assert choice.text.startswith(tokenizer.decode(tokens))
        assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
        assert all(len(top) >= 2 for top in lp.top_logprobs[1:])  # the top 2 and the prompt token

    stream = client.completions.create(
        model="smollm2", prompt=prompts[0], temperature=0, max_tokens=2, logprobs=2, echo=True, stream=True
    )
    chunks = [c.choices[0] for c in stream if c.choices]
    assert "".join(c.text for c in chunks) == batched.choices[0].text
    streamed = [v for c in chunks if c.logprobs for v in c.logprobs.token_logprobs]
    whole = batched.choices[0].logprobs.token_logprobs
    assert len(streamed) == len(whole) and streamed[0] is None
    assert all(math.isclose(a, b, abs_tol=TOLERANCE) for a, b in zip(streamed[1:], whole[1:]))
    offsets = [o for c in chunks if c.logprobs for o in c.logprobs.text_offset]
    assert offsets == batched.choices[0].logprobs.text_offset


def test_a_batch_file_echo_line_scores_as_the_server(server, requests, smollm2_dir, tmp_path):
    import json

    from hetero_core.cli.main import main

    lines = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"prompt": [tokens], "temperature": 0, "max_tokens": 0, "logprobs": 1, "echo": True},
        }
        for i, (tokens, _) in enumerate(requests[:4])
    ]
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert (
        main(
            [
                "run",
                "--model",
                str(smollm2_dir),
                "--executor",
                "torch",
                "--dtype",
                "float32",
                "--input-file",
                str(source),
                "--output",
                str(out),
            ]
        )
        == 0
    )
    results = {r["custom_id"]: r["response"]["body"] for r in map(json.loads, out.read_text().splitlines())}
    client = server.client()
    for i, (tokens, ctxlen) in enumerate(requests[:4]):
        [choice] = results[f"r{i}"]["choices"]
        [served] = client.completions.create(
            model="smollm2", prompt=[tokens], temperature=0, max_tokens=0, logprobs=1, echo=True
        ).choices
        assert choice["text"] == served.text and choice["finish_reason"] == "length"
        assert choice["logprobs"]["tokens"] == served.logprobs.tokens
        assert choice["logprobs"]["token_logprobs"][0] is None
        got, want = choice["logprobs"]["token_logprobs"][ctxlen:], served.logprobs.token_logprobs[ctxlen:]
        assert math.isclose(sum(got), sum(want), abs_tol=TOLERANCE)
