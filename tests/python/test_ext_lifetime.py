"""Lifetimes, threads and argument conversions of the C extension
(python/src/kvlpy_*.c): objects a call still reads without the GIL, an
agent freed while another thread closes every agent, and values that must
be refused rather than wrapped.

The two-thread cases order the threads through the GIL, not through sleeps:
the second thread is released from a lock while the first holds the GIL, so
it can run only once the first has entered the C call and dropped the GIL
(the switch interval is raised to 10 s so that nothing else takes the GIL
from the first thread before that). The C call is made long (a 4M-entry
list, an agent's destroy) so that the second thread runs inside it. They
run in a child process: the bug they look for is a crash.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kvlane
from kvlane import _kvlane


def _child(code, timeout=120):
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                       capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


# ---- DList read without the GIL -------------------------------------------------

_RACE = """
    import sys, threading, time
    import numpy as np
    import kvlane
    from kvlane import _kvlane
    sys.setswitchinterval(10.0)
    a = kvlane.Agent("{name}")
    buf = np.zeros(1 << 20, dtype=np.uint8)
    a.register_memory(buf)
    dev = a.query_range(buf.ctypes.data, 1)[1]
    N = 1 << 22
    seen = []
    # The other thread can run only once the main thread drops the GIL in the
    # call (a 10 s switch interval); whether the OS runs it before the call
    # ends (~0.6 s) is the machine's choice, so a round that misses is tried
    # again: a crash in any round fails, and one round must see InUse.
    for attempt in range(8):
        dl = kvlane.DList("DRAM")
        dl.add_array(buf.ctypes.data + (np.arange(N, dtype=np.uint64) % (1 << 20)), len=1,
                     dev=dev)
        lk = threading.Lock()
        lk.acquire()
        res = {{}}

        def other():
            lk.acquire()            # runs once the main thread drops the GIL in the call
            try:
                {mutate}
                res["other"] = "changed"
            except kvlane.InUse as e:
                res["other"] = "InUse: " + str(e).splitlines()[0]

        t = threading.Thread(target=other)
        t.start()
        time.sleep(0.2)             # the thread waits in lk.acquire() (or soon will)
        lk.release()
        {call}
        t.join()
        assert n == N, n
        seen.append(res["other"])
        if res["other"].startswith("InUse: "):
            break
    print(seen[-1])
    print(n)
