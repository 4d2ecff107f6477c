"""nixl._bindings on kvlane: NIXL's binding names (exceptions, enums,
descriptor lists, telemetry, configuration) backed by kvlane.

kvlane's exception classes derive from the NIXL-named ones defined here, so
``except nixlBackendError`` catches kvlane's errors and the message is
kvlane's full diagnosis (what failed, where, the fix)."""

import enum as _enum

import kvlane as _kvlane
from kvlane.errors import (  # noqa: F401
    nixlNotPostedError, nixlInvalidParamError, nixlBackendError, nixlNotFoundError,
    nixlMismatchError, nixlNotAllowedError, nixlRepostActiveError, nixlUnknownError,
    nixlNotSupportedError, nixlRemoteDisconnectError, nixlCancelledError, nixlNoTelemetryError)
from kvlane.nixl import (  # noqa: F401
    nixl_mem_t, nixl_xfer_op_t, nixl_thread_sync_t, nixlRegDList, nixlXferDList,
    nixlXferTelemetry, DEFAULT_COMM_PORT, NIXL_INIT_AGENT, nixl_agent as _nixl_agent)

DRAM_SEG = nixl_mem_t.DRAM_SEG
VRAM_SEG = nixl_mem_t.VRAM_SEG
BLK_SEG = nixl_mem_t.BLK_SEG
OBJ_SEG = nixl_mem_t.OBJ_SEG
FILE_SEG = nixl_mem_t.FILE_SEG
NIXL_READ = nixl_xfer_op_t.NIXL_READ
NIXL_WRITE = nixl_xfer_op_t.NIXL_WRITE
NIXL_THREAD_SYNC_NONE = nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE.value
NIXL_THREAD_SYNC_STRICT = nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT.value
NIXL_THREAD_SYNC_RW = nixl_thread_sync_t.NIXL_THREAD_SYNC_RW.value
NIXL_THREAD_SYNC_DEFAULT = nixl_thread_sync_t.NIXL_THREAD_SYNC_DEFAULT.value


class nixl_status_t(_enum.IntEnum):
    NIXL_IN_PROG = 1
    NIXL_SUCCESS = 0
    NIXL_ERR_NOT_POSTED = -1
    NIXL_ERR_INVALID_PARAM = -2
    NIXL_ERR_BACKEND = -3
    NIXL_ERR_NOT_FOUND = -4
    NIXL_ERR_MISMATCH = -5
    NIXL_ERR_NOT_ALLOWED = -6
    NIXL_ERR_REPOST_ACTIVE = -7
    NIXL_ERR_UNKNOWN = -8
    NIXL_ERR_NOT_SUPPORTED = -9


globals().update(nixl_status_t.__members__)


class nixl_cost_t(_enum.IntEnum):
    NIXL_COST_ANALYTICAL_BACKEND = 0


NIXL_COST_ANALYTICAL_BACKEND = nixl_cost_t.NIXL_COST_ANALYTICAL_BACKEND


class nixlAgentConfig:
    """The bindings' agent configuration: attributes only (SGLang's HiCache
    builds one and sets them). kvlane reads none of them: its agents are
    always thread safe and progress on their own threads."""

    def __init__(self, useProgThread=True, useListenThread=False, listenPort=0,  # noqa: N803
                 syncMode=NIXL_THREAD_SYNC_DEFAULT, pthrDelay=0, lthrDelay=100000,
                 etcdWatchTimeout=5000000, captureTelemetry=False):
        self.useProgThread = useProgThread
        self.useListenThread = useListenThread
        self.listenPort = listenPort
        self.syncMode = syncMode
        self.pthrDelay = pthrDelay
        self.lthrDelay = lthrDelay
        self.etcdWatchTimeout = etcdWatchTimeout
        self.captureTelemetry = captureTelemetry


class nixlAgent(_kvlane.Agent):
    """The bindings' agent: a kvlane agent with no backends, as
    ``nixlAgent(name, nixlAgentConfig())`` makes. nixl_agent drives it
    through kvlane calls; code that replaces ``nixl_agent.agent`` with one
    (SGLang's HiCache) keeps working. getAvailPlugins() answers as
    nixl_agent.get_plugin_list()."""

    def __init__(self, name, cfg=None):
        if cfg is not None and not isinstance(cfg, nixlAgentConfig):
            raise TypeError(f"nixlAgent(name, cfg): cfg must be a nixlAgentConfig, got "
                            f"{type(cfg).__name__}")
        super().__init__(name, backends=())

    @staticmethod
    def getAvailPlugins():  # noqa: N802 (NIXL's name)
        return _nixl_agent._plugins()
