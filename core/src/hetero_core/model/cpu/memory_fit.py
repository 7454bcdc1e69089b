"""Does a model fit in memory in a dtype? The weights' bytes (``weight_size``), plus room for the KV
cache and the steps' working set, against what this process may take (``memory_budget``).

``dtype = "auto"`` never loads a candidate that does not fit: it is skipped with its reason, and when
no candidate fits the start fails with one error naming the model's size, the memory and the options
that make it smaller. The room kept beyond the weights, ``reserve_bytes``: the KV cache of one
``max_model_len`` sequence and the larger of ``MIN_WORKING_SET_BYTES`` and ``WORKING_SET_FRACTION`` of
the weights (activations, the packing's temporaries, the allocator's slack). An estimate, on purpose
a little generous: a candidate it wrongly keeps is killed by the kernel, one it wrongly skips costs
only speed.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetero_core.errors import ConfigError
from hetero_core.model.cpu.memory_budget import MemoryBudget, format_bytes
from hetero_core.model.cpu.weight_size import DTYPE_BYTES, CheckpointTensors

MIN_WORKING_SET_BYTES = 256 << 20
WORKING_SET_FRACTION = 0.1


@dataclass(frozen=True)
class MemoryFit:
    tensors: CheckpointTensors
    budget: MemoryBudget | None  # None: unknown (not Linux): everything fits
    kv_bytes_per_token: int  # K and V of every layer for one token, in fp32 (halved for 16-bit dtypes)
    max_model_len: int
    block_codes: bool = False  # fp32 linears that are Q4_1/Q8_0 codes stay codes (weight_size)

    def weight_bytes(self, dtype_name: str, codes: bool = False) -> int:
        """The weights' bytes in ``dtype_name``; ``codes``: block codes where the kernels keep them (the
        dense figure is an upper bound, and reading the GGUF's tensor types costs a little)."""
        return self.tensors.resident_bytes(dtype_name, codes and self.block_codes)

    def working_set_bytes(self, dtype_name: str, codes: bool = False) -> int:
        """Activations, the packing's temporaries, the allocator's slack."""
        return max(MIN_WORKING_SET_BYTES, int(WORKING_SET_FRACTION * self.weight_bytes(dtype_name, codes)))

    def reserve_bytes(self, dtype_name: str) -> int:
        """Room kept beyond the weights: one max_model_len sequence's KV cache and the working set."""
        kv = self.kv_bytes_per_token * DTYPE_BYTES[dtype_name] // 4 * self.max_model_len
        return kv + self.working_set_bytes(dtype_name)

    def needed_bytes(self, dtype_name: str, codes: bool = False) -> int:
        return self.weight_bytes(dtype_name, codes) + self.reserve_bytes(dtype_name)

    def problem(self, dtype_name: str) -> str | None:
        """Why the model does not fit in ``dtype_name``; None when it fits (or the memory is unknown)."""
        if self.budget is None or self.needed_bytes(dtype_name) <= self.budget.available_bytes:
            return None
        if self.block_codes and self.needed_bytes(dtype_name, codes=True) <= self.budget.available_bytes:
            return None
        return (
            f"its weights ({format_bytes(self.weight_bytes(dtype_name, codes=True))}) and "
            f"{format_bytes(self.reserve_bytes(dtype_name))} for the KV cache and working set do not fit "
            f"in {self.budget.describe()}"
        )

    def none_fits(self, dtype_names: list[str]) -> ConfigError:
        """The error for a model that fits in none of ``dtype_names``."""
        sizes = ", ".join(f"{format_bytes(self.needed_bytes(d, codes=True))} in {d}" for d in dtype_names)
        int8 = format_bytes(self.tensors.num_parameters + self.reserve_bytes("bfloat16"))
        return ConfigError(
            f"the model ({self.tensors.num_parameters / 1e9:.2f}B parameters) does not fit in memory: "
            f"it needs {sizes} (weights, KV cache of one max_model_len sequence and working set) and "
            f"{self.budget.describe() if self.budget else 'the memory is unknown'}; use "
            f"--quantization int8 (about {int8}), --dtype bfloat16 where the CPU has it, a lower "
            "--max-model-len, or free memory"
        )
