"""kvlane: move KV cache between inference engines.

    import kvlane
    with kvlane.Agent("decode") as agent:
        report = agent.register_memory(kv_tensor)   # readable: print(report)
        blob = agent.get_metadata()                 # hand to the peer

``kvlane.nixl`` offers ``nixl_agent``/``nixl_agent_config`` with NIXL's
Python API. See docs/python.md.
"""

import atexit as _atexit

from . import _kvlane
from ._kvlane import Prep, Xfer, backend_names, backend_available, backend_params
from ._kvlane import READ, WRITE, DEV_ANY, NOTIF_MAX, listener_built
from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors_all
from ._agent import Agent, DList, RegistrationReport, RegEntry, RegOutcome, memory_of

__version__ = _kvlane.version

__all__ = ["Agent", "DList", "Prep", "Xfer", "RegistrationReport", "RegEntry", "RegOutcome",
           "memory_of", "backend_names", "backend_available", "backend_params",
           "listener_built", "READ", "WRITE", "DEV_ANY", "NOTIF_MAX", "shutdown"] + _errors_all


def shutdown():
    """Close every agent still open, newest first: each cancels its transfers,
    releases prepared lists, disconnects, deregisters memory, then closes its
    backends. Runs at interpreter exit; calling it earlier is allowed."""
    _kvlane._shutdown()


# Registered at import, so it runs after atexit handlers registered later
# (which may still use their agents).
_atexit.register(shutdown)
