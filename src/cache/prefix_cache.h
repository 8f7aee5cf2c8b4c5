/* prefix_cache.h - restore points for hybrid models: the trie, the live caches, and the policy
 * that moves state between them (DESIGN.md §2).
 *
 * One prefix cache per loaded model wraps one trie of restore points and the live caches its
 * requests run in: one lane (a cn_state, and the draft's) per request that may run at once, every
 * lane beginning from the one trie and closing into it. A request's life, drawn as transitions:
 *
 *     IDLE --cn_pc_begin--> PREFILL --cn_pc_absorbed (per forward)--> PREFILL
 *     PREFILL --cn_pc_commit (after a chunk)--> PREFILL   (captures passed become nodes now)
 *     PREFILL/DECODE --cn_pc_close--> IDLE      (on success, error AND cancellation)
 *
 * begin finds the deepest match, restores the live caches to the deepest offset every layer can
 * reach exactly (rewinding what can be rewound, paging in snapshots, never guessing), always
 * leaves at least one token to evaluate, and schedules captures: at the branch point when it lands
 * below the match, every `spacing` tokens, and `pre_end` tokens before the prompt's end. close
 * attaches every capture the forwards crossed as trie nodes, then records the segment the caches
 * rest at with its own snapshots, so a cancelled prompt's retry resumes where it stopped.
 *
 * A draft cache (cn_pc_attach_draft: the MTP head's own attention layers) rides in the same trie:
 * its layers get slots after the target's, and the keys become token pairs (keys.h, lookahead
 * 1): key i packs (token i, token i+1), the draft's slot i fuses the target's hidden at i with
 * token i+1, so a node ending at offset o is a restore point for both: the target has absorbed
 * tokens [0, o), the draft slots [0, o), and the o keys name tokens [0, o]. The trie level, the
 * target offset and the draft offset are one number at begin and at close; in between the target
 * runs one token ahead of the draft while the token that closes its last pair is unknown. A
 * request that closes with the target ahead of its draft (it ended with no token to close the
 * pair: an error) records the level the draft reached; the live recurrent state is then marked
 * stale and the next begin restores it from a snapshot instead of trusting it.
 *
 * Invariants (checked by cn_pc_check):
 *  (1) Attention snapshots span exactly their node's edge; whole-state ones (recurrent, windows)
 *      sit only at node ends.
 *  (2) Every LIVE snapshot lies within the live keys: its rows are the live buffer's rows.
 *  (3) ram_bytes equals the sum of the sizes of RAM-tier snapshots, dev_bytes that of DEVICE-tier
 *      ones.
 *  (4) Eviction never removes the active path (the frontier's ancestors, and during a request
 *      the pinned node's) nor a node with several children.
 *  (5) With a disk tier: a node with a file (disk_id != 0) has one written or queued that holds
 *      exactly its key path, edge and current slots; every DISK-tier slot belongs to such a node;
 *      disk_bytes equals the sum of the slot sizes of those nodes.
 *  (6) A node's slots never change while it has a file: split, merge, a new capture or a healed
 *      gap first page the node in and retire its file; it is written again at the next commit
 *      or close.
 *
 * Tiers (snapshot.h draws a snapshot's life). LIVE slots cost nothing; DEVICE slots count against
 * dev_budget, RAM slots against ram_budget; with a disk tier attached (cn_pc_attach_disk) every node is also written to disk at
 * the commit or close that creates or changes it, cancelled requests included (the request only copies its
 * bytes to the writer), so the disk holds every restore point and RAM the recently used ones.
 * Eviction runs in bounded steps (cn_pc_evict_step): a few nodes at close, the rest between
 * forwards and while the server is idle, so no request waits on a large one; a tier may exceed
 * its budget for that while.
 * Over the RAM budget, the least recently used nodes are paged out: RAM freed, the node keeps its
 * place in the trie, its slots become DISK (the active path's too, as nothing leaves the trie).
 * Over the disk budget, nodes are dropped from every tier in the order and with the protections
 * of RAM-only eviction. begin pages in the DISK nodes a restore needs; a file that fails
 * verification is reported, moved aside, and its restore point treated as absent, so the restore
 * lands at a shallower point. A restart rebuilds the trie from the files.
 *
 * The device tier. With a dev_budget (cairn's commands give CN_PC_DEV_BUDGET on a backend with
 * device memory unless told otherwise) every copy of state the cache takes goes to device memory first: a forward's
 * captures, a close's whole states, KV rows materialized before they are overwritten. Those are
 * device-to-device copies queued behind the forward, so neither the host nor the host link is in
 * the way of the next forward. Over dev_budget, the least recently used nodes' device bytes move
 * to (pinned) RAM, one node per round of the same bounded steps: the copies are queued on the
 * backend's copy stream and nothing waits for them; a RAM snapshot whose copy is still in flight
 * is waited for only by what reads or frees its bytes (its file write, a page-out, a restore, a
 * split or merge). From RAM the usual policy pages to disk. A restore reads DEVICE slots with a
 * device copy and RAM slots (paged in from disk first when needed) with an upload on the copy
 * stream that the next forward waits for on the device, not the host. On a backend without
 * device memory (the CPU) the tier is off unless dev_budget asks for it; its "device" buffers are
 * then host memory and only the accounting differs from RAM (tests run the policy there).
 * Device and RAM fill with the same eviction order (least recently used, then deepest, then
 * largest), so DEVICE holds the most recently used restore points, RAM the next, disk the rest.
 */