"""


@pytest.mark.parametrize("mutate", [
    '_kvlane.DList.__init__(dl, "DRAM")',
    'dl.add_array(np.arange(1 << 16, dtype=np.uint64) + buf.ctypes.data, len=1, dev=dev)',
    'dl.clear()',
])
@pytest.mark.parametrize("call", [
    "n = len(a.prep_local(dl))",
    "n = len(a.get_partial_metadata(dl)) and N",
])
def test_dlist_changed_while_a_call_reads_it(uniq, mutate, call):
    """prep_local / get_partial_metadata read the list without the GIL; a
    DList.__init__ of another thread then freed the entries being read
    (SIGSEGV), and an add could move them. Changing a list while such a call
    reads it raises kvlane.InUse."""
    rc, out, err = _child(_RACE.format(name=uniq[:30], mutate=mutate, call=call))
    assert rc == 0, f"child exited with {rc}: {err[-2000:]}"
    lines = out.split("\n")
    assert lines[0].startswith("InUse: ") and \
        "the descriptor list is in use by another thread" in lines[0], out
    assert int(lines[1]) == 1 << 22


def test_dlist_changed_by_backend_names_of_get_partial_metadata(uniq):
    """get_partial_metadata took the list's C pointer before reading the
    backend names; a names iterable that called the DList's __init__ again
    freed that list, and the metadata was then read from freed memory."""
    rc, out, err = _child(f"""
        import numpy as np
        import kvlane
        from kvlane import _kvlane
        a = kvlane.Agent("{uniq[:30]}")
        buf = np.zeros(1 << 20, dtype=np.uint8)
        a.register_memory(buf)
        dev = a.query_range(buf.ctypes.data, 1)[1]
        N = 1 << 20
        dl = kvlane.DList("DRAM")
        dl.add_array(buf.ctypes.data + np.arange(N, dtype=np.uint64), len=1, dev=dev)
        small = a.get_partial_metadata(kvlane.DList("DRAM"), False, ["shm"])

        def names():
            _kvlane.DList.__init__(dl, "DRAM")   # frees the 1M-entry list
            yield "shm"

        blob = a.get_partial_metadata(dl, False, names())
        print(blob == small)
    """)
    assert rc == 0, f"child exited with {rc}: {err[-2000:]}"
    assert out.strip() == "True"   # the list as it is after the names were read: empty


# ---- an agent freed while another thread closes every agent ----------------------

def test_agent_freed_while_shutdown_runs(uniq):
    """The last reference to an agent dropped: its dealloc destroys the C
    agent without the GIL while the agent is still on the module's list of
    live agents. kvlane.shutdown() (the atexit hook) of another thread took
    it from that list, gave the dying object a reference and dropped it
    again: a second dealloc, a double free (SIGSEGV)."""
    rc, out, err = _child(f"""
        import sys, threading, time
        from kvlane import _kvlane
        sys.setswitchinterval(10.0)
        a = _kvlane.Agent("{uniq[:30]}")
        lk = threading.Lock()
        lk.acquire()

        def other():
            lk.acquire()            # runs once the main thread drops the GIL in the dealloc
            _kvlane._shutdown()

        t = threading.Thread(target=other)
        t.start()
        time.sleep(0.2)
        lk.release()
        del a                       # dealloc: kvl_agent_destroy without the GIL
        t.join()
        print("ok")
    """)
    assert rc == 0 and out.strip() == "ok", f"child exited with {rc}: {err[-2000:]}"


def test_agent_init_again_after_close_is_refused(uniq):
    """Agent.__init__ on a closed agent made a new C agent that nothing could
    use or destroy: the object stayed 'closing', so every call said the agent
    is closed and close() and the dealloc skipped it (its threads and
    backends lived until exit)."""
    def tasks():
        return len(os.listdir("/proc/self/task"))

    a = _kvlane.Agent(uniq)
    a.close()
    n0 = tasks()
    with pytest.raises(kvlane.Exists, match=r"Agent.__init__ called twice"):
        _kvlane.Agent.__init__(a, uniq + "-again")
    assert a.closed
    del a
    assert tasks() <= n0


# ---- values refused, not wrapped --------------------------------------------------

@pytest.mark.parametrize("row", [(-8, 4, 0), (4096, -1, 0), (-(2**63), 8, 0)])
@pytest.mark.parametrize("cols", [3, 2])
def test_descriptor_table_negative_addr_or_len_is_refused(row, cols):
    """An int64 (N, 3) table with a negative address or length was read as
    2**64 - x: DList.add_descs took (-8, 4) as address 0xfffffffffffffff8
    without a word, where the same row as a tuple raises."""
    t = np.array([row[:cols]], dtype=np.int64)
    dl = kvlane.DList("DRAM")
    with pytest.raises(ValueError, match=r"descriptor 0: addr and len must be non-negative"):
        dl.add_descs(t)
    assert len(dl) == 0
    with pytest.raises(ValueError, match=r"descriptor 0: addr and len must be non-negative"):
        dl.add_descs([row[:cols]])


def test_descriptor_table_uint64_device_is_not_read_as_signed(uniq):
    """A uint64 table's device column was cast to int64: 2**64 - 1 became -1
    (any device) and registered; 2**63 + 5 became a negative id."""
    arr = np.zeros(4096, dtype=np.uint8)
    addr = arr.ctypes.data
    with kvlane.Agent(uniq) as a:
        for dev in (2**64 - 1, 2**63 + 5, 2**31):
            t = np.array([[addr, 4096, dev]], dtype=np.uint64)
            with pytest.raises(OverflowError, match=r"descriptor 0: device id %d is not a 32-bit"
                               % dev):
                a._register(t)
            with pytest.raises(OverflowError, match=r"descriptor 0: device id %d is not" % dev):
                kvlane.DList("DRAM").add_descs(t)
        assert a.query_range(addr, 4096) is None
        # a uint64 table of valid ids still works
        dl = kvlane.DList("DRAM")
        dl.add_descs(np.array([[addr, 4096, 0], [addr, 8, 7]], dtype=np.uint64))
        assert [e[4] for e in dl.entries()] == [0, 7]


@pytest.mark.parametrize("fn", [_kvlane.status_name, _kvlane.status_str])
def test_status_code_past_32_bits_is_refused(fn):
    """status_name(2**32) was cut to 0: 'KVL_OK' for a code that is none."""
    assert fn(0) == fn(_kvlane.OK)
    for v in (2**32, 2**32 + _kvlane.IN_PROGRESS, -(2**32), 2**63, 2**70):
        with pytest.raises(OverflowError, match="status code"):
            fn(v)


def test_bool_is_no_operation_or_memory_kind(uniq):
    """True was taken as operation 1 (READ) and memory kind 1 (DRAM)."""
    with kvlane.Agent(uniq) as a:
        for op in (True, False):
            with pytest.raises(kvlane.InvalidArgument, match='operation must be "READ" or'):
                a.create_xfer(op, kvlane.DList(), "nobody", kvlane.DList())
    for kind in (True, False):
        with pytest.raises(ValueError, match="memory kind must be"):
            kvlane.DList(kind)
    assert kvlane.DList(1).kind == "DRAM"   # an int code stays accepted


def test_bool_is_no_length_or_address(uniq):
    """True was taken as 1 wherever an unsigned integer is read: a length,
    an address, a timeout; and add_array(lens=True) as length 1."""
    buf = np.zeros(4096, dtype=np.uint8)
    dl = kvlane.DList("DRAM")
    for args in ((buf.ctypes.data, True), (True, 8), (buf.ctypes.data, 8, 0, True)):
        with pytest.raises(TypeError, match="an integer is needed, got bool"):
            (dl.add if len(args) == 2 else dl.add_strided)(*args)
    with pytest.raises(TypeError, match="lens is a bool"):
        dl.add_array(np.array([buf.ctypes.data], dtype=np.uint64), lens=True)
    with pytest.raises(TypeError, match="an integer is needed, got bool"):
        kvlane.Agent(uniq, timeout_ms=True)
    assert len(dl) == 0
    dl.add(buf.ctypes.data, 8)                      # ints stay accepted
    dl.add_array(np.array([buf.ctypes.data], dtype=np.uint64), lens=8)
    assert len(dl) == 2
