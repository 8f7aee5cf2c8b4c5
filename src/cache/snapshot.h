/* snapshot.h - one layer's saved state: a KV row range, a whole recurrent state or a whole window.
 *
 * A full-attention snapshot is the K/V rows [from, to) of one layer. It starts LIVE (lazy): a
 * reference into the live buffer that costs nothing, valid while those rows are untouched; it is
 * copied out (materialized) before the rows are overwritten. A recurrent snapshot is the conv tail
 * and SSM state at one offset (from == to), always a copy. A window snapshot (a sliding-window
 * layer) is the K/V rows of positions [o - n, o), n = min(o, W), at one offset o (from == to ==
 * o), oldest first, always a copy: the ring overwrites its rows as it slides, so a lazy reference
 * would not last. Copies live in one of three tiers:
 *  - DEVICE: a buffer in the backend's own memory (cn_backend_buf_alloc, CN_BUF_DEVICE). Taking
 *    one is a device-to-device copy queued with the ops, so a forward's captures and a close's
 *    state never cross the host link nor make the host wait. On a backend computing in host
 *    memory (the CPU) the buffer is host memory and the tier differs from RAM only in its budget.
 *  - RAM: host memory, pinned where the backend has it (CN_BUF_HOST); bytes read back from a
 *    file are plain malloc'd memory.
 *  - DISK: the bytes are in a cache file (disk.h) and none in memory.
 *
 *     forward writes KV rows          capture / close take whole states
 *              |                               |
 *              v                               v   (RAM when no device tier or no room)
 *          +------+  materialize     +--------+  to_host        +-----+  page_out  +------+
 *          | LIVE | ---------------> | DEVICE | --------------> | RAM | ---------> | DISK |
 *          +------+                  +--------+ (copy stream,   +-----+ <--------- +------+
 *                                        |       fence; no wait)   |     page_in
 *                restore: a device copy  v                         v  restore: a copy-stream
 *                queued with the ops    live                     live upload the ops wait for
 *
 * A RAM snapshot may have a copy in flight into or out of its bytes (snap->fence, backend.h):
 * every function here that reads, frees or pages out those bytes waits for that fence first, so a
 * caller never sees a copy half done; nothing else ever waits for a to_host.
 *
 * Invariants:
 *  (1) A LIVE snapshot's rows equal its source state's rows [from, to), and to <= that state's
 *      offset. Functions that read a LIVE snapshot read its source; a restore into the source is
 *      free, into another state a copy between the two buffers.
 *  (2) bytes is the size the snapshot has when materialized; LIVE snapshots count 0 in budgets.
 *  (3) Functions that fail leave the snapshot as it was.
 *  (4) Exactly the tier's storage is held: dev for DEVICE, ram for RAM, neither for LIVE and
 *      DISK; be is the backend that gave dev and a pinned ram (ram_pinned), else ram is malloc'd.
 */
#ifndef CN_SNAPSHOT_H
#define CN_SNAPSHOT_H

#include <stdint.h>

#include "model/state.h"

typedef enum cn_snap_kind { CN_SNAP_KV = 1, CN_SNAP_STATE = 2, CN_SNAP_WINDOW = 3 } cn_snap_kind;
/* (DEVICE came last: the numbers of the others are older than it.) */
typedef enum cn_snap_tier {
    CN_SNAP_LIVE = 0,
    CN_SNAP_RAM = 1,
    CN_SNAP_DISK = 2,
    CN_SNAP_DEVICE = 3
} cn_snap_tier;

typedef struct cn_snap {
    cn_snap_kind kind;
    cn_snap_tier tier;
    int from, to;   /* KV: rows [from, to); STATE, WINDOW: from == to == offset */
    uint8_t *ram;   /* RAM tier: KV, WINDOW: K rows then V rows; STATE: conv bytes then SSM bytes;
                     * owned */
    void *dev;      /* DEVICE tier: the same layout in device memory; owned */
    cn_backend *be; /* the backend of dev and of a pinned ram (invariant 4) */
    int ram_pinned; /* ram came from cn_backend_buf_alloc(be, CN_BUF_HOST) */
    uint64_t fence; /* RAM: the last copy queued into or out of ram (0: none) */
    uint64_t bytes; /* materialized size */
    const cn_state *src; /* LIVE: the state whose rows [from, to) these are (not owned); the
                          * prefix cache keeps one live state per lane (prefix_cache.h) */
} cn_snap;

/* Byte sizes of one layer's pieces, from the live state. */
uint64_t cn_snap_kv_row_bytes(const cn_state *s, int layer); /* one row of K (V is the same) */
uint64_t cn_snap_state_bytes(const cn_state *s, int layer);  /* conv + ssm */

