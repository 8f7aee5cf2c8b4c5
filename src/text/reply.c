/* reply.c - decoder, stop strings and parser chained; see reply.h. */
#include "text/reply.h"

#include <string.h>

int cn_reply_init(cn_reply *r, const cn_text *t, cn_stopseq *stops, int parse, int thinking,
                  const cJSON *tools, cn_parse_event_fn cb, void *ctx, cn_err *err) {
    memset(r, 0, sizeof *r);
    r->stops = stops;
    r->parse = parse;
    r->cb = cb;
    r->ctx = ctx;
    if (cn_detok_init(&r->detok, t)) return cn_err_set(err, CN_ENOMEM, "out of memory");
    if (parse) {
        int rc = cn_parser_init(&r->parser, "nemotron3", thinking, tools, err);
        if (rc) return rc;
        r->parser_ready = 1;
    }
    return CN_OK;
}

/* Text after stop strings: through the parser, or straight out as content. */
static int emit(cn_reply *r, const char *s, size_t n) {
    if (n == 0) return CN_OK;
    if (r->parse) return cn_parser_feed(&r->parser, s, n, r->cb, r->ctx);
    cn_parse_event ev = {.kind = CN_EV_CONTENT, .text = s, .len = n};
    return r->cb(&ev, r->ctx);
}

int cn_reply_text(cn_reply *r, const char *s, size_t n) {
    if (r->stopped) return CN_OK;
    if (!r->stops) return emit(r, s, n);
    const char *out;
    size_t on;
    int m = cn_stopseq_feed(r->stops, s, n, &out, &on);
    if (m < 0) return m;
    if (m == 1) r->stopped = 1;
    return emit(r, out, on);
}

int cn_reply_token(cn_reply *r, int32_t id) {
    const char *s;
    size_t n;
    int rc = cn_detok_push(&r->detok, id, &s, &n);
    if (rc) return rc == CN_ERANGE ? CN_EINVAL : rc;
    return cn_reply_text(r, s, n);
}

int cn_reply_finish(cn_reply *r) {
    const char *s;
    size_t n;
    cn_detok_flush(&r->detok, &s, &n);
    int rc = cn_reply_text(r, s, n);
    if (!rc && !r->stopped && r->stops) {
        cn_stopseq_flush(r->stops, &s, &n);
        rc = emit(r, s, n);
    }
    if (!rc && r->parse) rc = cn_parser_finish(&r->parser, r->cb, r->ctx);
    return rc;
}

void cn_reply_free(cn_reply *r) {
    cn_detok_free(&r->detok);
    if (r->parser_ready) cn_parser_free(&r->parser);
    r->parser_ready = 0;
}
