/* disk.h - the disk tier of the prefix cache: one checksummed file per trie node, written by a
 * background thread, verified on every read, surviving a restart.
 *
 * Files live in <cache-dir>/<model-id as 16 hex digits>/<node-id as 16 hex digits>.cnsnap. A file
 * holds one node: its whole key path from the root (so the trie can be rebuilt after a restart),
 * its start offset, its user flag, one slot table entry per layer and the slots' bytes. The node
 * id is a hash of the key path, so a node rewritten after a change keeps its file name and the
 * rename replaces the old file atomically.
 *
 * What this module promises: a request hands over a finished file image (a copy in RAM, built by
 * the caller) and returns at once; the writer thread checksums, writes to a temporary name,
 * fsyncs and renames, so a crash leaves either the old file or the new one, never a torn one.
 * A read of a node whose write is still queued is served from the queued image. Every file read
 * is checked before any byte of it is used: magic, format version, model identity, sizes, the
 * xxh64 of everything before the trailer, and (for page-in) the key path and slot table the
 * caller expects; a file that fails is reported with its path, never loaded.
 * What it never does: decide which nodes to write or drop (the prefix cache does), block a
 * submitting thread on I/O, or touch files outside its model's folder.
 *
 * File format, versions 1 and 2, every integer little-endian. Version 2 is written for a trie
 * with a draft cache: its keys are token pairs and its slot table lists the target's layers and
 * then the draft head's (flags bit 1 says so); version 1 files have token keys and the target's
 * layers only, and are written as before when there is no draft.
 *
 *     offset        size     field
 *     0             8        magic "CAIRNSNP"
 *     8             4        format version (1 or 2)
 *     12            4        header bytes H = 48 + 8*end + 24*n_layers (the payload starts here)
 *     16            8        model identity (cn_model_identity)
 *     24            8        node id = cn_disk_node_id(keys, end); also the file name
 *     32            4        start offset (the parent's end when written)
 *     36            4        end offset = number of keys in the path
 *     40            4        flags: bit 0 = user restore point; bit 1 = pair keys, draft layers
 *                            after the target's (version 2 only, and always set there)
 *     44            4        n_layers (target layers, plus the draft's with bit 1)
 *     48            8*end    keys[0..end): the key path from the root
 *     48+8*end      24*L     slot table, per layer: u32 kind (0 none, 1 KV, 2 STATE, 3 WINDOW),
 *                            i32 from, i32 to, u32 reserved (0), u64 bytes
 *                            (kind 3 came without a version bump: only models with sliding-window
 *                            layers write it, and a build without kind 3 cannot load such a model,
 *                            so it never scans their folder)
 *     H             P        payload: each present slot's bytes, in layer order (P = sum of bytes)
 *     H+P           8        xxh64 (seed 0) of bytes [0, H+P)
 *
 * The life of one layer snapshot across the host tiers (cn_snap.tier; transitions in
 * prefix_cache.c; snapshot.h adds the DEVICE tier in front of RAM, whose bytes reach a file the
 * same way as LIVE rows do, copied out when the node is written):
 *
 *     forward writes KV rows          capture / close take recurrent state
 *              |                                  |
 *              v                                  v
 *          +------+      materialize          +------+        page_out          +------+
 *          | LIVE | ------------------------> | RAM  | -----------------------> | DISK |
 *          +------+   (its rows are about     +------+   (RAM freed; the node's  +------+
 *                      to be overwritten)        ^        file is written first     |  ^
 *                                                |        if it has none)           |  |
 *                                                +----------------------------------+  |
 *                                                  page_in: read + verify              |
 *                                                  (begin, split, merge)               |
 *                                                                                      |
 *                                                 attach after a restart: a verified file
 *
 *     node_write (at close, page_out, shutdown) copies a node's LIVE rows and RAM bytes into an
 *     image for the writer thread; the slots keep their tiers. Any tier --drop (evict, merge,
 *     page-in failure)--> freed, the node's file removed or moved aside.
 *
 * Invariants:
 *  (1) A file under a final name is complete: written under a temporary name, fsynced, renamed.
 *  (2) Submissions, removals and queued reads of one id are served in submission order.
 *  (3) The queue never holds more than queue_limit bytes, except one image larger than the limit
 *      when the queue is otherwise empty; a submission that does not fit is refused (CN_EBUSY)
 *      rather than waited for.
 *  (4) No byte of a file reaches a caller unless the whole file verified.
 */
#ifndef CN_DISK_H
#define CN_DISK_H

#include <stdint.h>

#include "base/error.h"
#include "cache/keys.h"

#define CN_DISK_VERSION 2 /* the newest this build reads; version 1 is still read and written */
#define CN_DISK_EXT ".cnsnap"

typedef struct cn_disk cn_disk; /* layout: disk.c */

/* One slot table entry. kind 0 (absent), 1 (KV rows [from, to)), 2 (recurrent state at to),
 * 3 (a sliding window at to: K then V of its last min(to, W) positions). */
