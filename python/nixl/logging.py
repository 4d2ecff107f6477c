"""nixl.logging on kvlane: NIXL's logger helpers (loggers under "nixl.";
kvlane's own messages are on the "kvlane.nixl" logger)."""

import logging as _logging
import os as _os

_LEVELS = {"TRACE": _logging.DEBUG, "DEBUG": _logging.DEBUG, "INFO": _logging.INFO,
           "WARN": _logging.WARNING, "WARNING": _logging.WARNING, "ERROR": _logging.ERROR,
           "FATAL": _logging.CRITICAL}


def set_log_level_by_env(logger):
    level = _os.environ.get("NIXL_LOG_LEVEL", "").upper()
    if level in _LEVELS:
        logger.setLevel(_LEVELS[level])


def setup_logging():
    root = _logging.getLogger("nixl")
    set_log_level_by_env(root)
    return root


def get_logger(name):
    return _logging.getLogger(f"nixl.{name.lstrip('_')}")
