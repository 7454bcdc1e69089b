"""Batch invariance of the CPU executor with the compiled kernels: a sequence's logits at a position are
the same bits however its prompt is chunked, whatever shares its steps, and after a preemption that
recomputes it, in fp32 and in bf16, with every build of the kernels (this CPU's and the narrow ones).

The runs compared compute every row with the same kernels in the same order (that is the design:
attention_math.h, the linears' fixed-order chains), so ``torch.equal`` is the right test here; in bf16
on main, a one-token prefill chunk (decode attention) and a longer one (prefill attention) rounded
differently and greedy outputs changed with ``max_prefill_chunk``.
"""

from __future__ import annotations

import functools

import pytest
import torch

from hetero_core.default_plugins.torch_options import TorchExecutorOptions
from tests.model.kernel_builds import kernels_for
from tests.model.paged_batches import BlockPool, PagedSequence, step
from tests.model.tiny_models import VOCAB

BLOCK_SIZE = 4  # small blocks: chunks and contexts cross many block boundaries
PROMPT, TOTAL = 23, 31  # prompt tokens, then teacher-forced decodes up to TOTAL tokens


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(
    params=["native", "haswell", "skylake-avx512", "x86-64", "amx-emulated"]
)  # + AVX2; AVX-512 without
# BF16; SSE, no FMA; the AMX variant's bf16 linear on emulated tiles
def build_kernels(request, tmp_path_factory, monkeypatch):
    """The executor's kernels: this CPU's build, or one for a narrower ISA."""
    from hetero_core.model.cpu import kernels as cpu_kernels_module

    kernels = kernels_for(request.param, tmp_path_factory.getbasetemp() / "kernel_builds")
    monkeypatch.setattr(cpu_kernels_module, "load_cpu_kernels", lambda required=False, **_: kernels)
    return kernels


def _executor(make_executor, model_dir, dtype: str):
    # amx_linears off: the build under test runs, never the AMX variant an AMX machine would pick
    options = TorchExecutorOptions(
        dtype=dtype,
        cpu_kernels="compiled",
        prepared_weights_cache=False,
        amx_linears=False,
    )
    return make_executor(model_dir, num_blocks=128, block_size=BLOCK_SIZE, options=options)


class _Run:
    """One executor and block pool; ``logits[seq_id][position]`` of every row it sampled."""

    def __init__(self, executor):
        self.executor, self.pool, self.logits = executor, BlockPool(128, shuffle=True, seed=1), {}

    def step(self, work: list[tuple[PagedSequence, int]]) -> None:
        sampled = [seq for seq, n in work if seq.num_computed + n >= seq.num_prompt_tokens]
        positions = [
            seq.num_computed + n - 1 for seq, n in work if seq.num_computed + n >= seq.num_prompt_tokens
        ]
        out = self.executor.execute(step(work, self.pool, BLOCK_SIZE)).logits
        assert out.shape == (len(sampled), VOCAB)
        for row, (seq, position) in enumerate(zip(sampled, positions, strict=True)):
            self.logits.setdefault(seq.seq_id, {})[position] = out[row].clone()


def _prefill_then_decode(run: _Run, seq: PagedSequence, chunk: int, mates: list[PagedSequence] = ()) -> None:
    """``seq``'s prompt in chunks of ``chunk`` tokens, then one token per step to TOTAL; ``mates``
    advance beside it in every step (a prefill chunk of 3, then decodes)."""
    while seq.num_computed < len(seq.token_ids):
        left = seq.num_prompt_tokens - seq.num_computed
        work = [(seq, min(chunk, left) if left > 0 else 1)]
        for mate in mates:
            if mate.num_computed < len(mate.token_ids):
                mate_left = mate.num_prompt_tokens - mate.num_computed
                work.insert(mate.seq_id % 2, (mate, min(3, mate_left) if mate_left > 0 else 1))
        run.step(work)


