/* keys.c - trie keys from tokens; see keys.h. The fold uses xxHash (Debian's libxxhash). */
#include "cache/keys.h"

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

uint32_t cn_media_fold(const cn_media_item *m) {
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, m->data, m->nbytes);
    for (int i = 0; i < m->n_dims; i++) {
        uint8_t le[8];
        uint64_t d = (uint64_t)m->dims[i];
        for (int b = 0; b < 8; b++) le[b] = (uint8_t)(d >> (8 * b));
        XXH3_64bits_update(&st, le, sizeof le);
    }
    uint64_t h = XXH3_64bits_digest(&st);
    return (uint32_t)(h ^ (h >> 32)) | CN_KEY_FOLD_BIT;
}

int cn_keys_build(const int32_t *tokens, int n, const cn_media_item *media, int n_media,
                  int lookahead, cn_key *out) {
    if (n < 0 || (n > 0 && !tokens) || lookahead < 0 || lookahead > 1 || n_media < 0) return -1;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0) return -1;
    int prev_end = 0;
    for (int j = 0; j < n_media; j++) {
        const cn_media_item *m = &media[j];
        if (m->pos < prev_end || m->len <= 0 || m->pos + m->len > n) return -1;
        prev_end = m->pos + m->len;
    }
    /* Symbol i: the token, or the fold of the media item covering it. */
    int nk = cn_keys_count(n, lookahead), j = 0;
    uint32_t fold = 0;
    int fold_end = -1;
    uint32_t prev = 0;
    for (int i = 0; i < n; i++) {
        while (j < n_media && media[j].pos + media[j].len <= i) j++;
        uint32_t sym = (uint32_t)tokens[i];
        if (j < n_media && media[j].pos <= i) {
            if (fold_end != media[j].pos + media[j].len) {
                fold = cn_media_fold(&media[j]);
                fold_end = media[j].pos + media[j].len;
            }
            sym = fold;
        }
        if (lookahead == 0) out[i] = sym;
        else if (i > 0 && i - 1 < nk) out[i - 1] = ((cn_key)prev << 32) | sym;
        prev = sym;
    }
    return 0;
}