typedef struct cn_disk_slot {
    int kind;
    int from, to;
    uint64_t bytes;
} cn_disk_slot;

/* A node file's header, parsed (cn_disk_node_free) or given by a caller (then keys/slots are the
 * caller's). */
typedef struct cn_disk_node {
    uint64_t model_id, id;
    int start, end;          /* the edge [start, end); end keys in the path */
    int user;
    int pairs;               /* 1: pair keys and draft layers (version 2) */
    int n_layers;
    cn_key *keys;            /* [end] */
    cn_disk_slot *slots;     /* [n_layers] */
    uint64_t payload_bytes;  /* sum of slot bytes */
    uint64_t file_bytes;     /* H + payload + 8 */
    int64_t mtime;           /* seconds; from the file system (scan only) */
} cn_disk_node;

void cn_disk_node_free(cn_disk_node *n);

/* The id of the node whose key path is keys[0..n): xxh64 of the little-endian keys, seeded with
 * n, never 0. */
uint64_t cn_disk_node_id(const cn_key *keys, int n);

/* "<root>/<model id hex>" into buf. */
void cn_disk_model_dir(const char *root, uint64_t model_id, char *buf, int size);

/* Opens the tier for one model under root (creating root and the model's folder), removes the
 * temporary files of writers that died mid-write, and starts the writer thread. queue_limit: bytes of images waiting to be written (0: 256 MiB). Errors name the
 * folder (CN_EIO, CN_ENOMEM). */
int cn_disk_open(cn_disk **out, const char *root, uint64_t model_id, uint64_t queue_limit,
                 cn_err *err);
/* Waits for the queue to drain, stops the writer, frees. Files stay. */
void cn_disk_close(cn_disk *d);
/* Waits until every queued write and removal is done. Returns the number of writes that failed
 * since open (each was logged). */
int cn_disk_flush(cn_disk *d);
/* The model folder ("<root>/<id hex>"). */
const char *cn_disk_dir(const cn_disk *d);

/* ---- writing ------------------------------------------------------------------------------- */

typedef struct cn_disk_blob cn_disk_blob; /* a file image being built */

/* A new image for the node described by hdr (start, end, user, n_layers, slots; keys and ids are
 * ignored: set the keys with cn_disk_blob_set_key). NULL on ENOMEM or a bad table. */
cn_disk_blob *cn_disk_blob_new(const cn_disk *d, const cn_disk_node *hdr);
void cn_disk_blob_set_key(cn_disk_blob *b, int i, cn_key key);
/* Where layer l's bytes go (hdr->slots[l].bytes of them); NULL for an absent slot. */
uint8_t *cn_disk_blob_slot(cn_disk_blob *b, int layer);
void cn_disk_blob_free(cn_disk_blob *b);

/* Queues the image for writing and takes it (freed here on every path). *id receives the node
 * id. CN_EBUSY when the queue is full (nothing queued). Never waits on I/O. */
int cn_disk_submit(cn_disk *d, cn_disk_blob *b, uint64_t *id);
/* Queues the removal of node id's file; queued writes of that id not yet started are dropped. */
int cn_disk_remove(cn_disk *d, uint64_t id);
/* Moves node id's file aside to "<name>.bad" now (a file that failed verification: kept for a
 * human to look at, never read again). */
void cn_disk_quarantine(cn_disk *d, uint64_t id);
/* The same for a file found by cn_disk_scan. */
void cn_disk_set_aside(const char *path);

/* ---- reading ------------------------------------------------------------------------------- */

/* Reads node id: from the queued image if its write is pending, else from its file, verified.
 * expect gives what the caller holds (start, end, user ignored, n_layers, keys, slots): the
 * file must match it exactly. For each layer with want[l], out[l] receives a malloc'd copy of
 * that slot's bytes (caller frees). Returns 0, or CN_ENOENT / CN_EIO / CN_ETRUNC / CN_EFORMAT /
 * CN_EUNSUPPORTED (newer format) with err naming the file; out untouched on error. */
int cn_disk_read(cn_disk *d, uint64_t id, const cn_disk_node *expect, const int *want,
                 uint8_t **out, cn_err *err);

/* Verifies every "*.cnsnap" file in a model folder (dir) and calls fn once per file, in no
 * particular order, with the parsed header (valid only during the call) or NULL and the reason.
 * A file is valid when it verifies completely and carries model_id. Temporary files of a writer
 * are ignored; "*.bad" files are counted in *n_bad (optional). Returns 0 or CN_EIO/CN_ENOENT if
 * the folder cannot be listed. */
typedef void (*cn_disk_scan_fn)(void *ctx, const char *path, const cn_disk_node *node, int rc,
                                const char *why);
int cn_disk_scan(const char *dir, uint64_t model_id, cn_disk_scan_fn fn, void *ctx, int *n_bad,
                 cn_err *err);

#endif
