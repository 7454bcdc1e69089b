"""Mixture-of-experts model code: Qwen3-MoE, Qwen2-MoE and Mixtral over the engine's flat batch.

``config`` (what a config.json says about the experts), ``router`` (softmax top-k), ``experts`` (the
stacked expert weights, run grouped by expert), ``block`` (router + experts + the shared expert where
the model has one), ``model`` (the Llama-family decoder with sparse MLPs where the config says),
``weights`` (checkpoint names -> stacked experts), ``sharded_experts`` (tensor parallelism: each
expert's columns split across the ranks) and ``expert_parallel`` (whole experts split across the
ranks, tokens dispatched all-to-all); ``architecture`` registers the three as core built-ins. The
CPU runtime packs the experts for its kernels (``model/cpu/packed_experts``).
"""
