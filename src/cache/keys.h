/* keys.h - the key alphabet of the prefix trie: tokens, token pairs, media folds.
 *
 * Without a draft cache, key i is token i. With a draft cache that looks one token ahead, key i
 * packs (token i, token i+1), so matching k keys verifies k+1 tokens and every match is a valid
 * restore point for target and draft caches alike; n tokens then give n-1 keys. Media placeholders
 * repeat one token id, so each media item's expansion range is replaced, in the keys only, by a
 * fold of its bytes and preprocessing shape with bit 31 set, a bit no token id has. The model
 * still sees the real ids. Building keys never fails except for bad arguments.
 */
#ifndef CN_KEYS_H
#define CN_KEYS_H

#include <stddef.h>
#include <stdint.h>

typedef uint64_t cn_key;

#define CN_KEY_FOLD_BIT 0x80000000u

/* One media item of a request: its expansion occupies tokens [pos, pos + len). */
typedef struct cn_media_item {
    int pos, len;
    const void *data;    /* the item's raw bytes */
    size_t nbytes;
    const int64_t *dims; /* preprocessing shape (e.g. patches, height, width); may be NULL */
    int n_dims;
} cn_media_item;

/* The 32-bit fold of a media item (bit 31 always set). */
uint32_t cn_media_fold(const cn_media_item *m);

/* Number of keys n tokens give with this lookahead (0 or 1). */
static inline int cn_keys_count(int n_tokens, int lookahead) {
    return n_tokens > lookahead ? n_tokens - lookahead : 0;
}

/* Writes cn_keys_count(n, lookahead) keys into out. Media items (sorted, non-overlapping, inside
 * [0, n)) are folded first. Returns 0, or -1 for bad arguments (out untouched). */
int cn_keys_build(const int32_t *tokens, int n, const cn_media_item *media, int n_media,
                  int lookahead, cn_key *out);

#endif
