/* engine.c - request life cycle over the model and the prefix cache; see engine.h. */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "model/state.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int cn_engine_open(cn_engine **out, cn_model *m, const cn_engine_opts *o, cn_err *err) {
    cn_engine *e = calloc(1, sizeof *e);
    if (!e) return cn_err_set(err, CN_ENOMEM, "out of memory");
    e->m = m;
    if (o) e->o = *o;
    else e->o.cache.pre_end = 4;
    if (e->o.ctx <= 0) e->o.ctx = 4096;
    if (e->o.chunk <= 0) e->o.chunk = 512;
    const cn_config *c = cn_model_config(m);
    int rc = cn_state_create(&e->live, m, e->o.ctx, 0);
    if (rc) {
        cn_err_set(err, rc, "cannot allocate the state for %d tokens: %s", e->o.ctx, cn_strerror(rc));
        goto fail;
    }
    if ((rc = cn_pc_init(&e->pc, e->live, &e->o.cache))) {
        cn_err_set(err, rc, "cannot set up the prefix cache: %s", cn_strerror(rc));
        goto fail;
    }
    /* A cold-run engine restores nothing, so it neither reads nor writes the disk tier. */
    if (e->o.cache_dir && !e->o.no_cache &&
        (rc = cn_pc_attach_disk(&e->pc, e->o.cache_dir, cn_model_identity(m), e->o.disk_budget, err)))
        goto fail;
    e->o.cache_dir = NULL; /* the caller's string; the tier keeps its own copy */
    e->logits = malloc((size_t)c->vocab_size * sizeof *e->logits);
    e->eos = malloc((size_t)(c->n_eos ? c->n_eos : 1) * sizeof *e->eos);
    if (!e->logits || !e->eos) {
        rc = cn_err_set(err, CN_ENOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < c->n_eos; i++) e->eos[i] = c->eos_token_ids[i];
    e->n_eos = c->n_eos;
    *out = e;
    return CN_OK;
fail:
    cn_engine_close(e);
    return rc;
}

void cn_engine_close(cn_engine *e) {
    if (!e) return;
    if (e->live) cn_pc_free(&e->pc);
    cn_state_free(e->live);
    free(e->logits);
    free(e->eos);
    free(e);
}

static int is_eos(const cn_engine *e, int32_t t) {
    for (int i = 0; i < e->n_eos; i++)
        if (e->eos[i] == t) return 1;
    return 0;
}

/* Forwards keys [from, to) of the session (tokens given), capturing at scheduled offsets. */
static int forward(cn_engine *e, cn_pc_session *sess, const int32_t *tokens, int from, int to,
                   int want_logits) {
    int at[64];
    cn_rsnap caps[64];
    int nc = cn_pc_captures_in(sess, from, to, at, 64);
    cn_batch bt = {.tokens = tokens + from, .n = to - from, .logits = want_logits ? e->logits : NULL,
                   .capture_at = at, .n_capture = nc, .captures = caps};
    int rc = cn_model_forward(e->m, e->live, &bt);
    if (rc) return rc;
    return cn_pc_absorbed(&e->pc, sess, from, to, caps, nc);
}

