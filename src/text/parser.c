/* parser.c - the streaming thinking / content / tool-call splitter (rules and states: parser.h).
 *
 * Invariants between calls:
 *   (1) buf[pos, len) is exactly what is still undecided: in THINK_START whitespace-free text that
 *       may still become `<think>`; in THINK and CONTENT a whitespace run and/or a proper prefix of
 *       a tag and/or an incomplete UTF-8 character, in that order; in CALL the whitespace before
 *       `<tool_call>`, the tag and the body so far.
 *   (2) buf[0, len) minus its last u8_tail bytes is valid, complete UTF-8 (checked on entry), so
 *       any cut at a whitespace byte or a '<' is a character boundary.
 *   (3) Every decision looks only at bytes that cannot change: a tag is acted on once complete,
 *       whitespace is emitted once a non-whitespace, non-tag byte follows it. That is why any
 *       chunking gives the same events.
 */
#include "text/parser.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "text/toolcall.h"

static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>", CALL_OPEN[] = "<tool_call>",
                  CALL_CLOSE[] = "</tool_call>";
#define LIT_LEN(s) (sizeof(s) - 1)

static int is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static size_t lead_ws(const char *x, size_t n) {
    size_t i = 0;
    while (i < n && is_ws(x[i])) i++;
    return i;
}

static size_t trail_ws(const char *x, size_t n) {
    size_t i = n;
    while (i > 0 && is_ws(x[i - 1])) i--;
    return n - i;
}

/* First occurrence of lit in x[0, n), or n. */
static size_t find(const char *x, size_t n, const char *lit, size_t l) {
    for (size_t i = 0; i + l <= n; i++)
        if (x[i] == lit[0] && memcmp(x + i, lit, l) == 0) return i;
    return n;
}

/* Checks s[0, n) as UTF-8 (no overlongs, surrogates or code points past U+10FFFF). Returns 0 with
 * *tail = bytes of a valid but unfinished last character, or -1 with *bad = offset of the first
 * byte of the first invalid sequence. */
static int utf8_check(const unsigned char *s, size_t n, size_t *bad, size_t *tail) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i], lo = 0x80, hi = 0xBF;
        size_t need;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0) lo = 0xA0; /* overlong */
            if (c == 0xED) hi = 0x9F; /* surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0) lo = 0x90; /* overlong */
            if (c == 0xF4) hi = 0x8F; /* past U+10FFFF */
        } else {
            *bad = i;
            return -1;
        }
        for (size_t k = 1; k <= need; k++) {
            if (i + k == n) {
                *tail = n - i;
                return 0;
            }
            unsigned d = s[i + k];
            if (d < (k == 1 ? lo : 0x80u) || d > (k == 1 ? hi : 0xBFu)) {
                *bad = i;
                return -1;
            }
        }
        i += need + 1;
    }
    *tail = 0;
    return 0;
}

/* ---------- emitting ---------- */

/* Calls back with buf[a, b) as text; NUL-terminates it in place for the call (cap > len). */
static int emit_text(cn_parser *p, cn_parse_event_kind kind, size_t a, size_t b,
                     cn_parse_event_fn cb, void *ctx) {
    if (a == b) return 0;
    if (kind == CN_EV_CONTENT) p->at_start = 0;
    char saved = p->buf[b];
    p->buf[b] = '\0';
    cn_parse_event ev = {.kind = kind, .text = p->buf + a, .len = b - a};
    int rc = cb(&ev, ctx);
    p->buf[b] = saved;
    return rc > 0 ? CN_ECANCELED : rc; /* codes are negative; a stray positive still stops */
}

/* The index in x[0, n) from which bytes must wait: the start of the longest suffix that is a
 * proper prefix of one of tags, or of an unfinished UTF-8 character, moved back over the
 * whitespace before it (a trim rule or a tag may still claim that whitespace). */
static size_t hold_from(const cn_parser *p, const char *x, size_t n, const char *const *tags,
                        int ntags) {
    size_t h = n - p->u8_tail;
    for (int t = 0; t < ntags; t++) {
        size_t l = strlen(tags[t]), k = l - 1 < n ? l - 1 : n;
        for (; k > 0; k--)
            if (memcmp(x + n - k, tags[t], k) == 0) break;
        if (k && n - k < h) h = n - k;
    }
    return h - trail_ws(x, h);
}

static void begin_call(cn_parser *p, size_t ws) {
    p->state = CN_PS_CALL;
    p->call_ws = ws;
    p->scan = ws + LIT_LEN(CALL_OPEN);
}

/* The call whose `</tool_call>` ends at buf[pos + end): an event if well formed, else its raw
 * bytes (with the whitespace before it) as content. */
