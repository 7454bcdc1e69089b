"""A new model's first start does only the model's own work: the machine's part (the compiled CPU
kernels, keyed by the sources, the compiler and this CPU's flags, never by a model) is found in the
cache a first start of any other model left, and no compiler runs."""

from __future__ import annotations

import shutil
import types

from hetero_core.default_plugins.torch_executor import TorchExecutorOptions
from hetero_core.model.cpu import kernels as cpu_kernels_module
from hetero_core.model.gguf_cache import ensure_gguf_converted
from tests.model.test_gguf_fixtures import DATA


def test_new_models_first_starts_reuse_the_machines_kernels(
    cpu_kernels, prepared_cache_dir, tiny_model_dirs, make_executor, monkeypatch
):
    cache = prepared_cache_dir.parent
    library = cache / "kernels" / cpu_kernels.path.name
    library.parent.mkdir(parents=True)
    shutil.copy2(cpu_kernels.path, library)  # what the machine's first start of some model built
    before = library.stat()

    def compiler_run(args, **kwargs):
        raise AssertionError(f"a new model's first start ran the compiler: {args[0]}")

    monkeypatch.setattr(cpu_kernels_module, "subprocess", types.SimpleNamespace(run=compiler_run))
    models = [ensure_gguf_converted(DATA / "tiny-Q4_1.gguf", cache), tiny_model_dirs["llama"][0]]
    try:
        for model_dir in models:  # two models this cache has never seen, each as a new process would
            cpu_kernels_module._load.cache_clear()
            executor = make_executor(model_dir, options=TorchExecutorOptions())
            assert executor.backend.cpu_kernels.path == library
    finally:
        cpu_kernels_module._load.cache_clear()
    assert [p.name for p in library.parent.iterdir()] == [library.name]
    after = library.stat()
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (
        before.st_ino,
        before.st_mtime_ns,
        before.st_size,
    )
    prepared = sorted(p.name for p in prepared_cache_dir.glob("*.safetensors"))
    assert len(prepared) == 2 and prepared[0] != prepared[1]  # each model's own part was done, once each
