"""The engine: requests from any thread, matched across ranks by name, negotiated in rounds,
fused and run on a transport (see ``engine.engine``)."""
from .engine import Engine

__all__ = ["Engine"]