static int end_call(cn_parser *p, size_t end, cn_parse_event_fn cb, void *ctx) {
    size_t body = p->pos + p->call_ws + LIT_LEN(CALL_OPEN);
    size_t body_len = p->pos + end - LIT_LEN(CALL_CLOSE) - body;
    char *name = NULL;
    cJSON *args = NULL;
    int rc = cn_toolcall_parse(p->buf + body, body_len, p->tools, &name, &args);
    if (rc < 0) return rc;
    p->state = CN_PS_CONTENT;
    if (rc == 0) { /* malformed: nothing generated is dropped */
        rc = emit_text(p, CN_EV_CONTENT, p->pos, p->pos + end, cb, ctx);
        p->pos += end;
        return rc;
    }
    char *json = cJSON_PrintUnformatted(args);
    if (!json) {
        free(name);
        cJSON_Delete(args);
        return CN_ENOMEM;
    }
    cn_parse_event ev = {
        .kind = CN_EV_TOOL_CALL, .name = name, .arguments = args, .arguments_json = json};
    rc = cb(&ev, ctx);
    free(json);
    free(name);
    cJSON_Delete(args);
    p->pos += end;
    p->at_start = 1; /* whitespace after a call is formatting */
    return rc > 0 ? CN_ECANCELED : rc;
}

/* ---------- the state machine ---------- */

/* Consumes every byte whose meaning is settled; with final, all of them. */
static int run(cn_parser *p, int final, cn_parse_event_fn cb, void *ctx) {
    static const char *const think_tags[] = {THINK_CLOSE, CALL_OPEN};
    static const char *const content_tags[] = {CALL_OPEN};
    int rc;
    for (;;) {
        char *x = p->buf + p->pos;
        size_t n = p->len - p->pos;
        switch (p->state) {
        case CN_PS_THINK_START: {
            size_t w = lead_ws(x, n); /* leading whitespace of thinking is dropped */
            p->pos += w, x += w, n -= w;
            if (n == 0) return 0;
            if (!p->think_tag_seen) {
                if (n >= LIT_LEN(THINK_OPEN) && !memcmp(x, THINK_OPEN, LIT_LEN(THINK_OPEN))) {
                    p->pos += LIT_LEN(THINK_OPEN);
                    p->think_tag_seen = 1;
                    continue;
                }
                if (n < LIT_LEN(THINK_OPEN) && !memcmp(x, THINK_OPEN, n) && !final) return 0;
            }
            p->state = CN_PS_THINK;
            continue;
        }
        case CN_PS_THINK: {
            size_t ic = find(x, n, THINK_CLOSE, LIT_LEN(THINK_CLOSE));
            size_t it = find(x, n, CALL_OPEN, LIT_LEN(CALL_OPEN));
            size_t i = ic < it ? ic : it;
            if (i < n) { /* thinking ends; its trailing whitespace goes */
                size_t e = i - trail_ws(x, i);
                if ((rc = emit_text(p, CN_EV_THINKING, p->pos, p->pos + e, cb, ctx))) return rc;
                if (i == ic) {
                    p->pos += i + LIT_LEN(THINK_CLOSE);
                    p->state = CN_PS_CONTENT;
                    p->at_start = 1;
                } else {
                    p->pos += i;
                    begin_call(p, 0);
                }
                continue;
            }
            size_t h = final ? n - trail_ws(x, n) : hold_from(p, x, n, think_tags, 2);
            rc = emit_text(p, CN_EV_THINKING, p->pos, p->pos + h, cb, ctx);
            p->pos += final ? n : h;
            return rc;
        }
        case CN_PS_CONTENT: {
            if (p->at_start) {
                size_t w = lead_ws(x, n);
                p->pos += w, x += w, n -= w;
            }
            size_t i = find(x, n, CALL_OPEN, LIT_LEN(CALL_OPEN));
            if (i < n) { /* the whitespace before the tag waits with the call (see end_call) */
                size_t k = i - trail_ws(x, i);
                if ((rc = emit_text(p, CN_EV_CONTENT, p->pos, p->pos + k, cb, ctx))) return rc;
                p->pos += k;
                begin_call(p, i - k);
                continue;
            }
            size_t h = final ? n : hold_from(p, x, n, content_tags, 1);
            rc = emit_text(p, CN_EV_CONTENT, p->pos, p->pos + h, cb, ctx);
            p->pos += h;
            return rc;
        }
        case CN_PS_CALL: {
            size_t e = p->scan + find(x + p->scan, n - p->scan, CALL_CLOSE, LIT_LEN(CALL_CLOSE));
            if (e < n) {
                if ((rc = end_call(p, e + LIT_LEN(CALL_CLOSE), cb, ctx))) return rc;
                continue;
            }
            if (final) { /* unterminated: content, byte for byte */
                p->state = CN_PS_CONTENT;
                rc = emit_text(p, CN_EV_CONTENT, p->pos, p->pos + n, cb, ctx);
                p->pos += n;
                return rc;
            }
            /* Resume where a `</tool_call>` could still start: bodies are scanned once. */
            size_t body = p->call_ws + LIT_LEN(CALL_OPEN), back = LIT_LEN(CALL_CLOSE) - 1;
            p->scan = n > body + back ? n - back : body;
            return 0;
        }
        case CN_PS_DONE:
        case CN_PS_FAILED: return 0;
        }
    }
}