#ifndef CN_PREFIX_CACHE_H
#define CN_PREFIX_CACHE_H

#include <stdint.h>

#include "base/error.h"
#include "cache/keys.h"
#include "cache/trie.h"
#include "model/model.h"
#include "model/state.h"

/* The device tier's budget the commands use on a GPU when not told otherwise. */
#define CN_PC_DEV_BUDGET ((uint64_t)1 << 30)
/* The RAM tier's budget when not told otherwise. */
#define CN_PC_RAM_BUDGET ((uint64_t)4 << 30)

typedef struct cn_pc_opts {
    int spacing;          /* a restore point every `spacing` tokens of prefill (0: 1024) */
    int pre_end;          /* and one this many tokens before the prompt's end (default 4; -1 none) */
    uint64_t ram_budget;  /* bytes of RAM-tier snapshots kept (0: 4 GiB) */
    int evict_steps;      /* nodes paged out or evicted at most per close (0: 8); the rest is
                           * left to cn_pc_evict_step between forwards or when idle */
    uint64_t dev_budget;  /* bytes of DEVICE-tier snapshots kept (0: no device tier; the
                           * commands default to CN_PC_DEV_BUDGET on a GPU) */
} cn_pc_opts;

typedef enum cn_layer_kind {
    CN_LAYER_NONE = 0,
    CN_LAYER_KV,        /* full attention: append-only rows, snapshots are row ranges */
    CN_LAYER_RECURRENT, /* Mamba2: whole-state snapshots at node ends */
    CN_LAYER_WINDOW,    /* sliding-window attention: whole-window snapshots at node ends; the live
                         * ring rewinds only while it has not wrapped */
} cn_layer_kind;

/* One set of live caches the trie's requests run in: the target's state and the draft's, with
 * what they hold. Lane 0 is cn_pc_init's; cn_pc_add_lane adds more, one per request that may run
 * at once. A LIVE snapshot belongs to the lane whose state holds its rows (cn_snap.src). */
typedef struct cn_pc_lane {
    cn_state *live;          /* the live caches; not owned */
    cn_state *draft;         /* (with a draft) the draft head's live caches; not owned */
    int live_stale;          /* 1: the live whole state (recurrent, windows) is not at
                              * live->offset (see above);
                              * a caller whose forward failed sets it before cn_pc_close */
    cn_key *live_keys;       /* [live->offset] keys of what the live caches hold */
    int cap_live_keys;
    cn_node *frontier;       /* where the live caches rested at the last close (root at start) */
    cn_node *pinned;         /* during a request: the deepest node of its match, protected from
                              * eviction with its ancestors as the frontier is; NULL otherwise */
} cn_pc_lane;

