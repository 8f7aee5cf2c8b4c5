/* trie.h - the prefix trie of restore points: compressed edges of keys, one snapshot slot per
 * layer on every node.
 *
 * This module owns the structure only: nodes, edges, matching, splitting and merging of edges and
 * the bookkeeping fields. What a snapshot slot holds, and how slots split and merge with their
 * edges, is decided by the prefix cache (prefix_cache.c), which owns the policy.
 *
 * Invariants (checked by cn_trie_check):
 *  (1) The root has an empty edge and end 0; every other node has a non-empty edge and
 *      end == parent->end + n_keys.
 *  (2) Sibling edges never share a first key.
 *  (3) A node's slots array has n_layers entries (NULL where nothing is stored).
 */
#ifndef CN_TRIE_H
#define CN_TRIE_H

#include <stdint.h>

#include "cache/keys.h"
#include "cache/snapshot.h"

typedef struct cn_node {
    struct cn_node *parent;
    struct cn_node **child;  /* [n_child] */
    int n_child, cap_child;
    cn_key *keys;            /* [n_keys] the edge from parent */
    int n_keys;
    int end;                 /* offset at the end of the edge */
    uint64_t last_used;      /* logical clock of the last request that used this node */
    int user;                /* explicit restore point: resists merging */
    cn_snap **slots;         /* [n_layers] owned */
    uint64_t disk_id;        /* nonzero: the slots' bytes live in the disk tier under this id */
} cn_node;

typedef struct cn_trie {
    cn_node *root;
    int n_layers;
    int n_nodes;        /* excluding the root */
    uint64_t clock;     /* advanced once per request */
} cn_trie;

static inline int cn_node_start(const cn_node *n) { return n->end - n->n_keys; }

int cn_trie_init(cn_trie *t, int n_layers);
/* Frees every node and slot. */
void cn_trie_free(cn_trie *t);

/* Deepest match of keys[0..n): returns the node whose edge contains the last matched key (or the
 * root) and sets *matched (0..n). A match may end inside that node's edge. */
cn_node *cn_trie_match(const cn_trie *t, const cn_key *keys, int n, int *matched);

/* A new child of parent with edge keys[0..n) (copied). NULL on ENOMEM, or when a sibling already
 * starts with keys[0] (CN_EINVAL would be a bug in the caller). Slots start empty. */
cn_node *cn_trie_add_child(cn_trie *t, cn_node *parent, const cn_key *keys, int n);

/* Splits node's edge at absolute offset `at` (start < at < end): a new node takes the head
 * [start, at) and becomes node's parent. Slots stay on node; the head's start empty.
 * Returns the head, or NULL on ENOMEM (trie unchanged). */
cn_node *cn_trie_split(cn_trie *t, cn_node *node, int at);

/* Merges node's only child into node: the edge grows, the child's children, slots (node's own
 * slots must have been freed or moved by the caller: they are overwritten), user flag and disk id
 * move up, the child is freed. Returns 0, CN_EINVAL if node is the root or has != 1 child, or
 * CN_ENOMEM (trie unchanged). */
int cn_trie_merge_child(cn_trie *t, cn_node *node);

/* Removes a leaf (slots freed). CN_EINVAL for the root or a node with children. */
int cn_trie_remove_leaf(cn_trie *t, cn_node *node);

/* Frees the node's slots (sets them NULL). */
void cn_node_clear_slots(const cn_trie *t, cn_node *node);

/* Depth-first visit of every node except the root; fn returns nonzero to stop. */
int cn_trie_walk(const cn_trie *t, int (*fn)(cn_node *n, void *ctx), void *ctx);

/* 1 when the invariants hold (for assert and tests). */
int cn_trie_check(const cn_trie *t);

#endif