static int fail(cn_parser *p, int rc) {
    p->state = CN_PS_FAILED;
    p->fail_code = rc;
    return cn_err_set(&p->err, rc, "parser stopped: %s", cn_strerror(rc));
}

#ifndef NDEBUG
/* Invariants (1) and (2) in the shape checkable cheaply; asserted after every feed. */
static int parser_check(const cn_parser *p) {
    if (p->pos > p->len || p->len >= p->cap || p->u8_tail > 3 || p->u8_tail > p->len - p->pos)
        return 0;
    size_t n = p->len - p->pos;
    switch (p->state) {
    case CN_PS_THINK_START:
    case CN_PS_THINK:
    case CN_PS_CONTENT: { /* held: whitespace, then a partial tag or half a character */
        size_t m = n - p->u8_tail, w = lead_ws(p->buf + p->pos, m);
        return m == w || (m - w < LIT_LEN(CALL_OPEN) && p->buf[p->pos + w] == '<');
    }
    case CN_PS_CALL:
        return p->call_ws + LIT_LEN(CALL_OPEN) <= n && p->scan <= n &&
               !memcmp(p->buf + p->pos + p->call_ws, CALL_OPEN, LIT_LEN(CALL_OPEN));
    default: return 1;
    }
}
#endif

/* ---------- public ---------- */

int cn_parser_init(cn_parser *p, const char *family, int thinking, const cJSON *tools,
                   cn_err *err) {
    memset(p, 0, sizeof *p);
    p->state = CN_PS_FAILED; /* until init succeeds, every call refuses */
    p->fail_code = CN_EINVAL;
    if (!family || strcmp(family, "nemotron3") != 0)
        return cn_err_set(err, CN_EINVAL, "unknown parser family '%s' (known: nemotron3)",
                          family ? family : "(null)");
    if (tools && !cJSON_IsArray(tools))
        return cn_err_set(err, CN_EINVAL, "tools: expected an array of tools");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!cJSON_IsObject(fn)) fn = t;
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsObject(t) || !cJSON_IsString(nm) || !nm->valuestring[0])
            return cn_err_set(err, CN_EINVAL, "tools[%d]: not a function with a name", i);
        i++;
    }
    p->cap = 256;
    if (!(p->buf = malloc(p->cap))) return cn_err_set(err, CN_ENOMEM, "parser buffer");
    p->thinking = thinking != 0;
    p->tools = tools;
    p->state = thinking ? CN_PS_THINK_START : CN_PS_CONTENT;
    p->at_start = 1;
    p->fail_code = 0;
    return 0;
}

int cn_parser_feed(cn_parser *p, const char *text, size_t len, cn_parse_event_fn cb, void *ctx) {
    if (p->state == CN_PS_FAILED) return p->fail_code;
    if (p->state == CN_PS_DONE) return cn_err_set(&p->err, CN_EINVAL, "feed after finish");
    if (len == 0) return 0;
    /* Compact when that moves fewer bytes than were consumed: amortized O(1) per byte even
     * while a long call body sits in the buffer. */
    if (p->pos && (p->len - p->pos <= p->pos || p->len + len >= p->cap)) {
        memmove(p->buf, p->buf + p->pos, p->len - p->pos);
        p->len -= p->pos;
        p->pos = 0;
    }
    if (p->len + len >= p->cap) {
        size_t cap = p->cap;
        while (p->len + len >= cap) cap *= 2;
        char *nb = realloc(p->buf, cap);
        if (!nb) return cn_err_set(&p->err, CN_ENOMEM, "parser buffer of %zu bytes", cap);
        p->buf = nb;
        p->cap = cap;
    }
    memcpy(p->buf + p->len, text, len);
    size_t from = p->len - p->u8_tail, bad = 0, tail = 0;
    if (utf8_check((const unsigned char *)p->buf + from, p->u8_tail + len, &bad, &tail))
        return cn_err_set(&p->err, CN_EFORMAT,
                          "invalid UTF-8: byte 0x%02X at offset %llu does not start a valid "
                          "character",
                          (unsigned char)p->buf[from + bad],
                          (unsigned long long)(p->fed - p->u8_tail + bad));
    p->len += len;
    p->u8_tail = tail;
    p->fed += len;
    int rc = run(p, 0, cb, ctx);
    if (rc) return fail(p, rc);
    assert(parser_check(p));
    return 0;
}

int cn_parser_finish(cn_parser *p, cn_parse_event_fn cb, void *ctx) {
    if (p->state == CN_PS_FAILED) return p->fail_code;
    if (p->state == CN_PS_DONE) return cn_err_set(&p->err, CN_EINVAL, "finish called twice");
    if (p->u8_tail)
        return cn_err_set(&p->err, CN_EFORMAT,
                          "invalid UTF-8: input ends inside a character at offset %llu",
                          (unsigned long long)(p->fed - p->u8_tail));
    int rc = run(p, 1, cb, ctx);
    if (rc) return fail(p, rc);
    p->state = CN_PS_DONE;
    return 0;
}

void cn_parser_free(cn_parser *p) {
    free(p->buf);
    p->buf = NULL;
    p->pos = p->len = p->cap = 0;
}