def _assert_same(first: dict, second: dict) -> None:
    assert sorted(first) == sorted(second)
    for position in first:
        assert torch.equal(first[position], second[position]), f"position {position}"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "name",
    [
        "llama_wide_heads",
        "llama",
        "qwen2_wide_heads",
        "llama_q4_1",
        "llama_q4_1:int8",  # block codes with int8 activations (code_activations = "int8")
        "qwen3",
        "llama_mqa_tied",
        "llama3_rope",
    ],
)
def test_logits_do_not_depend_on_chunking_batch_mates_or_preemption(
    build_kernels, tiny_model_dirs, make_executor, dtype, name
):
    name, _, activations = name.partition(":")
    model_dir, _ = tiny_model_dirs[name]
    make_executor = functools.partial(_with_activations, make_executor, activations or "float")
    token_ids = _tokens(TOTAL, seed=3)
    reference = _Run(_executor(make_executor, model_dir, dtype))
    _prefill_then_decode(reference, PagedSequence(1, token_ids, PROMPT), chunk=PROMPT)
    expected = reference.logits[1]
    assert sorted(expected) == list(range(PROMPT - 1, TOTAL))

    for chunk in (1, 2, 5, 16):  # one-token chunks run decode attention, longer ones prefill attention
        run = _Run(_executor(make_executor, model_dir, dtype))
        _prefill_then_decode(run, PagedSequence(1, token_ids, PROMPT), chunk=chunk)
        _assert_same(run.logits[1], expected)

    run = _Run(_executor(make_executor, model_dir, dtype))  # batch-mates: prefilling and decoding beside it
    mates = [PagedSequence(2, _tokens(40, seed=4), 9), PagedSequence(3, _tokens(12, seed=5), 2)]
    _prefill_then_decode(run, PagedSequence(1, token_ids, PROMPT), chunk=7, mates=mates)
    _assert_same(run.logits[1], expected)

    run = _Run(
        _executor(make_executor, model_dir, dtype)
    )  # preempted after 3 decodes, recomputed in new blocks
    seq = PagedSequence(1, token_ids, PROMPT)
    run.step([(seq, PROMPT)])
    for _ in range(3):
        run.step([(seq, 1)])
    seq.num_computed, seq.block_table, seq.num_prompt_tokens = 0, [], PROMPT + 3
    _prefill_then_decode(run, seq, chunk=6)
    _assert_same(run.logits[1], expected)


def _with_activations(make_executor, code_activations: str, model_dir, **kwargs):
    """``make_executor`` whose options take ``code_activations`` (the test's executors pass options)."""
    options = kwargs.pop("options")
    return make_executor(
        model_dir, options=options.model_copy(update={"code_activations": code_activations}), **kwargs
    )


def _with_threads(threads: int, call):
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return call()
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_kernel_gives_a_row_the_same_bits_alone_batched_and_on_any_threads(build_kernels, dtype):
    """The linears (every row count takes a different pass configuration), the element-wise kernels and
    decode attention against prefill attention: each row alone, in batches of 2-70 rows, on 1-3 threads."""
    from hetero_core.model.cpu.kernel_attention import PrefillSequences
    from tests.model.kernel_weights import q4_1_weight

    kernels = build_kernels
    torch.manual_seed(0)
    x = torch.randn(70, 96).to(dtype)
    linears = [(kernels.bf16_linear, kernels.pack_bf16_linear(torch.randn(96, 96).bfloat16()), {})]
    if dtype == torch.float32:
        linears = [
            (kernels.f32_linear, kernels.pack_f32_linear(torch.randn(96, 96)), {}),
            (kernels.coded_linear, kernels.pack_coded_linear(q4_1_weight(96, 96)), {}),
        ]
    # int8 activations over block codes, from fp32 or bf16 rows (q8a_coded_linear)
    linears.append((kernels.q8a_coded_linear, kernels.pack_coded_linear(q4_1_weight(96, 96)), {}))
    for linear, packed, _ in list(linears):
        linears.append((linear, packed, {"swiglu": True}))
    for linear, packed, swiglu in linears:
        whole = linear(x, packed, None, **swiglu)
        for rows in (slice(0, 1), slice(5, 7), slice(3, 16), slice(1, 70)):
            for threads in (1, 2, 3):
                assert torch.equal(
                    _with_threads(threads, lambda: linear(x[rows], packed, None, **swiglu)), whole[rows]
                )
    weight = torch.rand(96).to(dtype)
    assert torch.equal(kernels.rms_norm(x[9:10], weight, 1e-6), kernels.rms_norm(x, weight, 1e-6)[9:10])

    # one sequence of 130 tokens: every position decoded alone equals its row of one prefill, of chunks
    key_cache, value_cache = (torch.randn(3, 40, 4, 64).to(dtype) for _ in range(2))
    table = torch.randperm(40)[:33][None]
    query = torch.randn(130, 9, 64).to(dtype)
    whole = torch.empty_like(query)
    seqs = PrefillSequences(torch.tensor([0]), torch.tensor([130]), torch.tensor([130]), table)
    _with_threads(2, lambda: kernels.attend_prefill(query, key_cache, value_cache, seqs, 0.125, whole))
    for position in (0, 1, 63, 64, 65, 129):
        decoded = _with_threads(
            position % 3 + 1,
            lambda: kernels.attend_decode(
                query[position : position + 1],
                key_cache,
                value_cache,
                table,
                torch.tensor([position + 1]),
                0.125,
            ),
        )
        assert torch.equal(decoded[0], whole[position]), position
    chunked = torch.empty_like(query)
    for start, end in ((0, 5), (5, 70), (70, 71), (71, 130)):
        part = PrefillSequences(
            torch.tensor([start]), torch.tensor([end - start]), torch.tensor([end]), table
        )
        if end - start > 1:
            kernels.attend_prefill(query, key_cache, value_cache, part, 0.125, chunked)
        else:
            chunked[start] = kernels.attend_decode(
                query[start:end], key_cache, value_cache, table, torch.tensor([end]), 0.125
            )[0]
    assert torch.equal(chunked, whole)


