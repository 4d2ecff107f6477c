"""The byte pattern peers fill their buffers with."""

import numpy as np

SIZE = 1 << 20


def pattern(seed, n=SIZE):
    return ((np.arange(n, dtype=np.uint64) * 2654435761 + seed) >> 7).astype(np.uint8)
