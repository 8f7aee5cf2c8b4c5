/* token_bytes.c - the per-model table of token bytes; see token_bytes.h. */
#include "text/token_bytes.h"

#include <stdlib.h>
#include <string.h>

void cn_token_bytes_free(cn_token_bytes *tb) {
    if (!tb) return;
    free(tb->pool);
    free(tb->off);
    free(tb->len);
    free(tb->nchars);
    free(tb->flags);
    free(tb);
}

/* The CN_TB_PLAIN / CN_TB_RAW flags of s[0, n), counting characters into *nc. */
static int classify(const unsigned char *s, size_t n, uint32_t *nc) {
    uint32_t c = 0;
    int plain = CN_TB_PLAIN | CN_TB_RAW;
    if (n == 0) return 0;
    for (size_t i = 0; i < n;) {
        unsigned b = s[i];
        if (b < 0x20 || b == '"' || b == '\\' || b == 0x7f) plain &= ~CN_TB_PLAIN;
        if (b == 0 || b == '<' || b == '\n') plain &= ~CN_TB_RAW;
        size_t k = b < 0x80 ? 1 : b >= 0xc2 && b < 0xe0 ? 2 : b >= 0xe0 && b < 0xf0 ? 3 : b >= 0xf0 && b <= 0xf4 ? 4 : 0;
        if (!k || i + k > n) return 0;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xc0) != 0x80) return 0;
        /* the second byte's narrower ranges: no overlongs, surrogates or beyond U+10FFFF */
        if ((b == 0xe0 && s[i + 1] < 0xa0) || (b == 0xed && s[i + 1] > 0x9f) ||
            (b == 0xf0 && s[i + 1] < 0x90) || (b == 0xf4 && s[i + 1] > 0x8f))
            return 0;
        i += k;
        c++;
    }
    *nc = c;
    return plain;
}

int cn_token_bytes_build(cn_token_bytes **out, const cn_tokenizer *t, cn_err *err) {
    *out = NULL;
    int n = cn_tok_vocab_size(t);
    cn_token_bytes *tb = calloc(1, sizeof *tb);
    if (!tb) return cn_err_set(err, CN_ENOMEM, "out of memory");
    tb->n = n;
    tb->off = calloc((size_t)n + 1, sizeof *tb->off);
    tb->len = calloc((size_t)n + 1, sizeof *tb->len);
    tb->nchars = calloc((size_t)n + 1, sizeof *tb->nchars);
    tb->flags = calloc((size_t)n + 1, sizeof *tb->flags);
    size_t cap = 4096, used = 0;
    tb->pool = malloc(cap);
    if (!tb->off || !tb->len || !tb->nchars || !tb->flags || !tb->pool) goto oom;
    for (int id = 0; id < n; id++) {
        char *b = NULL;
        size_t bn = 0;
        int rc = cn_tok_token_bytes(t, id, &b, &bn);
        if (rc == CN_ENOMEM) goto oom;
        if (rc) continue; /* an unused id: no bytes, never allowed */
        if (used + bn > cap) {
            while (used + bn > cap) cap *= 2;
            char *np = realloc(tb->pool, cap);
            if (!np) {
                free(b);
                goto oom;
            }
            tb->pool = np;
        }
        memcpy(tb->pool + used, b, bn);
        tb->off[id] = (uint32_t)used;
        tb->len[id] = (uint32_t)bn;
        used += bn;
        if (cn_tok_is_special(t, id)) tb->flags[id] |= CN_TB_SPECIAL;
        else tb->flags[id] |= (uint8_t)classify((const unsigned char *)b, bn, &tb->nchars[id]);
        free(b);
    }
    *out = tb;
    return CN_OK;
oom:
    cn_token_bytes_free(tb);
    return cn_err_set(err, CN_ENOMEM, "out of memory building the token byte table");
}
