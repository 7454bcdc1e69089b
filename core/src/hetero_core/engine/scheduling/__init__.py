"""Continuous batching: the scheduler, the policy seam it asks, preemption, and the step and batch
it hands the executor."""
