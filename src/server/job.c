/* job.c - a request's run through the engine and the text pipeline; see job.h. */
#include "server/job.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "server/api.h"

double cn_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

cn_job *cn_job_new(void) {
    cn_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    if (cn_chan_init(&j->chan)) {
        free(j);
        return NULL;
    }
    if (pthread_mutex_init(&j->mu, NULL)) {
        cn_chan_free(&j->chan);
        free(j);
        return NULL;
    }
    j->refs = 1;
    j->state = CN_JOB_QUEUED;
    j->t_arrival = cn_now_ms();
    j->created = (int64_t)time(NULL);
    return j;
}

void cn_job_ref(cn_job *j) {
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

void cn_job_unref(cn_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last) return;
    pthread_mutex_destroy(&j->mu);
    cn_chan_free(&j->chan);
    free(j->model);
    free(j->prompt);
    cn_stopseq_free(&j->stops);
    cJSON_Delete(j->tools);
    cJSON_Delete(j->echo);
    free(j->items);
    cn_constraint_free(j->constraint);
    if (j->reply_ready) cn_reply_free(&j->reply);
    free(j->content);
    free(j->thinking_text);
    for (int i = 0; i < j->n_calls; i++) {
        free(j->calls[i].id);
        free(j->calls[i].name);
        free(j->calls[i].arguments);
    }
    free(j->calls);
    free(j->res.tokens);
    free(j);
}

cn_job_state cn_job_get_state(cn_job *j) {
    pthread_mutex_lock(&j->mu);
    cn_job_state s = j->state;
    pthread_mutex_unlock(&j->mu);
    return s;
}

void cn_job_set_state(cn_job *j, cn_job_state s) {
    pthread_mutex_lock(&j->mu);
    j->state = s;
    pthread_mutex_unlock(&j->mu);
}

void cn_job_abandon(cn_job *j) {
    pthread_mutex_lock(&j->mu);
    if (j->gone_at == 0) j->gone_at = cn_now_ms();
    pthread_mutex_unlock(&j->mu);
    cn_chan_abandon(&j->chan);
}

double cn_job_gone_at(cn_job *j) {
    pthread_mutex_lock(&j->mu);
    double g = j->gone_at;
    pthread_mutex_unlock(&j->mu);
    return g;
}

const char *cn_job_content(const cn_job *j) { return j->content ? j->content : ""; }
const char *cn_job_thinking(const cn_job *j) { return j->thinking_text ? j->thinking_text : ""; }

/* ---- accumulation and events -------------------------------------------------------------- */

static int append(char **p, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + n + 1) c *= 2;
        char *nb = realloc(*p, c);
        if (!nb) return CN_ENOMEM;
        *p = nb;
        *cap = c;
    }
    memcpy(*p + *len, s, n);
    *len += n;
    (*p)[*len] = '\0';
    return CN_OK;
}

static int on_text(cn_job *j, int thinking, const char *s, size_t n) {
    if (n == 0) return CN_OK;
    if (thinking) j->thinking_tokens = j->n_generated;
    int rc = thinking ? append(&j->thinking_text, &j->thinking_len, &j->thinking_cap, s, n)
                      : append(&j->content, &j->content_len, &j->content_cap, s, n);
    if (rc) return rc;
    return j->stream ? cn_api_ops_for(j->api)->text(j, thinking, s, n) : CN_OK;
}

static int on_event(const cn_parse_event *ev, void *ctx) {
    cn_job *j = ctx;
    if (ev->kind != CN_EV_TOOL_CALL) return on_text(j, ev->kind == CN_EV_THINKING, ev->text, ev->len);
    cn_tool_call_out *nc = realloc(j->calls, ((size_t)j->n_calls + 1) * sizeof *nc);
    if (!nc) return CN_ENOMEM;
    j->calls = nc;
    cn_tool_call_out *c = &j->calls[j->n_calls];
    char id[64];
    const char *hex = !strncmp(j->id, "chatcmpl-", 9) ? j->id + 9
                      : !strncmp(j->id, "resp_", 5)  ? j->id + 5
                      : !strncmp(j->id, "msg_", 4)   ? j->id + 4
                                                     : j->id;
    /* "toolu_" ids for Anthropic's clients, "call_" for the others */
    snprintf(id, sizeof id, "%s_%s_%d", j->api == CN_API_ANTHROPIC ? "toolu" : "call", hex, j->n_calls);
    c->id = strdup(id);
    c->name = strdup(ev->name);
    c->arguments = strdup(ev->arguments_json);
    if (!c->id || !c->name || !c->arguments) {
        free(c->id);
        free(c->name);
        free(c->arguments);
        return CN_ENOMEM;
    }
    j->n_calls++;
    return j->stream ? cn_api_ops_for(j->api)->tool_call(j, j->n_calls - 1) : CN_OK;
}

