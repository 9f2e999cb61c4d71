"""Exceptions raised by hvdlike."""


class NotInitializedError(ValueError):
    """A collective or query was called before ``hvdlike.init()``."""

    def __init__(self, what: str = "this call") -> None:
        super().__init__(f"hvdlike has not been initialized: call hvdlike.init() before {what}.")


class CollectiveMismatchError(ValueError):
    """Ranks called the same collective with different arguments (shape, dtype, op, root, ...)."""