int cn_engine_generate(cn_engine *e, const cn_request *r, cn_result *res) {
    memset(res, 0, sizeof *res);
    const cn_config *c = cn_model_config(e->m);
    int n = r->n_tokens;
    if (n <= 0 || !r->tokens || r->max_tokens < 0) return CN_EINVAL;
    for (int i = 0; i < n; i++)
        if (r->tokens[i] < 0 || r->tokens[i] >= c->vocab_size) return CN_EINVAL;
    if ((int64_t)n + r->max_tokens > e->o.ctx) return CN_ECONTEXT;
    cn_sampler smp;
    if (cn_sampler_init(&smp, &r->sampling, c->vocab_size)) return CN_EINVAL;
    int32_t *all = malloc(((size_t)n + r->max_tokens + 1) * sizeof *all);
    cn_key *keys = malloc((size_t)n * sizeof *keys);
    res->tokens = malloc(((size_t)r->max_tokens + 1) * sizeof *res->tokens);
    if (!all || !keys || !res->tokens) {
        free(all);
        free(keys);
        free(res->tokens);
        res->tokens = NULL;
        cn_sampler_free(&smp);
        return CN_ENOMEM;
    }
    int rc0;
    memcpy(all, r->tokens, (size_t)n * sizeof *all);
    if (cn_keys_build(all, n, r->media, r->n_media, 0, keys)) {
        free(keys);
        free(all);
        free(res->tokens);
        res->tokens = NULL;
        cn_sampler_free(&smp);
        return CN_EINVAL; /* media items out of order or outside the prompt */
    }
    if (e->o.no_cache && (rc0 = cn_pc_reset(&e->pc))) { /* a cold run restores nothing */
        free(keys);
        free(all);
        free(res->tokens);
        res->tokens = NULL;
        cn_sampler_free(&smp);
        return rc0;
    }
    double t0 = now_ms();
    cn_pc_session sess;
    int rc = cn_pc_begin(&e->pc, &sess, keys, n);
    free(keys);
    if (rc) goto out;
    res->prompt_tokens = n;
    res->matched_tokens = sess.matched;
    res->cached_tokens = sess.restored;

    /* PREFILL: forwards end at chunk boundaries and at restore points (cancellation points). */
    int pos = sess.restored;
    while (pos < n) {
        int end = pos + e->o.chunk < n ? pos + e->o.chunk : n;
        for (int i = 0; i < sess.n_sched; i++)
            if (sess.sched[i] > pos && sess.sched[i] < end) {
                end = sess.sched[i];
                break;
            }
        if ((rc = forward(e, &sess, all, pos, end, end == n))) goto close;
        res->prompt_eval_count += end - pos;
        pos = end;
        if (r->on_progress) r->on_progress(r->ctx, pos, n);
        if (pos < n && r->cancel && r->cancel(r->ctx)) {
            rc = CN_ECANCELED;
            res->stop = CN_STOP_CANCELED;
            goto close;
        }
    }
    res->prompt_ms = now_ms() - t0;
    if (r->prompt_logits) memcpy(r->prompt_logits, e->logits, (size_t)c->vocab_size * sizeof(float));
    for (int i = 0; i < n; i++) cn_sampler_accept(&smp, all[i]);

    /* DECODE: record, hand out, then forward (the last token is never forwarded). */
    double t1 = now_ms();
    res->stop = CN_STOP_LENGTH;
    while (res->eval_count < r->max_tokens) {
        int32_t t = cn_sampler_sample(&smp, e->logits);
        if (!r->ignore_eos && is_eos(e, t)) {
            res->stop = CN_STOP_EOS;
            break;
        }
        res->tokens[res->eval_count++] = t;
        all[n + res->eval_count - 1] = t;
        cn_sampler_accept(&smp, t);
        if (r->on_token && r->on_token(r->ctx, t)) {
            res->stop = CN_STOP_CALLER;
            break;
        }
        if (r->cancel && r->cancel(r->ctx)) {
            rc = CN_ECANCELED;
            res->stop = CN_STOP_CANCELED;
            break;
        }
        if (res->eval_count == r->max_tokens) break;
        if ((rc = cn_pc_push_key(&sess, (cn_key)t))) break;
        int at = e->live->offset;
        if ((rc = forward(e, &sess, all, at, at + 1, 1))) break;
    }
    res->eval_ms = now_ms() - t1;
close:
    {
        int crc = cn_pc_close(&e->pc, &sess);
        if (!rc) rc = crc;
    }
    cn_log(CN_LOG_INFO, "request: %d tokens, %d matched, %d restored from cache, %d evaluated, %d generated%s",
           n, res->matched_tokens, res->cached_tokens, res->prompt_eval_count, res->eval_count,
           rc == CN_ECANCELED ? " (canceled)" : "");
out:
    free(all);
    cn_sampler_free(&smp);
    return rc;
}