PROMPTS = [
    "alpha beta gamma delta the quick brown fox jumps over",
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
]


def _generate(llm, prompts, alone: bool = False):
    """(token ids, logprobs, preemptions) of each prompt, greedy but for the last one (sampled with a
    seed); ``alone``: one request at a time."""
    from hetero_core import SamplingParams

    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=0)
    seeded = SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=10, ignore_eos=True, logprobs=0)
    params = [greedy] * (len(prompts) - 1) + [seeded]
    if alone:
        outputs = [out for p, sp in zip(prompts, params, strict=True) for out in llm.generate([p], [sp])]
    else:
        outputs = llm.generate(prompts, params)
    return [
        (out.output_token_ids, [lp.logprob for lp in out.logprobs], out.num_preemptions) for out in outputs
    ]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_embedded_model_answers_the_same_however_it_is_batched(smollm2_dir, dtype):
    """The issue's case: in bf16, ``max_prefill_chunk=1`` changed 2 of 16 greedy outputs and
    ``max_prefill_chunk=5`` moved logprobs by up to 0.086. Now the same tokens and the same logprobs,
    bit for bit, for every chunk size, alone or batched, and after preemptions (recompute or swap);
    a seeded sampled request too."""
    from hetero_core import LLM

    def llm(**settings):
        return LLM(model=str(smollm2_dir), dtype=dtype, **settings)

    batched = llm()
    expected = _generate(batched, PROMPTS)
    alone = _generate(batched, PROMPTS, alone=True)
    batched.shutdown()
    runs = {"alone": alone}
    for chunk in (1, 5):
        chunked = llm(max_prefill_chunk=chunk)
        runs[f"max_prefill_chunk={chunk}"] = _generate(chunked, PROMPTS)
        chunked.shutdown()
    for mode in ("recompute", "swap"):  # room for about one sequence at a time
        tight = llm(max_num_blocks=3, block_size=8, preemption_mode=mode)
        runs[f"preempted ({mode})"] = _generate(tight, PROMPTS)
        tight.shutdown()
        assert sum(preemptions for *_, preemptions in runs[f"preempted ({mode})"]) > 0
    for name, run in runs.items():
        for prompt, (tokens, logprobs, _), (want_tokens, want_logprobs, _) in zip(
            PROMPTS, run, expected, strict=True
        ):
            assert tokens == want_tokens, f"{name}: {prompt!r}"
            assert logprobs == want_logprobs, f"{name}: {prompt!r}"
