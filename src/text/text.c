/* text.c - a model's tokenizer and renderer as one unit; see text.h.
 *
 * The prompt is the chat template's text, which writes special tokens (<|im_start|>, <think>)
 * as text: they are recognised, and nothing is added around it (the template has its own
 * markers). Generated special tokens are decoded too, because the reasoning/tool-call parser
 * reads <think> and <tool_call> as text.
 */
#include "text/text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

struct cn_text {
    cn_tokenizer *tok;
    const cn_renderer *renderer;
    cn_token_bytes *bytes; /* every token's bytes, for constrained decoding */
    int32_t turn;          /* the token that opens a turn, or -1 */
};

/* Loads from dir/tokenizer.json (json NULL) or from json[0, len). */
static int open_text(cn_text **out, const char *dir, const char *json, size_t len,
                     const char *model_type, cn_err *err) {
    *out = NULL;
    cn_text *t = calloc(1, sizeof *t);
    if (!t) return cn_err_set(err, CN_ENOMEM, "out of memory");
    if (!(t->renderer = cn_renderer_for_model_type(model_type))) {
        free(t);
        return cn_err_set(err, CN_EUNSUPPORTED, "no chat renderer for model_type \"%s\" (known: %s)",
                          model_type, cn_renderer_names());
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir ? dir : "");
    int rc = json ? cn_tok_load_json(&t->tok, json, len, err) : cn_tok_load(&t->tok, path, err);
    if (rc || (rc = cn_token_bytes_build(&t->bytes, t->tok, err))) {
        cn_tok_free(t->tok);
        free(t);
        return rc;
    }
    /* The renderer's turn opener, when the tokenizer has it as one token (a special token). */
    t->turn = -1;
    const char *open = cn_renderer_turn_open(t->renderer);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    cn_err e2;
    if (open && !cn_tok_encode(t->tok, open, strlen(open), CN_TOK_PARSE_SPECIAL, &ids, &n_ids, &e2) &&
        n_ids == 1)
        t->turn = ids[0];
    free(ids);
    *out = t;
    return CN_OK;
}

int cn_text_open(cn_text **out, const char *dir, const char *model_type, cn_err *err) {
    return open_text(out, dir, NULL, 0, model_type, err);
}

int cn_text_open_json(cn_text **out, const char *tok_json, size_t len, const char *model_type,
                      cn_err *err) {
    return open_text(out, NULL, tok_json, len, model_type, err);
}

void cn_text_close(cn_text *t) {
    if (!t) return;
    cn_tok_free(t->tok);
    cn_token_bytes_free(t->bytes);
    free(t);
}

const cn_renderer *cn_text_renderer(const cn_text *t) { return t->renderer; }
const cn_tokenizer *cn_text_tokenizer(const cn_text *t) { return t->tok; }
const cn_token_bytes *cn_text_token_bytes(const cn_text *t) { return t->bytes; }

int32_t cn_text_turn_token(const cn_text *t) { return t->turn; }

int cn_text_encode(const cn_text *t, const char *s, size_t n, int32_t **ids, int *n_ids,
                   cn_err *err) {
    size_t cnt = 0;
    int rc = cn_tok_encode(t->tok, s, n, CN_TOK_PARSE_SPECIAL, ids, &cnt, err);
    *n_ids = rc ? 0 : (int)cnt;
    return rc;
}

int cn_detok_init(cn_detok *d, const cn_text *t) {
    memset(d, 0, sizeof *d);
    d->t = t;
    cn_tok_stream *s = calloc(1, sizeof *s);
    if (!s) return CN_ENOMEM;
    if (cn_tok_stream_init(s, t->tok, 0)) {
        free(s);
        return CN_ENOMEM;
    }
    d->impl = s;
    return CN_OK;
}

int cn_detok_push(cn_detok *d, int32_t id, const char **out, size_t *n) {
    *out = "";
    *n = 0;
    return cn_tok_stream_feed(d->impl, id, out, n, NULL);
}

void cn_detok_flush(cn_detok *d, const char **out, size_t *n) {
    *out = "";
    *n = 0;
    if (d->impl && cn_tok_stream_flush(d->impl, out, n, NULL)) {
        *out = "";
        *n = 0;
    }
}

void cn_detok_free(cn_detok *d) {
    if (d->impl) {
        cn_tok_stream_free(d->impl);
        free(d->impl);
    }
    memset(d, 0, sizeof *d);
}
