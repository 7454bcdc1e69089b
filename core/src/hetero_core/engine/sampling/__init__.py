"""From logits to tokens: the sampler, logits processors and constraints, logprobs, token bitmasks
and structured output."""
