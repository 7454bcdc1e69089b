"""GPU offline throughput: one executor on a synthetic Qwen3-0.6B-shaped model, 256 requests.

Workload (fixed, nano-vllm's): 256 requests, seed 0, prompts of random token ids in [0, 10000)
with lengths uniform in [100, 1024], output lengths uniform in [100, 1024], greedy, ignore EOS.
The model is Qwen3-0.6B's shape (28 layers, hidden 1024, 16 query / 8 KV heads of 128, vocab
151936, tied embeddings) with random bf16 weights, written once as config.json + safetensors +
a word-level tokenizer.json to --model-dir (reused when present). Every executor gets the same
scheduler budgets and the same KV pool (--kv-tokens); run it once per executor and compare the
printed output tokens/s (the JSON files hold device, versions and settings).

    python bench/gpu_offline_throughput.py --executor cuda [--no-cuda-graphs] [--flash-attn-double]
    python bench/gpu_offline_throughput.py --executor torch       # device cuda, bf16
    python bench/gpu_offline_throughput.py --executor triton [--executor-option KEY=VALUE ...]

``--flash-attn-double`` runs the cuda executor on the PyTorch test double of flash-attn
(tests/cuda/flash_attn_double.py) where flash-attn is not installed; its figures measure the
executor (graphs, padding, batching) over SDPA, not flash-attn's kernels.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from pathlib import Path

QWEN3_06B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True, "hidden_act": "silu",
    "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16",
}  # fmt: skip
TINY = {**QWEN3_06B, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 12000}


def write_synthetic_model(directory: Path, config: dict, seed: int = 0) -> Path:
    """config.json, random bf16 safetensors under Hugging Face's names, and a word-level tokenizer."""
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    from hetero_core.model.config import ModelConfig
    from hetero_core.model.fusion import split_state
    from hetero_core.model.llama import LlamaForCausalLM

    if (directory / "config.json").is_file() and json.loads((directory / "config.json").read_text()) == config:
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    model_config = ModelConfig.from_dict(config)
    with torch.device("meta"):
        shapes = {name: t.shape for name, t in split_state(LlamaForCausalLM(model_config, None).state_dict(),
                                                            model_config).items()}
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
        options = {"device": "cuda", "dtype": "bfloat16"}
    elif args.executor == "cuda":
        options = {"dtype": "bfloat16", "cuda_graphs": not args.no_cuda_graphs}
        if args.gpu_memory_utilization:
            options["gpu_memory_utilization"] = args.gpu_memory_utilization
    for item in args.executor_option:
        key, _, value = item.partition("=")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return {"name": args.executor, args.executor: options}


def load_plugin_set(args):
    """Plugins without entry points: core plus the chosen executor's package (or the double)."""
    from hetero_core.plugin_system.hookspecs import hookimpl
    from hetero_core.plugin_system.discovery import load_plugins

    if args.executor == "cuda" and args.flash_attn_double:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "cuda"))
        from flash_attn_double import FlashAttnDouble

        from hetero_plugins_cuda.executor import CudaExecutor
        from hetero_plugins_cuda.options import CudaExecutorOptions

        class DoublePlugin:
            @hookimpl
            def register_executors(self, register):
                register("cuda", lambda ctx: CudaExecutor(ctx, kernels=FlashAttnDouble().kernels(("cuda",))),
                         options=CudaExecutorOptions, needs_model=True)

        return load_plugins(entry_points=[], extra_plugins=[("cuda", DoublePlugin())])
    if args.executor == "torch":
        return load_plugins(entry_points=[])
    module = __import__(f"hetero_plugins_{args.executor}")
    return load_plugins(entry_points=[], extra_plugins=[(args.executor, module)])


