"""kvlane's NIXL compatibility package.

With this folder's parent on PYTHONPATH, engines written against NIXL
(``from nixl._api import nixl_agent``) run unchanged on kvlane. It is built
beside the kvlane module (build/python-nixl) and installed only on request
(``cmake --install build --component nixl``), never on Python's default
path, so it cannot shadow a real NIXL by accident. ``nixl.__kvlane__`` is the
kvlane version it runs on; a real NIXL has no such attribute.
"""

import sys as _sys

try:
    import kvlane as _kvlane
except ImportError:
    from ._where import KVLANE_PYTHONPATH as _path
    if _path not in _sys.path:
        _sys.path.append(_path)
    import kvlane as _kvlane

__kvlane__ = _kvlane.__version__
__version__ = "1.4.0+kvlane." + _kvlane.__version__

from . import _api, _bindings, _utils, logging  # noqa: E402

# As NIXL's meta package: every public name of the submodules is also here.
for _m in (_api, _bindings, _utils, logging):
    for _k in dir(_m):
        if not _k.startswith("_") and _k not in globals():
            globals()[_k] = getattr(_m, _k)
del _m, _k
