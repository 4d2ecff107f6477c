/*
 * VRAM over the ucx backend when UCX cannot map GPU memory (Debian's and
 * Ubuntu's UCX have no CUDA support): the same cases as test_tcp_vram, with
 * the data through UCX active messages and pinned host buffers. Skips (77)
 * without a driver or GPU, without the ucx module, or when UCX maps GPU
 * memory itself (nothing is staged then).
 * KVL_TEST_LABELS: gpu nosan ucx
 */
#define KVL_VRAM_BK "ucx"
/* host memory -> remote VRAM is staged too: the target's VRAM has no rkey */
#define KVL_VRAM_DRAM_PATH "staged"
#include "integration/test_tcp_vram.c"
