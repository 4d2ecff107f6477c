"""nixl._api on kvlane: NIXL's Python agent API (kvlane.nixl), with the
names engines import from here."""

import logging as _logging

from kvlane.nixl import (  # noqa: F401
    nixl_agent, nixl_agent_config, nixl_prepped_dlist_handle, nixl_xfer_handle,
    nixl_thread_sync_t, nixl_reg_dlist, nixl_xfer_dlist, nixlRegDList, nixlXferDList,
    nixlXferTelemetry, nixl_xfer_telemetry, DEFAULT_COMM_PORT, NIXL_INIT_AGENT)
from . import _bindings as nixlBind  # noqa: F401,N812 (NIXL's alias, imported by engines)

nixl_backend_handle = int
logger = _logging.getLogger("nixl.api")