typedef struct cn_prefix_cache {
    cn_trie trie;            /* slots: the target's layers, then the draft's */
    cn_pc_lane *lanes;       /* [n_lanes]; lanes[0] from cn_pc_init */
    int n_lanes;
    int lookahead;           /* 1 with a draft (pair keys), else 0 */
    cn_pc_opts o;
    cn_layer_kind *kind;     /* [n_layers] of the trie: target layers, then draft layers */
    int n_kv, n_rec, n_win;
    uint64_t ram_bytes;      /* RAM-tier snapshot bytes (invariant 3) */
    uint64_t dev_bytes;      /* DEVICE-tier snapshot bytes (invariant 3) */
    struct cn_disk *disk;    /* (optional) the disk tier (disk.h); owned */
    uint64_t disk_budget;    /* bytes of snapshots kept in node files */
    uint64_t disk_bytes;     /* bytes of snapshots in node files (invariant 5) */
    /* counters for logs, benchmarks and tests */
    uint64_t n_evicted, n_restored_nodes;
    uint64_t n_paged_out, n_paged_in; /* RAM -> DISK and DISK -> RAM moves of a node */
    uint64_t n_to_host;      /* DEVICE -> RAM moves of a node */
    uint64_t n_disk_loaded;  /* nodes rebuilt from files at attach */
    uint64_t n_disk_skipped; /* files skipped at attach (each warned about) */
    uint64_t n_disk_failed;  /* page-ins that failed verification (each warned about) */
} cn_prefix_cache;

/* One crossed capture: the whole-state layers' state (recurrent, windows) at an offset. */
typedef struct cn_pc_capture {
    int offset;
    int user;         /* scheduled restore point (resists merging) */
    cn_snap **slots;  /* [n_layers], whole-state layers only */
} cn_pc_capture;

/* One request's view. Caller-allocated; cn_pc_session_free after close. */
typedef struct cn_pc_session {
    int lane;             /* the lane whose live caches it runs in */
    cn_key *keys;         /* [n_keys] prompt keys, then generated ones */
    int n_keys, cap_keys;
    int n_prompt;         /* keys of the prompt */
    int matched;          /* keys matched in the trie at begin */
    int restored;         /* offset the live caches were restored to (tokens not evaluated) */
    int *sched;           /* [n_sched] pending capture offsets, ascending, > restored */
    int *sched_user;
    int n_sched;
    cn_pc_capture *caps;  /* [n_caps] captures crossed so far (not yet in the trie's budget) */
    int n_caps, cap_caps;
    int n_layers;
} cn_pc_session;

int cn_pc_init(cn_prefix_cache *pc, cn_state *live, const cn_pc_opts *o);
/* Adds a draft cache (draft: the MTP head's state, same max_ctx as live) before the first
 * request and before the disk tier: keys become pairs. Returns 0, CN_EBUSY (the trie is not empty
 * or a tier is attached), CN_EUNSUPPORTED (the draft has recurrent layers: they could not be
 * rewound past a rejected draft), CN_EINVAL or CN_ENOMEM; on error nothing changes. */
int cn_pc_attach_draft(cn_prefix_cache *pc, cn_state *draft);
/* Adds a lane: live (and draft, exactly when lane 0 has one) of the same model and context as
 * lane 0's, reset to offset 0. Before or after requests, never during one on that lane. Returns
 * the lane's index, or CN_EINVAL (shapes that differ) or CN_ENOMEM. */
int cn_pc_add_lane(cn_prefix_cache *pc, cn_state *live, cn_state *draft);
/* Frees the trie; with a disk tier, first writes the nodes a full queue turned away (waiting for
 * room), keeps the disk budget, and waits for the writer to finish (files stay). */
void cn_pc_free(cn_prefix_cache *pc);

/* Adds the disk tier under dir for the model whose identity is model_id (cn_model_identity),
 * keeping at most budget bytes of snapshots there (0: 16 GiB). Must come before the first
 * request. Every file in the model's folder is verified; a corrupt, truncated, foreign or
 * mismatched file is skipped with a warning and moved aside ("<name>.bad"; files of a newer
 * format version are left alone), a file whose edge would split another stored node is skipped
 * with a warning and removed (a leftover of a rewrite a crash interrupted). The others become
 * DISK-tier nodes; where a file's parent is
 * missing, an empty node spans the gap (its rows are filled in by the next request that crosses
 * it). Returns 0, CN_EBUSY if the trie is not empty or a tier is attached, CN_EIO (err names the
 * folder) or CN_ENOMEM; on error nothing is attached. */
int cn_pc_attach_disk(cn_prefix_cache *pc, const char *dir, uint64_t model_id, uint64_t budget,
                      cn_err *err);
/* Waits until every queued file write is on disk. Returns how many writes failed so far. */
int cn_pc_flush(cn_prefix_cache *pc);

