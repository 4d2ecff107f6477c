/*
 * kvlane: move KV cache between inference engines, and between GPU memory,
 * host memory and files.
 *
 * Thread safety: every function may be called from any thread at once on
 * the same agent, except that an object must not be destroyed while another
 * thread uses it (agent, dlist, prep, xfer).
 */
#ifndef KVLANE_H
#define KVLANE_H

#include <kvlane/status.h>
#include <kvlane/error.h>
#include <kvlane/log.h>
#include <kvlane/agent.h>
#include <kvlane/memory.h>
#include <kvlane/desc.h>
#include <kvlane/metadata.h>
#include <kvlane/xfer.h>
#include <kvlane/notif.h>
#include <kvlane/listener.h>
#include <kvlane/etcd.h>

#define KVL_VERSION_MAJOR 0
#define KVL_VERSION_MINOR 1
#define KVL_VERSION_PATCH 0

#ifdef __cplusplus
extern "C" {
#endif
const char *kvl_version(void);
#ifdef __cplusplus
}
#endif

#endif
