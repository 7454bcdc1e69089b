"""Errors a user can cause. The CLI prints them as one line (no traceback) and exits 2."""


class HeteroError(Exception):
    """Base class for errors that carry a message meant for the user."""


class ConfigError(HeteroError):
    """Settings or a settings file are invalid."""


class PluginError(HeteroError):
    """A plugin could not be loaded, registered or selected."""


class UnknownComponentError(PluginError):
    """A component name (executor, tokenizer, ...) is not registered."""


class InvalidRequestError(HeteroError):
    """A request (prompt or sampling parameters) is invalid; it fails alone."""


class ModelLoadError(HeteroError):
    """A model could not be found, read or is of an unsupported architecture."""


class MissingDependencyError(HeteroError):
    """An optional package the chosen path needs is not installed; the message gives the command."""


class ExecutorDeadError(HeteroError):
    """The executor can no longer run anything (e.g. a tensor-parallel worker died); the engine stops.

    Unlike an ordinary executor error, which fails only the requests of its batch, this one escapes
    ``Engine.step()``: every later step would fail the same way."""
