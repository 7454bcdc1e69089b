"""GPU offline throughput: one executor on a synthetic Qwen3-0.6B-shaped model, 256 requests.

Workload (fixed, nano-vllm's): 256 requests, seed 0, prompts of random token ids in [0, 10000)
with lengths uniform in [100, 1024], output lengths uniform in [100, 1024], greedy, ignore EOS.
The model is Qwen3-0.6B's shape (28 layers, hidden 1024, 16 query / 8 KV heads of 128, vocab
151936, tied embeddings) with random bf16 weights, written once as config.json + safetensors +
a word-level tokenizer.json to --model-dir (reused when present). Every executor gets the same
scheduler budgets and the same KV pool (--kv-tokens); run it once per executor and compare the
output tokens/s (the JSON files hold the device, versions and settings).

``--flash-attn-double`` runs the cuda executor on the PyTorch test double of flash-attn
(tests/cuda/flash_attn_double.py of a Hetero checkout, standing in for the flash_attn module) where
flash-attn is not installed; its figures measure the executor (graphs, padding, batching) over
SDPA, not flash-attn's kernels.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import platform
import random
import sys
import time
import types
from pathlib import Path

from hetero_bench.options import positive_int
from hetero_bench.report import Column, Report, Table
from hetero_core import HeteroError

SUMMARY = "one GPU executor (torch, triton, cuda) on a synthetic Qwen3-0.6B: 256 requests, output tokens/s"
NEEDS = "a CUDA GPU, torch with CUDA, and the executor's plugin (flash-attn for cuda)"
QWEN3_06B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True, "hidden_act": "silu",
    "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16",
}  # fmt: skip
TINY = {
    **QWEN3_06B,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 12000,
}
FLASH_ATTN_DOUBLE = Path("tests") / "cuda" / "flash_attn_double.py"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--executor", choices=["torch", "triton", "cuda"], required=True)
    parser.add_argument("--no-cuda-graphs", action="store_true", help="cuda executor: eager decode steps")
    parser.add_argument(
        "--flash-attn-double",
        nargs="?",
        const=str(FLASH_ATTN_DOUBLE),
        metavar="PATH",
        help="cuda executor: the PyTorch test double instead of flash-attn "
        f"(default: {FLASH_ATTN_DOUBLE}, in a checkout)",
    )
    parser.add_argument(
        "--executor-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra option of the executor's section (JSON values), repeatable",
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="cuda executor: GPU memory share (the pool stays at most --kv-tokens); 0: off",
    )
    parser.add_argument("--num-requests", type=positive_int, default=256)
    parser.add_argument("--min-len", type=positive_int, default=100)
    parser.add_argument("--max-len", type=positive_int, default=1024)
    parser.add_argument("--block-size", type=positive_int, help="default: 256 for cuda, 16 otherwise")
    parser.add_argument(
        "--kv-tokens", type=positive_int, default=262144, help="KV pool size in tokens (all executors)"
    )
    parser.add_argument("--max-batch-size", type=positive_int, default=256, help="sequences per step")
    parser.add_argument("--max-total-tokens", type=positive_int, default=16384, help="tokens per step")
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/hetero-bench-qwen3-0.6b"))
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model (smoke test, not for figures)")
    parser.add_argument(
        "--no-step-timing",
        action="store_true",
        help="tokens/s only: no events or wait around each step (hetero_bench/step_timing.py)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="no GPU: the tiny model on the CPU (torch on cpu, triton in its interpreter; not cuda, "
        "whose start-up needs CUDA), --num-requests 4 of 16-24 tokens unless given: checks the "
        "wiring, gives no figures",
    )


def write_synthetic_model(directory: Path, config: dict, seed: int = 0) -> Path:
    """config.json, random bf16 safetensors under Hugging Face's names, and a word-level tokenizer.
    The tensor names and shapes are those core's model code loads (``hetero_core.model``)."""
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    from hetero_core.model.config import ModelConfig
    from hetero_core.model.fusion import split_state
    from hetero_core.model.llama import LlamaForCausalLM

    if (directory / "config.json").is_file() and json.loads(
        (directory / "config.json").read_text()
    ) == config:
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    model_config = ModelConfig.from_dict(config)
    with torch.device("meta"):
        shapes = {
            name: t.shape
            for name, t in split_state(
                LlamaForCausalLM(model_config, None).state_dict(), model_config
            ).items()
        }
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in shapes.items():
        if "norm" in name:
            state[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            state[name] = (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16)
    save_file(state, str(directory / "model.safetensors"))
    vocab = {f"t{i}": i for i in range(config["vocab_size"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return directory


def make_workload(num_requests: int, min_len: int, max_len: int, seed: int = 0):
    rng = random.Random(seed)
    return [
        ([rng.randint(0, 9999) for _ in range(rng.randint(min_len, max_len))], rng.randint(min_len, max_len))
        for _ in range(num_requests)
    ]


def executor_section(args) -> dict:
    options = {}
    if args.executor == "torch":
        options = {"device": "cpu" if args.dry_run else "cuda", "dtype": "bfloat16"}
    elif args.executor == "cuda":
        options = {"dtype": "bfloat16", "cuda_graphs": not args.no_cuda_graphs}
        if args.gpu_memory_utilization:
            options["gpu_memory_utilization"] = args.gpu_memory_utilization
    elif args.dry_run:  # triton: the interpreter runs float32 on the CPU
        options = {"interpreter": True, "dtype": "float32"}
    for item in args.executor_option:
        key, _, value = item.partition("=")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return {"name": args.executor, args.executor: options}


def use_flash_attn_double(path: str) -> None:
    """Stand the test double in for the ``flash_attn`` module (its two paged entry points), so the
    cuda executor loads it as it would load flash-attn."""
    if not Path(path).is_file():
        raise HeteroError(
            f"--flash-attn-double {path}: no such file; run from a Hetero checkout or give its path"
        )
    spec = importlib.util.spec_from_file_location("flash_attn_double", path)
    double_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(double_module)
    double = double_module.FlashAttnDouble()
    stand_in = types.ModuleType("flash_attn")
    stand_in.__version__ = "2.x (test double: PyTorch SDPA)"  # load_flash_attn takes 2.x
    stand_in.flash_attn_varlen_func = double.flash_attn_varlen_func
    stand_in.flash_attn_with_kvcache = double.flash_attn_with_kvcache
    sys.modules["flash_attn"] = stand_in


def versions(args) -> dict:
    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("triton", "flash_attn"):
        try:  # flash-attn-4 alone leaves flash_attn a namespace package, with no __version__
            found[name] = getattr(__import__(name), "__version__", None)
        except ImportError:
            found[name] = None
    try:
        found["flash_attn_4"] = importlib.metadata.version("flash-attn-4")
    except importlib.metadata.PackageNotFoundError:
        found["flash_attn_4"] = None
    if args.executor == "cuda":
        real = (
            f"flash-attn {found['flash_attn']}"
            if found["flash_attn"]
            else (f"flash-attn-4 {found['flash_attn_4']}")
        )
        double = "flash-attn test double (PyTorch SDPA)"
        found["attention_kernels"] = double if args.flash_attn_double else real
    return found


def run(args: argparse.Namespace) -> Report:
    import torch

    from hetero_bench.step_timing import StepTimer
    from hetero_core import LLM, SamplingParams, load_settings

    if args.dry_run:
        if args.executor == "cuda":
            raise HeteroError(
                "--dry-run runs torch and triton on the CPU; the cuda executor's start-up needs "
                "CUDA (its CPU checks are tests/cuda, on the flash-attn test double)"
            )
        args.tiny = True
        if args.num_requests == 256 and (args.min_len, args.max_len) == (100, 1024):
            args.num_requests, args.min_len, args.max_len = 4, 16, 24
    elif not torch.cuda.is_available():
        raise HeteroError(
            "the gpu-offline benchmark needs a CUDA GPU, and torch sees none here "
            "(--dry-run runs its wiring on the CPU)"
        )
    if args.flash_attn_double:
        if args.executor != "cuda":
            raise HeteroError("--flash-attn-double stands in for flash-attn: it needs --executor cuda")
        use_flash_attn_double(args.flash_attn_double)
    config = TINY if args.tiny else QWEN3_06B
    model_dir = write_synthetic_model(
        args.model_dir.with_name(args.model_dir.name + ("-tiny" if args.tiny else "")), config
    )
    block_size = args.block_size or (256 if args.executor == "cuda" else 16)
    settings = dict(
        model=str(model_dir), executor=executor_section(args), block_size=block_size,
        max_num_blocks=args.kv_tokens // block_size, max_batch_size=args.max_batch_size,
        max_num_seqs=args.max_batch_size, max_total_tokens=args.max_total_tokens,
        max_model_len=2 * args.max_len,
    )  # fmt: skip
    requests = make_workload(args.num_requests, args.min_len, args.max_len)
    num_output = sum(n for _, n in requests)
    on_gpu = torch.cuda.is_available() and not args.dry_run

    start = time.perf_counter()
    llm = LLM.from_settings(load_settings(**settings))
    startup_s = time.perf_counter() - start
    try:
        engine = llm.engine
        engine.generate(
            [requests[0][0][:64]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        )  # warm-up
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in requests]
        timer = None if args.no_step_timing else StepTimer(engine.executor, use_cuda=on_gpu)
        if on_gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        outputs = engine.generate([p for p, _ in requests], params)
        elapsed = time.perf_counter() - start
        steps = timer.summary(elapsed) if timer is not None else {}
        if timer is not None:
            timer.remove()
        num_kv_blocks = engine.executor.capabilities.num_kv_blocks or settings["max_num_blocks"]
    finally:
        llm.shutdown()
    produced = sum(len(o.output_token_ids) for o in outputs)
    if produced != num_output:
        raise HeteroError(f"expected {num_output} output tokens, got {produced}")

    label = args.executor + (
        ""
        if args.executor != "cuda"
        else (" (eager)" if args.no_cuda_graphs else " (CUDA graphs)")
        + (" [flash-attn test double]" if args.flash_attn_double else "")
    )
    label += " [dry run: CPU, tiny model]" if args.dry_run else ""
    row = {
        "executor": label,
        "output_tokens_per_s": num_output / elapsed,
        "elapsed_s": elapsed,
        "startup_s": startup_s,
        **steps,
    }
    prompt_tokens = sum(len(p) for p, _ in requests)
    columns = [
        Column("executor", "executor"),
        Column("elapsed_s", "time s", ".2f"),
        Column("output_tokens_per_s", "out tok/s", ".1f"),
        Column("startup_s", "start-up s", ".1f"),
    ]
    if steps:
        columns += [
            Column("num_steps", "steps", "d"),
            Column("wall_ms_per_step", "wall ms/step", ".2f"),
            Column("host_ms_per_step", "host ms/step", ".2f"),
            Column("device_ms_per_step", "device ms/step", ".2f"),
            Column("wait_ms_per_step", "wait ms/step", ".2f"),
        ]
    device = torch.cuda.get_device_name() if on_gpu else "cpu (dry run)"
    header = [
        f"device: {device}; versions: {versions(args)}",
        f"workload: {len(requests)} requests, prompt tokens {prompt_tokens}, output tokens {num_output}, "
        f"block_size {block_size}, KV blocks {num_kv_blocks}",
    ]
    results = {
        **row,
        "num_requests": len(requests),
        "prompt_tokens": prompt_tokens,
        "output_tokens": num_output,
        "device": device,
        "versions": versions(args),
        "num_kv_blocks": num_kv_blocks,
        "model": "synthetic Qwen3-0.6B shape" if not args.tiny else "tiny synthetic (smoke test)",
    }
    options = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    return Report(
        "gpu-offline",
        {**options, "engine": settings},
        Table(columns, [row]),
        header,
        [],
        results,
        title=f"GPU offline throughput: {label}",
    )
