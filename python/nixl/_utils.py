"""nixl._utils on kvlane: NIXL's test helpers for raw host buffers."""

import ctypes as _ctypes

_libc = _ctypes.CDLL(None, use_errno=True)
_libc.aligned_alloc.restype = _ctypes.c_void_p
_libc.aligned_alloc.argtypes = (_ctypes.c_size_t, _ctypes.c_size_t)
_libc.free.argtypes = (_ctypes.c_void_p,)


def malloc_passthru(size):
    """A 4096-aligned host buffer of size bytes; its address as an int."""
    size = int(size)
    if size <= 0:
        raise ValueError(f"malloc_passthru({size}): size must be positive")
    addr = _libc.aligned_alloc(4096, (size + 4095) // 4096 * 4096)
    if not addr:
        raise MemoryError(f"malloc_passthru({size}): aligned_alloc failed")
    return addr


def free_passthru(addr):
    _libc.free(_ctypes.c_void_p(int(addr)))


def ba_buf(addr, size):
    """Fill size bytes at addr with 0xba."""
    _ctypes.memset(int(addr), 0xBA, int(size))


def verify_transfer(addr1, addr2, size):
    """Raise AssertionError unless size bytes at addr1 and addr2 are equal."""
    a = _ctypes.string_at(int(addr1), int(size))
    b = _ctypes.string_at(int(addr2), int(size))
    assert a == b, f"verify_transfer: buffers 0x{int(addr1):x} and 0x{int(addr2):x} differ"
