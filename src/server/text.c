/* text.c - adapts the text layer to the server; see text.h.
 *
 * The tokenizer (src/text/tokenizer.h) has not landed in this branch yet: until it does,
 * cn_text_open fails with a message that says so and `cairn serve` refuses to start, rather
 * than serving with a stand-in tokenizer.
 */
#include "server/text.h"

#include <stdlib.h>
#include <string.h>

struct cn_text {
    const cn_renderer *renderer;
};

int cn_text_open(cn_text **out, const char *dir, const char *model_type, cn_err *err) {
    (void)dir;
    (void)model_type;
    *out = NULL;
    return cn_err_set(err, CN_EUNSUPPORTED,
                      "this build has no tokenizer yet (src/text/tokenizer.h), so it cannot serve text");
}

void cn_text_close(cn_text *t) { free(t); }

const cn_renderer *cn_text_renderer(const cn_text *t) { return t->renderer; }

int cn_text_encode(const cn_text *t, const char *s, size_t n, int32_t **ids, int *n_ids,
                   cn_err *err) {
    (void)t;
    (void)s;
    (void)n;
    *ids = NULL;
    *n_ids = 0;
    return cn_err_set(err, CN_EUNSUPPORTED, "no tokenizer");
}

int cn_detok_init(cn_detok *d, const cn_text *t) {
    memset(d, 0, sizeof *d);
    d->t = t;
    return CN_OK;
}

int cn_detok_push(cn_detok *d, int32_t id, const char **out, size_t *n) {
    (void)d;
    (void)id;
    *out = "";
    *n = 0;
    return CN_EUNSUPPORTED;
}

void cn_detok_flush(cn_detok *d, const char **out, size_t *n) {
    (void)d;
    *out = "";
    *n = 0;
}

void cn_detok_free(cn_detok *d) {
    free(d->buf);
    memset(d, 0, sizeof *d);
}
