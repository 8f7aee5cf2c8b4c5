/* trie.c - prefix trie structure; see trie.h. Hand-written: a radix trie over 64-bit keys with
 * per-node payload slots is a few hundred lines and no Debian library offers one. */
#include "cache/trie.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"

static cn_node *node_new(const cn_trie *t) {
    cn_node *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->slots = calloc((size_t)(t->n_layers ? t->n_layers : 1), sizeof *n->slots);
    if (!n->slots) {
        free(n);
        return NULL;
    }
    return n;
}

void cn_node_clear_slots(const cn_trie *t, cn_node *node) {
    for (int l = 0; l < t->n_layers; l++) {
        cn_snap_free(node->slots[l]);
        node->slots[l] = NULL;
    }
}

static void node_free_tree(const cn_trie *t, cn_node *n) {
    if (!n) return;
    for (int i = 0; i < n->n_child; i++) node_free_tree(t, n->child[i]);
    cn_node_clear_slots(t, n);
    free(n->slots);
    free(n->child);
    free(n->keys);
    free(n);
}

int cn_trie_init(cn_trie *t, int n_layers) {
    memset(t, 0, sizeof *t);
    t->n_layers = n_layers;
    t->root = node_new(t);
    return t->root ? CN_OK : CN_ENOMEM;
}

void cn_trie_free(cn_trie *t) {
    node_free_tree(t, t->root);
    t->root = NULL;
    t->n_nodes = 0;
}

static cn_node *find_child(const cn_node *n, cn_key first) {
    for (int i = 0; i < n->n_child; i++)
        if (n->child[i]->keys[0] == first) return n->child[i];
    return NULL;
}

cn_node *cn_trie_match(const cn_trie *t, const cn_key *keys, int n, int *matched) {
    cn_node *cur = t->root;
    int pos = 0;
    while (pos < n) {
        cn_node *c = find_child(cur, keys[pos]);
        if (!c) break;
        int k = 0;
        while (k < c->n_keys && pos + k < n && c->keys[k] == keys[pos + k]) k++;
        pos += k;
        cur = c;
        if (k < c->n_keys) break; /* ends inside this edge */
    }
    *matched = pos;
    return cur;
}

static int add_to_parent(cn_node *parent, cn_node *child) {
    if (parent->n_child == parent->cap_child) {
        int cap = parent->cap_child ? 2 * parent->cap_child : 2;
        cn_node **p = realloc(parent->child, (size_t)cap * sizeof *p);
        if (!p) return CN_ENOMEM;
        parent->child = p;
        parent->cap_child = cap;
    }
    parent->child[parent->n_child++] = child;
    child->parent = parent;
    return CN_OK;
}

static void remove_from_parent(cn_node *parent, cn_node *child) {
    for (int i = 0; i < parent->n_child; i++)
        if (parent->child[i] == child) {
            parent->child[i] = parent->child[--parent->n_child];
            return;
        }
}

cn_node *cn_trie_add_child(cn_trie *t, cn_node *parent, const cn_key *keys, int n) {
    if (n <= 0 || find_child(parent, keys[0])) return NULL;
    cn_node *c = node_new(t);
    if (!c) return NULL;
    c->keys = malloc((size_t)n * sizeof *c->keys);
    if (!c->keys || add_to_parent(parent, c)) {
        node_free_tree(t, c);
        return NULL;
    }
    memcpy(c->keys, keys, (size_t)n * sizeof *keys);
    c->n_keys = n;
    c->end = parent->end + n;
    c->last_used = t->clock;
    t->n_nodes++;
    return c;
}

cn_node *cn_trie_split(cn_trie *t, cn_node *node, int at) {
    int start = cn_node_start(node), h = at - start;
    if (node == t->root || h <= 0 || h >= node->n_keys) return NULL;
    cn_node *head = node_new(t);
    cn_key *tail_keys = malloc((size_t)(node->n_keys - h) * sizeof *tail_keys);
    cn_key *head_keys = malloc((size_t)h * sizeof *head_keys);
    cn_node **kids = malloc(sizeof *kids);
    if (!head || !tail_keys || !head_keys || !kids) {
        node_free_tree(t, head);
        free(tail_keys);
        free(head_keys);
        free(kids);
        return NULL;
    }
    memcpy(head_keys, node->keys, (size_t)h * sizeof *head_keys);
    memcpy(tail_keys, node->keys + h, (size_t)(node->n_keys - h) * sizeof *tail_keys);
    cn_node *parent = node->parent;
    for (int i = 0; i < parent->n_child; i++)
        if (parent->child[i] == node) parent->child[i] = head;
    head->parent = parent;
    head->keys = head_keys;
    head->n_keys = h;
    head->end = at;
    head->last_used = node->last_used;
    head->child = kids;
    head->cap_child = 1;
    head->n_child = 1;
    kids[0] = node;
    node->parent = head;
    free(node->keys);
    node->keys = tail_keys;
    node->n_keys -= h;
    t->n_nodes++;
    return head;
}

int cn_trie_merge_child(cn_trie *t, cn_node *node) {
    if (node == t->root || node->n_child != 1) return CN_EINVAL;
    cn_node *c = node->child[0];
    cn_key *keys = realloc(node->keys, (size_t)(node->n_keys + c->n_keys) * sizeof *keys);
    if (!keys) return CN_ENOMEM;
    memcpy(keys + node->n_keys, c->keys, (size_t)c->n_keys * sizeof *keys);
    node->keys = keys;
    node->n_keys += c->n_keys;
    node->end = c->end;
    free(node->child);
    node->child = c->child;
    node->n_child = c->n_child;
    node->cap_child = c->cap_child;
    for (int i = 0; i < node->n_child; i++) node->child[i]->parent = node;
    free(node->slots);
    node->slots = c->slots;
    node->user = c->user;
    node->disk_id = c->disk_id;
    if (c->last_used > node->last_used) node->last_used = c->last_used;
    free(c->keys);
    free(c);
    t->n_nodes--;
    return CN_OK;
}

int cn_trie_remove_leaf(cn_trie *t, cn_node *node) {
    if (node == t->root || node->n_child) return CN_EINVAL;
    remove_from_parent(node->parent, node);
    node_free_tree(t, node);
    t->n_nodes--;
    return CN_OK;
}

static int walk(cn_node *n, int (*fn)(cn_node *, void *), void *ctx) {
    for (int i = 0; i < n->n_child; i++) {
        int r = fn(n->child[i], ctx);
        if (r) return r;
        r = walk(n->child[i], fn, ctx);
        if (r) return r;
    }
    return 0;
}

int cn_trie_walk(const cn_trie *t, int (*fn)(cn_node *n, void *ctx), void *ctx) {
    return walk(t->root, fn, ctx);
}

static int check_node(const cn_node *n, int *count) {
    for (int i = 0; i < n->n_child; i++) {
        const cn_node *c = n->child[i];
        if (c->parent != n || c->n_keys <= 0 || c->end != n->end + c->n_keys) return 0;
        for (int j = 0; j < i; j++)
            if (n->child[j]->keys[0] == c->keys[0]) return 0;
        (*count)++;
        if (!check_node(c, count)) return 0;
    }
    return 1;
}

int cn_trie_check(const cn_trie *t) {
    if (!t->root || t->root->end != 0 || t->root->n_keys != 0) return 0;
    int count = 0;
    return check_node(t->root, &count) && count == t->n_nodes;
}
