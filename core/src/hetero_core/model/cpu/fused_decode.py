"""Pure decode steps through every decoder layer in one call of the compiled kernels (CPU).

A decode step of the model code makes ~8 kernel calls per layer through ctypes, each with its
module call, checks and torch output in Python: ~13 us apiece, 3-4 ms of every step on SmolLM2's 30
layers (18 ms at batch 1). ``csrc/decode_layers.c`` runs the same kernels in the same order over
buffers allocated once per step, so the hidden states, the residual stream and the KV cache equal
the model code's bit for bit; only the Python between the kernels is gone.

It applies where every piece of a layer is one of those kernels: a Llama-family model (no q/k norm)
whose linears all run in the kernels' layouts (in fp32 ``f32`` panels or block ``codes``, in bf16
``bf16_linear``'s; the MLP's gate/up with SwiGLU inside, or, for a GGUF's mixed types, q/k/v and
gate/up in parts of different code layouts: ``split_linear``'s parts in turn, a split gate/up
followed by the kernels' SiLU-and-multiply, as the model code runs them), the torch paged
attention backend with the kernels and contiguous caches of the model's dtype, and a step whose
every token is a decode. ``FusedDecode.for_model`` returns
None where it does not apply; the torch executor's option ``fused_decode`` turns it off.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from hetero_core.model.cpu.code_panels import code_format
from hetero_core.model.cpu.kernel_attention import DECODE_ATTENTION_REFUSED

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p


class _Linear(ctypes.Structure):
    _fields_ = [
        ("weight", _PTR),
        ("bias", _PTR),
        ("out_features", _I64),
        ("in_features", _I64),
        ("bits", ctypes.c_int32),
        ("swiglu", ctypes.c_int32),
        ("int8_activations", ctypes.c_int32),
        ("tile_rows", ctypes.c_int32),
    ]


MAX_PARTS = 3  # decode_layers.c's FUSED_MAX_PARTS: a projection's row ranges in different layouts


class _Projection(ctypes.Structure):
    _fields_ = [("part", _Linear * MAX_PARTS), ("num_parts", _I64)]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("input_norm", _PTR),
        ("post_attention_norm", _PTR),
        ("qkv", _Projection),
        ("gate_up", _Projection),
        ("o", _Linear),
        ("down", _Linear),
        ("key_cache", _PTR),
        ("value_cache", _PTR),
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        ("layers", _PTR),
        ("num_layers", _I64),
        ("hidden", _I64),
        ("num_heads", _I64),
        ("num_kv_heads", _I64),
        ("head_dim", _I64),
        ("intermediate", _I64),
        ("num_blocks", _I64),
        ("block_size", _I64),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("bf16", ctypes.c_int32),
    ]


class _Step(ctypes.Structure):
    _fields_ = [
        ("rows", _I64),
        ("max_blocks", _I64),
        ("hidden", _PTR),
        ("residual", _PTR),
        ("normed", _PTR),
        ("qkv", _PTR),
        ("attention", _PTR),
        ("activation", _PTR),
        ("gate_up", _PTR),
        ("cos", _PTR),
        ("sin", _PTR),
        ("slots", _PTR),
        ("block_tables", _PTR),
        ("context_lens", _PTR),
        ("num_threads", ctypes.c_int32),
    ]


# kernel layouts of each model dtype (block codes under bf16: only with int8 activations, which take bf16)
_LAYOUTS = {torch.float32: ("f32", "codes"), torch.bfloat16: ("bf16", "codes")}


def _linear(module, dtype: torch.dtype) -> _Linear | None:
    """``module`` as the C side reads it, or None where it does not run in a kernel layout of ``dtype``."""
    from hetero_core.model.cpu.linear import PackedLinear

    if (
        not isinstance(module, PackedLinear)
        or not module.all_rows
        or module.float32_output
        or module.kernel_dtype not in _LAYOUTS[dtype]
        or (dtype == torch.bfloat16 and module.kernel_dtype == "codes" and not module.int8_activations)
    ):
        return None
    weight = module.kernel_weight
    if module.kernel_dtype == "codes":
        bits = code_format(weight)
    else:
        bits = 0 if module.kernel_dtype == "f32" else 16
    bias = module.bias_f32
    return _Linear(
        weight.data_ptr(),
        None if bias is None else bias.data_ptr(),
        module.out_features,
        module.in_features,
        bits,
        int(module.swiglu),
        int(module.int8_activations),
        module.kernels.code_tile_rows if module.int8_activations else 0,
    )


def _projection(module, dtype: torch.dtype) -> _Projection | None:
    """``module`` as its parts: a ``SplitLinear``'s (its row ranges in their own layouts) or the one
    linear; None where a part does not run in a kernel layout of ``dtype``."""
    from hetero_core.model.cpu.split_linear import SplitLinear

    modules = list(module.parts) if isinstance(module, SplitLinear) else [module]
    parts = [_linear(m, dtype) for m in modules]
    if len(parts) > MAX_PARTS or any(part is None for part in parts):
        return None
    return _Projection((_Linear * MAX_PARTS)(*parts), len(parts))


class FusedDecode:
    """The ctypes view of a model's decoder layers for ``decode_layers``; ``__call__`` runs a step."""

    def __init__(
        self,
        kernels,
        model_struct: _Model,
        layers,
        keep_alive: list,
        key_cache: torch.Tensor,
    ) -> None:
        self.kernels = kernels
        # some layer's gate and up in parts: each step needs a buffer for both before silu_mul
        self.split_gate_up = any(layer.gate_up.num_parts > 1 for layer in layers)
        self.dtype = key_cache.dtype
        self._first_key_cache = key_cache.data_ptr()  # the caches the structures point at
        self._model = model_struct
        self._layers = layers  # the array _model points into
        self._keep_alive = keep_alive  # tensors whose pointers the structures hold

    @classmethod
    def for_model(cls, model, kernels, kv_caches) -> FusedDecode | None:
        """The fused path for ``model`` (a ``LlamaForCausalLM`` after packing and ``use_cpu_kernels``;
        not a subclass, whose forward may differ: other architectures run their own forward)
        over ``kv_caches``, or None where a piece of it is not one of the kernels."""
        from hetero_core.model.llama import LlamaForCausalLM

        if (
            kernels is None
            or type(model) is not LlamaForCausalLM
            or not hasattr(kernels.library, "decode_layers")
        ):
            return None
        dtype = model.model.embed_tokens.weight.dtype
        if dtype not in _LAYOUTS:
            return None
        config = model.config
        head_dim, num_heads, num_kv_heads = (
            config.head_dim,
            config.num_attention_heads,
            config.num_key_value_heads,
        )
        query = torch.empty((1, num_heads, head_dim), dtype=dtype)  # the kernels' own checks decide
        if (
            not kernels.supports(query, num_kv_heads)
            or not kernels.handles(query, head_dim // 2)  # RoPE
            or not kernels.handles(query, config.hidden_size)  # RMSNorm
            or len(kv_caches) != len(model.model.layers)
            or getattr(model.backend, "cpu_kernels", None) is None
        ):
            return None
        layers = (_Layer * len(model.model.layers))()
        keep: list[Any] = []
        for index, (layer, cache) in enumerate(zip(model.model.layers, kv_caches, strict=True)):
            attention, mlp = layer.self_attn, layer.mlp
            qkv, gate_up = _projection(attention.qkv_proj, dtype), _projection(mlp.gate_up_proj, dtype)
            o, down = _linear(attention.o_proj, dtype), _linear(mlp.down_proj, dtype)
            norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
            caches = (cache.key, cache.value)
            split = gate_up is not None and gate_up.num_parts > 1  # gate, up, then the MLP's silu_mul
            if (
                any(p is None for p in (qkv, gate_up, o, down))
                or not (mlp.gate_up_proj.swiglu or (split and _silu_mul_kernel(mlp, config, dtype)))
                or attention.q_norm is not None
                or attention.kernels is None
                or layer.input_layernorm.kernels is None
                or layer.post_attention_layernorm.kernels is None
                or any(n.dtype != dtype or not n.is_contiguous() for n in norms)
                or any(c.dtype != dtype or c.device.type != "cpu" or not c.is_contiguous() for c in caches)
            ):
                return None
            keep += [*norms, *caches]
            layers[index] = _Layer(
                norms[0].data_ptr(),
                norms[1].data_ptr(),
                qkv,
                gate_up,
                o,
                down,
                caches[0].data_ptr(),
                caches[1].data_ptr(),
            )
        key_cache = kv_caches[0].key
        struct = _Model(
            ctypes.addressof(layers),
            len(layers),
            config.hidden_size,
            num_heads,
            num_kv_heads,
            head_dim,
            config.intermediate_size,
            key_cache.shape[1],
            key_cache.shape[2],
            config.rms_norm_eps,
            head_dim**-0.5,
            int(dtype == torch.bfloat16),
        )
        return cls(kernels, struct, layers, keep, key_cache)

    def __call__(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, metadata: Any, kv_caches
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The decoder layers over ``hidden`` (the embeddings [rows, hidden], overwritten) for a
        pure decode step -> ``(hidden, residual)`` as the last layer leaves them; None for any other
        step or other caches (the model code runs those)."""
        if (
            not getattr(metadata, "pure_decode", False)
            or hidden.dtype != self.dtype
            or hidden.dim() != 2
            or hidden.shape[0] != metadata.decode.num_seqs
            or kv_caches[0].key.data_ptr() != self._first_key_cache
        ):
            return None
        decode = metadata.decode
        model = self._model
        rows = hidden.shape[0]
        tables = decode.block_index.view(decode.num_seqs, -1)
        q_width, kv_width = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
        hidden = hidden.contiguous()  # overwritten with each layer's output
        residual = torch.empty_like(hidden)
        buffers = [
            torch.empty((rows, width), dtype=self.dtype)
            for width in (model.hidden, q_width + 2 * kv_width, q_width, model.intermediate)
        ]
        normed, qkv, attention, activation = buffers
        gate_up = None
        if self.split_gate_up:
            gate_up = torch.empty((rows, 2 * model.intermediate), dtype=self.dtype)
        cos, sin = cos.contiguous(), sin.contiguous()
        step = _Step(
            rows,
            tables.shape[1],
            hidden.data_ptr(),
            residual.data_ptr(),
            normed.data_ptr(),
            qkv.data_ptr(),
            attention.data_ptr(),
            activation.data_ptr(),
            None if gate_up is None else gate_up.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            metadata.slot_mapping.data_ptr(),
            tables.data_ptr(),
            decode.context_lens.data_ptr(),
            torch.get_num_threads(),
        )
        status = self.kernels.library.decode_layers(ctypes.byref(model), ctypes.byref(step))
        if status == 1:
            raise ValueError("a CPU kernel of the fused decode step refused the model's shapes")
        if status == 2:
            raise ValueError(DECODE_ATTENTION_REFUSED)
        if status != 0:
            raise MemoryError("a CPU kernel of the fused decode step could not allocate its buffers")
        return hidden, residual


def _silu_mul_kernel(mlp, config, dtype: torch.dtype) -> bool:
    """Whether the model code's MLP takes the kernels' SiLU-and-multiply for a split gate/up of
    ``dtype`` (the fused step runs that kernel: the same bits), not torch's."""
    probe = torch.empty((1, 2 * config.intermediate_size), dtype=dtype)
    return mlp.kernels is not None and mlp.kernels.handles(probe, config.intermediate_size)
