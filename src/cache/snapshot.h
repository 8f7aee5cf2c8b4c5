/* snapshot.h - one layer's saved state: a KV row range, a whole recurrent state or a whole window.
 *
 * A full-attention snapshot is the K/V rows [from, to) of one layer. It starts LIVE (lazy): a
 * reference into the live buffer that costs nothing, valid while those rows are untouched; it is
 * copied out (materialized) into host RAM before the rows are overwritten. A recurrent snapshot is
 * the conv tail and SSM state at one offset (from == to), always a copy. A window snapshot (a
 * sliding-window layer) is the K/V rows of positions [o - n, o), n = min(o, W), at one offset o
 * (from == to == o), oldest first, always a copy: the ring overwrites its rows as it slides, so a
 * lazy reference would not last. Snapshots in the DISK tier have their bytes in a cache file
 * (disk.h) and none in memory.
 *
 * Invariants:
 *  (1) A LIVE snapshot's rows equal the live buffer's rows [from, to), and to <= the live offset.
 *  (2) bytes is the size the snapshot has when materialized; LIVE snapshots count 0 in budgets.
 *  (3) Functions that fail leave the snapshot as it was.
 */
#ifndef CN_SNAPSHOT_H
#define CN_SNAPSHOT_H

#include <stdint.h>

#include "model/state.h"

typedef enum cn_snap_kind { CN_SNAP_KV = 1, CN_SNAP_STATE = 2, CN_SNAP_WINDOW = 3 } cn_snap_kind;
typedef enum cn_snap_tier { CN_SNAP_LIVE = 0, CN_SNAP_RAM = 1, CN_SNAP_DISK = 2 } cn_snap_tier;

typedef struct cn_snap {
    cn_snap_kind kind;
    cn_snap_tier tier;
    int from, to;   /* KV: rows [from, to); STATE, WINDOW: from == to == offset */
    uint8_t *ram;   /* RAM tier: KV, WINDOW: K rows then V rows; STATE: conv bytes then SSM bytes;
                     * owned */
    uint64_t bytes; /* materialized size */
} cn_snap;

/* Byte sizes of one layer's pieces, from the live state. */
uint64_t cn_snap_kv_row_bytes(const cn_state *s, int layer); /* one row of K (V is the same) */
uint64_t cn_snap_state_bytes(const cn_state *s, int layer);  /* conv + ssm */

uint64_t cn_snap_window_bytes(const cn_state *s, int layer, int offset); /* K and V, min(o, W) rows */

/* A lazy KV snapshot of rows [from, to). NULL on ENOMEM. */
cn_snap *cn_snap_kv_lazy(const cn_state *s, int layer, int from, int to);
/* A copy of a recurrent layer's current state at the live offset. */
int cn_snap_state_take(const cn_state *s, int layer, cn_snap **out);
/* A recurrent snapshot from a forward's capture (j-th Mamba layer of rs), copied to RAM. */
int cn_snap_state_from_capture(const cn_state *s, const cn_rsnap *rs, int j, cn_snap **out);
/* A copy of a sliding-window layer's window at the live offset. */
int cn_snap_window_take(const cn_state *s, int layer, cn_snap **out);
/* A window snapshot from a forward's capture (w-th sliding-window layer of rs), copied to RAM. */
int cn_snap_window_from_capture(const cn_state *s, const cn_rsnap *rs, int w, cn_snap **out);
/* Loads a window snapshot into the live ring (the caller then sets the offset to snap->to). */
int cn_snap_window_restore(const cn_snap *snap, cn_state *s, int layer);
/* LIVE -> RAM: copies the rows out of the live buffer. No-op for RAM; CN_EINVAL for DISK. */
int cn_snap_materialize(cn_snap *snap, const cn_state *s, int layer);
/* Splits a KV snapshot at row `at` (from < at < to) into two new snapshots with the same tier
 * (a DISK one must be paged in first: CN_EINVAL). The input is left intact (caller frees it). */
int cn_snap_kv_split(const cn_snap *snap, const cn_state *s, int layer, int at, cn_snap **head,
                     cn_snap **tail);
/* Concatenates adjacent KV snapshots a = [x, y), b = [y, z) into a new one. Two LIVE give LIVE;
 * otherwise both must be RAM (materialize first). */
int cn_snap_kv_concat(const cn_snap *a, const cn_snap *b, const cn_state *s, int layer,
                      cn_snap **out);
/* Writes rows [from, to) (inside the snapshot's range) into the live buffer. LIVE snapshots need
 * nothing (their rows are there). */
int cn_snap_kv_restore(const cn_snap *snap, cn_state *s, int layer, int from, int to);
/* Loads a recurrent snapshot into the live layer. */
int cn_snap_state_restore(const cn_snap *snap, cn_state *s, int layer);
/* Copies the snapshot's materialized bytes (KV, WINDOW: K rows then V rows; STATE: conv then SSM) into
 * dst (snap->bytes of them): from the live buffer for LIVE, from RAM for RAM. CN_EINVAL for DISK.
 * The snapshot is unchanged. */
int cn_snap_read(const cn_snap *snap, const cn_state *s, int layer, uint8_t *dst);
/* A DISK-tier snapshot: its bytes are in a node file (disk.h). NULL on ENOMEM. */
cn_snap *cn_snap_disk(cn_snap_kind kind, int from, int to, uint64_t bytes);
/* RAM -> DISK: frees the RAM copy (the caller made sure a node file holds the bytes). */
void cn_snap_page_out(cn_snap *snap);
/* DISK -> RAM: takes ownership of ram (snap->bytes of them, read back from the node file). */
void cn_snap_page_in(cn_snap *snap, uint8_t *ram);
void cn_snap_free(cn_snap *snap);

#endif
