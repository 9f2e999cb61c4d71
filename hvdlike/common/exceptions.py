"""Horovod's ``horovod.common.exceptions`` names, so that a script catching them ports by its
import line: ``from hvdlike.common.exceptions import HorovodInternalError``."""
from ..base.errors import HostsUpdatedInterrupt, RanksFailedError

HorovodInternalError = RanksFailedError  # ranks died (under ULFM, ``hvdlikerun --elastic``)

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt"]