def versions(args) -> dict:
    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("triton", "flash_attn"):
        try:
            found[name] = __import__(name).__version__
        except ImportError:
            found[name] = None
    if args.executor == "cuda":
        found["attention_kernels"] = "flash-attn test double (PyTorch SDPA)" if args.flash_attn_double else (
            f"flash-attn {found['flash_attn']}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executor", choices=["torch", "triton", "cuda"], required=True)
    parser.add_argument("--no-cuda-graphs", action="store_true", help="cuda executor: eager decode steps")
    parser.add_argument("--flash-attn-double", action="store_true",
                        help="cuda executor: use the PyTorch test double instead of flash-attn")
    parser.add_argument("--executor-option", action="append", default=[], metavar="KEY=VALUE",
                        help="extra option of the executor's section (JSON values), repeatable")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                        help="cuda executor: GPU memory share (the pool stays at most --kv-tokens); 0: off")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--min-len", type=int, default=100)
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--block-size", type=int, default=None, help="default: 256 for cuda, 16 otherwise")
    parser.add_argument("--kv-tokens", type=int, default=262144, help="KV pool size in tokens (all executors)")
    parser.add_argument("--max-batch-size", type=int, default=256, help="sequences per step")
    parser.add_argument("--max-total-tokens", type=int, default=16384, help="tokens per step")
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/hetero-bench-qwen3-0.6b"))
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model (smoke test, not for figures)")
    parser.add_argument("--json", type=Path, default=None, help="write the result here")
    args = parser.parse_args()

    import torch

    from hetero_core.builder import build_engine
    from hetero_core.engine.params import SamplingParams
    from hetero_core.logging import configure_logging
    from hetero_core.settings import load_settings

    if not torch.cuda.is_available():
        parser.error("this benchmark needs a CUDA GPU; torch sees none")
    configure_logging(level="warning")
    config = TINY if args.tiny else QWEN3_06B
    model_dir = write_synthetic_model(args.model_dir.with_name(args.model_dir.name + ("-tiny" if args.tiny else "")),
                                      config)
    block_size = args.block_size or (256 if args.executor == "cuda" else 16)
    max_model_len = 2 * args.max_len
    settings = dict(
        model=str(model_dir), executor=executor_section(args), block_size=block_size,
        max_num_blocks=args.kv_tokens // block_size, max_batch_size=args.max_batch_size,
        max_num_seqs=args.max_batch_size, max_total_tokens=args.max_total_tokens, max_model_len=max_model_len,
    )  # fmt: skip
    requests = make_workload(args.num_requests, args.min_len, args.max_len)
    num_output = sum(n for _, n in requests)

    start = time.perf_counter()
    engine = build_engine(load_settings(**settings), load_plugin_set(args))
    startup_s = time.perf_counter() - start
    engine.generate([requests[0][0][:64]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))  # warm-up
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in requests]
    torch.cuda.synchronize()
    start = time.perf_counter()
    outputs = engine.generate([p for p, _ in requests], params)
    elapsed = time.perf_counter() - start
    produced = sum(len(o.output_token_ids) for o in outputs)
    if produced != num_output:
        raise SystemExit(f"expected {num_output} output tokens, got {produced}")
    num_kv_blocks = engine.scheduler.allocator.num_blocks
    engine.shutdown()

    label = args.executor + ("" if args.executor != "cuda" else
                             (" (eager)" if args.no_cuda_graphs else " (CUDA graphs)")
                             + (" [flash-attn test double]" if args.flash_attn_double else ""))
    result = {
        "executor": label, "output_tokens_per_s": num_output / elapsed, "elapsed_s": elapsed,
        "startup_s": startup_s, "num_requests": len(requests), "prompt_tokens": sum(len(p) for p, _ in requests),
        "output_tokens": num_output, "device": torch.cuda.get_device_name(), "versions": versions(args),
        "model": "synthetic Qwen3-0.6B shape" if not args.tiny else "tiny synthetic (smoke test)",
        "settings": {**settings, "model": str(model_dir)}, "num_kv_blocks": num_kv_blocks,
    }  # fmt: skip
    print(f"device: {result['device']}; versions: {result['versions']}")
    print(f"workload: {len(requests)} requests, prompt tokens {result['prompt_tokens']}, output tokens {num_output}, "
          f"block_size {block_size}, KV blocks {num_kv_blocks}")
    print(f"{label}: {elapsed:7.2f} s  {num_output / elapsed:9.1f} output tokens/s  (start-up {startup_s:.1f} s)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
