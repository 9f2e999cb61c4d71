"""The ``hvdlike`` logger: messages on stderr, prefixed with the rank, at the level that
``HVDLIKE_LOG_LEVEL`` sets (trace, debug, info, warning (default), error, fatal: Horovod's
names for ``HOROVOD_LOG_LEVEL``)."""
import logging
import sys

logger = logging.getLogger("hvdlike")

LEVELS = {"trace": logging.DEBUG, "debug": logging.DEBUG, "info": logging.INFO,
          "warning": logging.WARNING, "error": logging.ERROR, "fatal": logging.CRITICAL}


def setup(rank: int, level: str) -> None:
    """Send hvdlike's messages to stderr as ``hvdlike[rank]: LEVEL: message``."""
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"hvdlike[{rank}]: %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(LEVELS[level])
    logger.propagate = False