/* ---- engine callbacks --------------------------------------------------------------------- */

typedef struct run_ctx {
    cn_job *j;
    cn_cancel_fn cancel;
    void *cancel_ctx;
} run_ctx;

static int cb_cancel(void *ctx) {
    run_ctx *r = ctx;
    return r->j->failed || (r->cancel && r->cancel(r->cancel_ctx));
}

static void cb_progress(void *ctx, int done, int total) {
    run_ctx *r = ctx;
    cn_job *j = r->j;
    if (!j->stream || done >= total) return;
    int rc = cn_api_ops_for(j->api)->progress(j, done, total);
    if (rc && rc != CN_ECANCELED) j->failed = rc; /* a gone client is the cancel poll's call */
}

static int cb_token(void *ctx, int32_t t) {
    run_ctx *r = ctx;
    cn_job *j = r->j;
    if (cn_job_get_state(j) == CN_JOB_PREFILL) cn_job_set_state(j, CN_JOB_DECODE);
    j->n_generated++;
    const char *s;
    size_t n;
    int rc;
    if (j->canned) { /* tests: the next few bytes of the canned text, whole characters only */
        s = j->canned + j->canned_pos;
        n = 0;
        while (s[n] && n < 4) n++;
        while (s[n] && ((unsigned char)s[n] & 0xC0) == 0x80) n++;
        j->canned_pos += n;
        rc = cn_reply_text(&j->reply, s, n);
        if (!j->canned[j->canned_pos]) j->stopped = 1;
    } else {
        rc = cn_reply_token(&j->reply, t);
    }
    if (j->reply.stopped) j->stopped = 1;
    if (rc && rc != CN_ECANCELED) j->failed = rc;
    return j->stopped || j->failed;
}

/* The engine's mask hook over the job's constraint; the flags mean the same on both sides. */
static int cb_mask(void *ctx, float *logits, int n_vocab) {
    int fl = cn_constraint_apply(ctx, logits, n_vocab);
    return (fl & CN_CONSTRAINT_EOS_OK ? CN_MASK_EOS_OK : 0) | (fl & CN_CONSTRAINT_ONLY_EOS ? CN_MASK_ONLY_EOS : 0);
}

static void cb_accept(void *ctx, int32_t token) {
    if (cn_constraint_accept(ctx, token)) cn_log(CN_LOG_WARN, "constraint: token %d was not allowed", token);
}

int cn_job_run(cn_job *j, cn_engine *e, int lane, cn_cancel_fn cancel, void *cancel_ctx) {
    const cn_api_ops *ops = cn_api_ops_for(j->api);
    run_ctx rc_ = {j, cancel, cancel_ctx};
    cn_err perr;
    cn_err_clear(&perr);
    int rc = cn_reply_init(&j->reply, j->text, &j->stops, j->parse, j->thinking, j->tools, on_event,
                           j, &perr);
    j->reply_ready = 1; /* safe to free whatever init returned */
    if (rc) {
        cn_log(CN_LOG_ERROR, "reply: %s", perr.msg);
        ops->final(j, rc);
        cn_job_set_state(j, CN_JOB_DONE); /* before the close: a reader that sees the end sees DONE */
        cn_chan_close(&j->chan);
        return rc;
    }
    cn_job_set_state(j, CN_JOB_PREFILL);
    cn_request rq = {
        .tokens = j->prompt,
        .n_tokens = j->n_prompt,
        .max_tokens = j->max_tokens,
        .ignore_eos = j->ignore_eos,
        .no_speculate = j->no_speculate,
        .marks = j->marks,
        .n_marks = j->n_marks,
        .sampling = j->sampling,
        .cancel = cb_cancel,
        .on_token = cb_token,
        .on_progress = cb_progress,
        .ctx = &rc_,
    };
    cn_logit_mask mask = {cb_mask, cb_accept, j->constraint};
    if (j->constraint && !j->canned) rq.mask = &mask;
    rc = cn_engine_generate_on(e, lane, &rq, &j->res);
    if (rc == CN_ECANCELED && cn_job_gone_at(j) > 0) { /* nobody to tell */
        cn_job_set_state(j, CN_JOB_CANCELED);
        cn_chan_close(&j->chan);
        return rc;
    }
    if (!rc && j->failed) rc = j->failed;
    int trc = cn_reply_finish(&j->reply);
    if (!rc && trc && trc != CN_ECANCELED) rc = trc;
    ops->final(j, rc);
    cn_job_set_state(j, CN_JOB_DONE);
    cn_chan_close(&j->chan);
    return rc;
}
