/* text.h - one model's text layer as a unit: its tokenizer and chat renderer, and a per-request
 * streaming decoder.
 *
 * Opened once at startup from the model directory (by `cairn serve` and `cairn run`) and shared
 * read-only by every connection thread (encoding) and the engine worker (decoding). This file only
 * bundles the pieces of src/text/ a model directory implies; it never renders or tokenizes by
 * itself. reply.h builds a generated reply's whole text pipeline on it.
 * Invariants:
 *   (1) cn_text_encode is safe from any number of threads at once.
 *   (2) A cn_detok turns a token stream into exactly the bytes the tokenizer's decode of the whole
 *       stream gives, handing out only complete UTF-8 characters (an incomplete tail is held).
 */
#ifndef CN_TEXT_TEXT_H
#define CN_TEXT_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "text/render.h"
#include "text/token_bytes.h"
#include "text/tokenizer.h"

typedef struct cn_text cn_text; /* layout: text.c */

/* Loads dir/tokenizer.json and picks the renderer for the config's model_type. Returns 0, or a
 * CN_E code with err naming the file or the missing piece. */
int cn_text_open(cn_text **out, const char *dir, const char *model_type, cn_err *err);
/* The same from a tokenizer.json's text (tests, the fuzzer). */
int cn_text_open_json(cn_text **out, const char *tok_json, size_t len, const char *model_type,
                      cn_err *err);
void cn_text_close(cn_text *t);

const cn_renderer *cn_text_renderer(const cn_text *t);
/* The tokenizer (owned by t). */
const cn_tokenizer *cn_text_tokenizer(const cn_text *t);
/* Every token's bytes (owned by t), built at open for constrained decoding (constraint.h). */
const cn_token_bytes *cn_text_token_bytes(const cn_text *t);

/* The token every chat turn of a rendered prompt begins with (the renderer's turn opener, e.g.
 * <|im_start|>), or -1 when the tokenizer does not have it as one token. */
int32_t cn_text_turn_token(const cn_text *t);

/* Tokenizes s[0, n) as a prompt (special tokens in the text are recognized, as the chat template
 * writes them; no BOS is added: the template has its own). *ids is malloc'd (caller frees).
 * Returns 0, CN_ENOMEM, or CN_EFORMAT for invalid UTF-8. */
int cn_text_encode(const cn_text *t, const char *s, size_t n, int32_t **ids, int *n_ids,
                   cn_err *err);

typedef struct cn_detok {
    const cn_text *t;
    void *impl; /* the tokenizer's cn_tok_stream */
} cn_detok;

int cn_detok_init(cn_detok *d, const cn_text *t);
/* Decodes one more token; *out and *n receive the bytes now complete (valid until the next call).
 * Returns 0 or CN_ENOMEM / CN_EINVAL (id outside the vocabulary). */
int cn_detok_push(cn_detok *d, int32_t id, const char **out, size_t *n);
/* Whatever is still held (an incomplete character at the very end), at the end of the stream. */
void cn_detok_flush(cn_detok *d, const char **out, size_t *n);
void cn_detok_free(cn_detok *d);

#endif
