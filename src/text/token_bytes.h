/* token_bytes.h - every token's bytes, precomputed once per model, for constrained decoding.
 *
 * A constraint (constraint.h) asks, for each token id, whether its bytes keep the output valid;
 * decoding a token each time would cost more than the check. The table is built once when the
 * model's text layer opens and is read-only afterwards, safe to share between threads. It never
 * changes the tokenizer and never looks at neighbouring tokens (cn_tok_token_bytes).
 */
#ifndef CN_TEXT_TOKEN_BYTES_H
#define CN_TEXT_TOKEN_BYTES_H

#include <stdint.h>

#include "base/error.h"
#include "text/tokenizer.h"

enum {
    CN_TB_SPECIAL = 1, /* a special added token (<think>, <|im_end|>): markup, not text */
    CN_TB_PLAIN = 2,   /* non-empty, whole UTF-8 characters, no control byte, no '"' or '\\':
                        * taken as is inside a JSON string */
    CN_TB_RAW = 4,     /* non-empty, whole UTF-8 characters, no NUL, '<' or newline: taken as is
                        * inside a tool call's raw value */
};

typedef struct cn_token_bytes {
    int n;              /* token ids [0, n) */
    char *pool;         /* every token's bytes, back to back */
    uint32_t *off;      /* [n] start in pool */
    uint32_t *len;      /* [n] bytes */
    uint32_t *nchars;   /* [n] UTF-8 characters (CN_TB_PLAIN and CN_TB_RAW tokens) */
    uint8_t *flags;     /* [n] CN_TB_* */
} cn_token_bytes;

/* Returns 0, or CN_ENOMEM with *out NULL. */
int cn_token_bytes_build(cn_token_bytes **out, const cn_tokenizer *t, cn_err *err);
void cn_token_bytes_free(cn_token_bytes *tb);

#endif
