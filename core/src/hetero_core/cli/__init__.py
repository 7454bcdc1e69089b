"""The ``hetero`` command: ``main`` builds the parser from one module per command (``run``, ``serve``,
``plugins``, and those plugins add through the ``register_commands`` hook); ``settings_args`` turns
every setting into a flag for the commands that load settings."""