uint64_t cn_snap_window_bytes(const cn_state *s, int layer, int offset); /* K and V, min(o, W) rows */

/* A lazy KV snapshot of rows [from, to). NULL on ENOMEM. */
cn_snap *cn_snap_kv_lazy(const cn_state *s, int layer, int from, int to);
/* The functions that copy state out take `tier`, CN_SNAP_DEVICE or CN_SNAP_RAM: where the copy
 * should go. DEVICE falls back to RAM when the device buffer cannot be had (CN_ENOMEM), so the
 * caller reads the tier it got from the snapshot. */
/* A copy of a recurrent layer's current state at the live offset. */
int cn_snap_state_take(const cn_state *s, int layer, cn_snap_tier tier, cn_snap **out);
/* A recurrent snapshot from a forward's capture (j-th Mamba layer of rs). */
int cn_snap_state_from_capture(const cn_state *s, const cn_rsnap *rs, int j, cn_snap_tier tier,
                               cn_snap **out);
/* A copy of a sliding-window layer's window at the live offset. */
int cn_snap_window_take(const cn_state *s, int layer, cn_snap_tier tier, cn_snap **out);
/* A window snapshot from a forward's capture (w-th sliding-window layer of rs). */
int cn_snap_window_from_capture(const cn_state *s, const cn_rsnap *rs, int w, cn_snap_tier tier,
                                cn_snap **out);
/* Loads a window snapshot (DEVICE or RAM) into the live ring (the caller then sets the offset to
 * snap->to). */
int cn_snap_window_restore(cn_snap *snap, cn_state *s, int layer);
/* LIVE -> `tier`: copies the rows out of the live buffer. No-op for DEVICE and RAM; CN_EINVAL for
 * DISK. */
int cn_snap_materialize(cn_snap *snap, const cn_state *s, int layer, cn_snap_tier tier);
/* DEVICE -> RAM: queues the copy of the bytes into a new host buffer on the copy stream and
 * frees the device buffer behind it; returns without waiting (snap->fence). No-op for other
 * tiers. CN_ENOMEM (no host buffer) leaves it on the device. */
int cn_snap_to_host(cn_snap *snap);
/* Splits a KV snapshot at row `at` (from < at < to) into two new snapshots with the same tier
 * (a DISK one must be paged in first: CN_EINVAL). The input is left intact (caller frees it). A
 * DEVICE one splits on the device when there is room, else into RAM. */
int cn_snap_kv_split(const cn_snap *snap, const cn_state *s, int layer, int at, cn_snap **head,
                     cn_snap **tail);
/* Concatenates adjacent KV snapshots a = [x, y), b = [y, z) into a new one. Two LIVE give LIVE;
 * otherwise both must be DEVICE or both RAM (materialize or cn_snap_to_host first). */
int cn_snap_kv_concat(const cn_snap *a, const cn_snap *b, const cn_state *s, int layer,
                      cn_snap **out);
/* Writes rows [from, to) (inside the snapshot's range) into the live buffer. LIVE snapshots need
 * nothing (their rows are there). Restores queue their copies (a device copy, or an upload on the
 * copy stream that the next ops wait for) and return without waiting. */
int cn_snap_kv_restore(cn_snap *snap, cn_state *s, int layer, int from, int to);
/* Loads a recurrent snapshot (DEVICE or RAM) into the live layer. */
int cn_snap_state_restore(cn_snap *snap, cn_state *s, int layer);
/* Copies the snapshot's materialized bytes (KV, WINDOW: K rows then V rows; STATE: conv then SSM) into
 * host memory dst (snap->bytes of them): from the live buffer for LIVE, from the device for DEVICE,
 * from RAM for RAM; waits until they are there. CN_EINVAL for DISK. The snapshot is unchanged. */
int cn_snap_read(const cn_snap *snap, const cn_state *s, int layer, uint8_t *dst);
/* A DISK-tier snapshot: its bytes are in a node file (disk.h). NULL on ENOMEM. */
cn_snap *cn_snap_disk(cn_snap_kind kind, int from, int to, uint64_t bytes);
/* RAM -> DISK: frees the RAM copy (the caller made sure a node file holds the bytes). */
void cn_snap_page_out(cn_snap *snap);
/* DISK -> RAM: takes ownership of ram (snap->bytes of them, read back from the node file). */
void cn_snap_page_in(cn_snap *snap, uint8_t *ram);
void cn_snap_free(cn_snap *snap);

#endif
