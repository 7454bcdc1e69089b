"""Helper modules of this folder (draft_helpers) and of tests/model (tiny_models) import by name under
any import mode."""
