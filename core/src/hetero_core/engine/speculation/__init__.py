"""Speculative decoding: the proposer seam, the engine's side of it and verification."""
