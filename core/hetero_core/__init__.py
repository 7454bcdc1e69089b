"""Hetero: a plugin-based LLM inference engine."""

__version__ = "0.1.0"
