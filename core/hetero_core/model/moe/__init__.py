"""Mixture-of-experts model code: Qwen3-MoE, Qwen2-MoE and Mixtral over the engine's flat batch.

``config`` (what a config.json says about the experts), ``router`` (softmax top-k), ``experts`` (the
stacked expert weights, run grouped by expert), ``block`` (router + experts + the shared expert where
the model has one), ``model`` (the Llama-family decoder with sparse MLPs where the config says),
``weights`` (checkpoint names -> stacked experts) and ``expert_parallel`` (experts split across the
ranks of a process group). The CPU runtime packs the experts for its kernels (``model/cpu/packed_experts``).
"""
