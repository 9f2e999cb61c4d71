"""The registered process sets, by id, as the world holds them: ``init`` binds the global set
(id 0) to the world, ``shutdown`` unbinds every set and frees its transports, and a world that
lost ranks forgets them without freeing. The sets are the api's ``ProcessSet`` objects
(``hvdlike.process_sets``, which registers and removes the others); the runtime and the engine
see them through ``Bindable``."""
from typing import Any, Dict, List, Optional, Protocol


class Bindable(Protocol):
    """What the runtime and the engine use of a process set."""

    process_set_id: Optional[int]
    ranks: List[int]

    def bind(self, process_set_id: int, ranks: List[int], comm: Any) -> None:
        """Register as set ``process_set_id`` of ``ranks``; ``comm``: its communicator on
        member ranks, None elsewhere."""

    def unbind(self, release: bool = True) -> None:
        """Leave the registry; ``release``: free the set's transports (collective)."""


REGISTERED: Dict[int, Bindable] = {}
FREE_IDS: List[int] = []  # ids of removed sets, given again first-removed first (as Horovod)
_global: Optional[Bindable] = None  # the object that stands for the global set


def use_global(process_set: Bindable) -> None:
    """The object that stands for the global set (``hvdlike.global_process_set``)."""
    global _global
    _global = process_set


def bind_global(size: int, world: Any) -> None:
    """Bind the global set to ``world``, every one of its ``size`` ranks."""
    assert _global is not None, "hvdlike.process_sets registers the global set on import"
    _global.bind(0, list(range(size)), world)


def unbind_all(release: bool) -> None:
    """Unbind every set; ``release``: free their transports (collective over the world)."""
    for process_set in list(REGISTERED.values()):
        process_set.unbind(release)
    FREE_IDS.clear()