/* Starts a request over keys[0..n) (n >= 1; with pair keys n >= 0, a one-token prompt having no
 * key). On return the live caches (and the draft's) sit at sess->restored and the remaining
 * tokens must be forwarded: restored < n, or with pair keys restored <= n (the n keys name n + 1
 * tokens, the last of which is always evaluated). On error the session is empty and the live caches are at
 * offset 0 (nothing was guessed). */
int cn_pc_begin(cn_prefix_cache *pc, cn_pc_session *sess, const cn_key *keys, int n);
/* cn_pc_begin in lane `lane`'s live caches (cn_pc_begin is lane 0). One request at a time per
 * lane; requests in different lanes may interleave their calls (from one thread at a time). A
 * restore reads the trie's snapshots whatever lane took them: another lane's LIVE rows are
 * copied. */
int cn_pc_begin_on(cn_prefix_cache *pc, int lane, cn_pc_session *sess, const cn_key *keys, int n);

/* The capture offsets inside (from, to], for a forward over that range (at most max). */
int cn_pc_captures_in(const cn_pc_session *sess, int from, int to, int *out, int max);

/* After a forward that absorbed keys sess->keys[from..to) into the live caches and captured the
 * recurrent state at the offsets cn_pc_captures_in gave (caps, n_caps; ownership moves here). */
int cn_pc_absorbed(cn_prefix_cache *pc, cn_pc_session *sess, int from, int to, cn_rsnap *caps,
                   int n_caps);

/* Appends the key of a generated token (before it is forwarded); with pair keys the pair of the
 * previous token and this one. */
int cn_pc_push_key(cn_pc_session *sess, cn_key key);

/* Schedules a capture at offset off (> the live offset, at most the keys known) for the forwards
 * still to come; user: a restore point that resists merging. 0 or CN_ENOMEM. */
int cn_pc_schedule(cn_pc_session *sess, int off, int user);

/* Attaches, in the middle of a request, the captures every layer has passed (at or below the
 * lowest of the target offset, the draft offset and the keys pushed) as trie nodes with their
 * recurrent state, as close would, and with a disk tier queues their files at once: a process
 * killed later in the prefill restarts from the last restore point that reached the disk. The
 * request's path stays pinned (the deepest node attached now pins it). The caller calls it where
 * the draft is level (after a prefill chunk). 0, or CN_ENOMEM when a capture had to be dropped. */
int cn_pc_commit(cn_prefix_cache *pc, cn_pc_session *sess);

/* Ends the request (success, error or cancellation): attaches the crossed captures, records the
 * segment the live caches rest at, takes an eviction step (o.evict_steps nodes at most). With a draft, the level recorded is the
 * lowest of the target offset, the draft offset and the keys pushed; the caller settles the
 * draft first (closes its last pair) so that all three agree. */
int cn_pc_close(cn_prefix_cache *pc, cn_pc_session *sess);
void cn_pc_session_free(cn_pc_session *sess);

/* Forgets every restore point (deleting their files) and empties the live caches (offset 0). */
int cn_pc_reset(cn_prefix_cache *pc);

/* Moves device bytes to RAM until the device tier fits, pages out (with a disk tier) or evicts
 * until RAM fits its budget, and evicts until the disk
 * fits its own, all at once (attach, tests). Returns the number of nodes evicted (page-outs are
 * not evictions). */
int cn_pc_evict(cn_prefix_cache *pc);
/* The same in a bounded step: at most max_nodes page-outs or evictions, each one node's work.
 * Returns 1 while a tier is still over its budget (call again), 0 when both fit or nothing more
 * can go. Safe between the forwards of a request (its path is pinned) and between requests; the
 * invariants hold after every step. */
int cn_pc_evict_step(cn_prefix_cache *pc, int max_nodes);
/* 1 when a tier holds more than its budget. */
int cn_pc_over_budget(const cn_prefix_cache *pc);

/* Sum of RAM-tier snapshot bytes, recomputed by walking the trie (tests compare it to ram_bytes). */
uint64_t cn_pc_ram_bytes_walk(const cn_prefix_cache *pc);
/* Sum of DEVICE-tier snapshot bytes, walked (tests compare it to dev_bytes). */
uint64_t cn_pc_dev_bytes_walk(const cn_prefix_cache *pc);
/* Sum of the snapshot bytes of nodes that have a file (tests compare it to disk_bytes). */
uint64_t cn_pc_disk_bytes_walk(const cn_prefix_cache *pc);
/* 1 when the invariants hold. */
int cn_pc_check(const cn_prefix_cache *pc);

#endif
