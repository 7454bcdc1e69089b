"""Multi-head latent attention (DeepSeek-V2/V3): config, RoPE, attention, model."""
