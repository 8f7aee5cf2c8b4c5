/* speculate.c - the MTP drafter, the speculative round and the depth controller; see
 * speculate.h for the state machine and invariants. */
#include "engine/speculate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "model/config.h"
#include "tensor/backend.h"

#define EWMA 0.2           /* weight of a new round in the acceptance estimates */
#define ACC_PRIOR 0.6      /* acceptance assumed before any round: optimistic, so it is tried */
#define PROBE_FIRST 4      /* plain steps of the first park */
#define PROBE_MAX 512      /* the longest park */
#define PROBE_DEPTH 1      /* a probe drafts one: the first position gates all the others */
#define REMEASURE 64       /* rounds between plain steps that re-measure the baseline (load moves) */
#define PLAIN_FIRST 3      /* plain steps before the first round: a median needs three */

/* ---- open / close ----------------------------------------------------------------------------- */

int cn_spec_open(cn_spec **out, cn_model *m, int max_ctx, int max_depth, int fixed) {
    const cn_config *c = cn_model_config(m);
    if (!cn_model_has_mtp(m)) return CN_EINVAL;
    for (int l = 0; l < c->n_mtp_layers; l++)
        if (c->mtp_layers[l] == CN_BLOCK_MAMBA) return CN_EINVAL; /* could not be rewound */
    if (max_depth <= 0) max_depth = 4;
    if (max_depth > CN_SPEC_MAX_DEPTH) max_depth = CN_SPEC_MAX_DEPTH;
    cn_spec *sp = calloc(1, sizeof *sp);
    if (!sp) return CN_ENOMEM;
    sp->m = m;
    sp->cpu_clock = !cn_backend_has_device_memory(cn_model_backend(m));
    sp->H = c->hidden_size;
    sp->V = c->vocab_size;
    size_t H = (size_t)sp->H, V = (size_t)sp->V, D = CN_SPEC_MAX_DEPTH;
    /* Drafts run on the head's NVFP4 copy where the backend allows one: a draft streams a quarter
     * of the bytes and the round's output is the target's all the same (model.h). Without the copy (no
     * memory for it, a device backend) the stored head drafts. */
    int rc = cn_model_mtp_draft_build(m);
    if (rc && rc != CN_EUNSUPPORTED && rc != CN_ENOMEM) goto fail;
    rc = cn_state_create(&sp->draft, m, max_ctx, 2);
    if (rc) goto fail;
    sp->last_logits = malloc(V * sizeof(float));
    sp->last_hidden = malloc(H * sizeof(float));
    sp->q = malloc(D * V * sizeof(float));
    sp->p = malloc(V * sizeof(float));
    sp->vlogits = malloc((D + 1) * V * sizeof(float));
    sp->vhidden = malloc((D + 1) * H * sizeof(float));
    sp->mh = malloc(H * sizeof(float));
    if (!sp->last_logits || !sp->last_hidden || !sp->q || !sp->p || !sp->vlogits || !sp->vhidden || !sp->mh) {
        rc = CN_ENOMEM;
        goto fail;
    }
    cn_spec_ctl *ctl = &sp->ctl;
    ctl->max_depth = max_depth;
    ctl->fixed = fixed;
    for (int j = 0; j < CN_SPEC_MAX_DEPTH; j++) ctl->acc[j] = ACC_PRIOR;
    ctl->backoff = PROBE_FIRST;
    sp->last_at = -1;
    *out = sp;
    return CN_OK;
fail:
    cn_spec_close(sp);
    return rc;
}

/* The round's captures stop meaning anything; their buffers stay for the next round. */
static void drop_caps(cn_spec *sp) {
    sp->n_caps = 0;
    sp->rp.rows = 0;
}

/* Buffers for captures 0..d-1, allocated once each and kept until close: a capture written into
 * fresh pages costs a page fault per 4 KiB, which on a small model is more than the forward. */
static int ensure_caps(cn_spec *sp, cn_state *live, int d) {
    if (sp->n_caps_alloc < d || !sp->rp_state) sp->ctl.skip_cost = 1; /* not a round's cost */
    if (!sp->rp_state) {
        int rc = cn_replay_alloc(live, CN_SPEC_MAX_DEPTH + 1, &sp->rp);
        if (rc && rc != CN_EUNSUPPORTED && rc != CN_EINVAL) return rc;
        sp->rp_state = rc ? -1 : 1; /* without it, captures hold the SSM states too */
    }
    for (; sp->n_caps_alloc < d; sp->n_caps_alloc++) {
        cn_rsnap *c = &sp->caps[sp->n_caps_alloc];
        int rc = sp->rp_state > 0 ? cn_state_snapshot_alloc_conv(live, c)
                                  : cn_state_snapshot_alloc(live, c);
        if (rc) return rc; /* that one freed itself; the ones before stay */
    }
    return CN_OK;
}

void cn_spec_close(cn_spec *sp) {
    if (!sp) return;
    for (int i = 0; i < sp->n_caps_alloc; i++) cn_rsnap_free(sp->m, &sp->caps[i]);
    if (sp->rp_state > 0) cn_replay_free(sp->m, &sp->rp);
    cn_state_free(sp->draft);
    free(sp->pend_h);
    free(sp->pend_next);
    free(sp->last_logits);
    free(sp->last_hidden);
    free(sp->q);
    free(sp->p);
    free(sp->vlogits);
    free(sp->vhidden);
    free(sp->mh);
    free(sp);
}

void cn_spec_begin(cn_spec *sp) {
    drop_caps(sp);
    sp->n_pend = 0;
    sp->round_pend = 0;
    sp->last_at = -1;
}

void cn_spec_set_test_oracle(cn_spec *sp, cn_spec_test_oracle_fn fn, void *ctx) {
    sp->oracle = fn;
    sp->oracle_ctx = ctx;
}

/* ---- the draft cache ---------------------------------------------------------------------------- */

/* Forwards the first k pending slots (all known) through the head; the last one's logits and
 * head output are kept for drafting. */
static int forward_pending(cn_spec *sp, int k) {
    if (k <= 0) return CN_OK;
    size_t H = (size_t)sp->H;
    int rc = CN_OK;
    /* One batch (a round's flush is one head forward, not one per slot); the lm_head runs for the
     * last slot only: the others just write their KV rows. */
    rc = cn_model_mtp_forward_last(sp->m, sp->draft, sp->pend_h, sp->pend_next, k, sp->last_logits,
                                   sp->last_hidden);
    if (rc) return rc;
    sp->last_at = sp->draft->offset;
    sp->round_pend = sp->round_pend > k ? sp->round_pend - k : 0;
    memmove(sp->pend_h, sp->pend_h + (size_t)k * H, (size_t)(sp->n_pend - k) * H * sizeof(float));
    memmove(sp->pend_next, sp->pend_next + k, (size_t)(sp->n_pend - k) * sizeof(int32_t));
    sp->n_pend -= k;
    return CN_OK;
}

static int known(const cn_spec *sp) {
    return sp->n_pend && sp->pend_next[sp->n_pend - 1] < 0 ? sp->n_pend - 1 : sp->n_pend;
}

int cn_spec_flush(cn_spec *sp) { return forward_pending(sp, known(sp)); }

int cn_spec_feed(cn_spec *sp, const float *hidden, const int32_t *next, int k, int keep_last) {
    if (k <= 0) return CN_OK;
    if (sp->n_pend && sp->pend_next[sp->n_pend - 1] < 0) return CN_EINVAL; /* the last pair is open */
    size_t H = (size_t)sp->H;
    if (sp->n_pend + k > sp->cap_pend) {
        int cap = sp->cap_pend ? sp->cap_pend : 64;
        while (cap < sp->n_pend + k) cap *= 2;
        float *h = realloc(sp->pend_h, (size_t)cap * H * sizeof *h);
        if (!h) return CN_ENOMEM;
        sp->pend_h = h;
        int32_t *nx = realloc(sp->pend_next, (size_t)cap * sizeof *nx);
        if (!nx) return CN_ENOMEM;
        sp->pend_next = nx;
        sp->cap_pend = cap;
    }
    memcpy(sp->pend_h + (size_t)sp->n_pend * H, hidden, (size_t)k * H * sizeof(float));
    memcpy(sp->pend_next + sp->n_pend, next, (size_t)k * sizeof *next);
    sp->n_pend += k;
    /* Plain decoding batches the head's work; the newest known slot stays pending so that the
     * next proposal has its logits without re-running anything. */
    if (keep_last && sp->n_pend > CN_SPEC_FLUSH) return forward_pending(sp, known(sp) - 1);
    return CN_OK;
}

void cn_spec_close_pair(cn_spec *sp, int32_t next) {
    if (sp->n_pend && sp->pend_next[sp->n_pend - 1] < 0) sp->pend_next[sp->n_pend - 1] = next;
}

/* ---- the round ---------------------------------------------------------------------------------- */

double cn_spec_now(const cn_spec *sp) {
    struct timespec ts;
    clock_gettime(sp->cpu_clock ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Drafts d tokens: the flush's last row proposes d1, then the head runs on its own output. Each
 * draft is the sampler's choice from the head's logits (q filled for sampling). The speculative
 * draft rows are dropped before returning. */
static int propose(cn_spec *sp, cn_sampler *smp, int d, int greedy) {
    size_t V = (size_t)sp->V;
    int committed = sp->draft->offset, rc = CN_OK;
    if (sp->oracle) {
        if (sp->oracle(sp->oracle_ctx, sp->round_p + 1, d, sp->drafts)) return CN_EINVAL;
        for (int j = 0; j < d; j++) {
            if (sp->drafts[j] < 0 || sp->drafts[j] >= sp->V) return CN_EINVAL;
            if (greedy) continue;
            memset(sp->q + j * V, 0, V * sizeof(float));
            sp->q[j * V + (size_t)sp->drafts[j]] = 1.0f; /* one-hot proposal */
        }
        return CN_OK;
    }
    memcpy(sp->mh, sp->last_hidden, (size_t)sp->H * sizeof(float));
    const float *logits = sp->last_logits;
    for (int j = 0; j < d && !rc; j++) {
        if (j > 0) {
            /* slot P-1+j: the head's own output with the previous draft */
            rc = cn_model_mtp_forward(sp->m, sp->draft, sp->mh, &sp->drafts[j - 1], 1, sp->vlogits, sp->mh);
            logits = sp->vlogits;
            if (rc) break;
        }
        if (greedy) sp->drafts[j] = cn_sampler_sample(smp, logits);
        else {
            cn_sampler_dist(smp, logits, sp->q + j * V);
            sp->drafts[j] = cn_sampler_draw(smp, sp->q + j * V);
        }
    }
    sp->draft->offset = committed; /* speculative rows are junk from here on */
    return rc;
}

int cn_spec_round(cn_spec *sp, cn_state *live, cn_sampler *smp, int32_t cur, int depth) {
    size_t V = (size_t)sp->V;
    int greedy = smp->params.temperature == 0.0f, rc;
    if (depth < 1 || depth > CN_SPEC_MAX_DEPTH || sp->n_caps) return CN_EINVAL;
    sp->round_p = live->offset;
    sp->round_d = depth;
    sp->n_out = sp->n_acc = 0;
    /* LEVEL: the newest pending slot is (hidden P-1, cur); flushing it proposes d1. */
    cn_spec_close_pair(sp, cur);
    /* The flush's share for slots that plain steps queued is theirs (speculate.h: the controller) */
    int n_flush = known(sp), n_catchup = n_flush - sp->round_pend;
    double t0 = n_catchup > 0 ? cn_spec_now(sp) : 0; /* the clock may be a system call */
    if ((rc = cn_spec_flush(sp))) return rc;
    sp->ctl.catchup_n = n_catchup > 0 ? n_catchup : 0;
    sp->ctl.catchup_ms = n_catchup > 0 ? (cn_spec_now(sp) - t0) * n_catchup / n_flush : 0;
    if (sp->draft->offset != live->offset || sp->last_at != live->offset) return CN_EINVAL;
    if ((rc = propose(sp, smp, depth, greedy))) return rc;
    if ((rc = ensure_caps(sp, live, depth))) return rc;

    /* One target forward over [cur, d1..dd], a capture at every position past cur. */
    int32_t toks[CN_SPEC_MAX_DEPTH + 1];
    int at[CN_SPEC_MAX_DEPTH];
    toks[0] = cur;
    for (int j = 0; j < depth; j++) {
        toks[j + 1] = sp->drafts[j];
        at[j] = sp->round_p + 1 + j;
    }
    cn_batch bt = {.tokens = toks, .n = depth + 1, .all_logits = 1, .logits = sp->vlogits,
                   .hidden = sp->vhidden, .capture_at = at, .n_capture = depth, .captures = sp->caps,
                   .captures_ready = 1, .replay = sp->rp_state > 0 ? &sp->rp : NULL};
    if ((rc = cn_model_forward(sp->m, live, &bt))) return rc;
    sp->n_caps = depth;

    /* Accept: row j is the target's view of position P+1+j. */
    for (int j = 0; j <= depth; j++) {
        const float *row = sp->vlogits + (size_t)j * V;
        int32_t t;
        if (j == depth) {
            t = cn_sampler_sample(smp, row); /* all kept: the bonus token, drawn from p */
        } else if (greedy) {
            t = cn_sampler_sample(smp, row); /* argmax (with penalties): no draw */
            if (t == sp->drafts[j]) {
                sp->out[sp->n_out++] = t;
                sp->n_acc++;
                cn_sampler_accept(smp, t);
                continue;
            }
        } else {
            const float *q = sp->q + (size_t)j * V;
            int32_t d = sp->drafts[j];
            cn_sampler_dist(smp, row, sp->p);
            /* accept with probability min(1, p/q): q(d) > 0 since d was drawn from q */
            if (cn_sampler_uniform(smp) * q[d] < sp->p[d]) {
                sp->out[sp->n_out++] = d;
                sp->n_acc++;
                cn_sampler_accept(smp, d);
                continue;
            }
            /* rejected: the normalised residual max(0, p - q) */
            for (size_t i = 0; i < V; i++) {
                float r = sp->p[i] - q[i];
                sp->p[i] = r > 0.0f ? r : 0.0f;
            }
            t = cn_sampler_draw(smp, sp->p);
            if (t < 0) t = cn_sampler_sample(smp, row); /* p == q up to rounding: p itself */
        }
        sp->out[sp->n_out++] = t;
        cn_sampler_accept(smp, t);
        break;
    }
    return CN_OK;
}

int cn_spec_commit(cn_spec *sp, cn_state *live, int keep) {
    int rc = CN_OK;
    if (keep < 0 || keep >= sp->n_out) keep = sp->n_out - 1;
    int target = sp->round_p + 1 + keep;
    if (keep >= 0 && target < live->offset) {
        /* Attention rewinds by offset; Mamba loads the state at exactly `target`: scanned again
         * from the verify's start (cn_model_replay), or the capture's, by taking its buffers
         * where it can. The capture is dropped below anyway. */
        rc = sp->rp.rows ? cn_model_replay(sp->m, live, &sp->rp, &sp->caps[keep])
                           : cn_state_restore_take(live, &sp->caps[keep]);
    }
    drop_caps(sp);
    if (rc || keep < 0) return rc;
    /* Draft slots P..P+keep from the target's hiddens: accepted or not, no speculative row stays. */
    rc = cn_spec_feed(sp, sp->vhidden, sp->out, keep + 1, 1);
    sp->round_pend = sp->n_pend; /* the round flushed every slot before these */
    return rc;
}

/* ---- the depth controller ----------------------------------------------------------------------- */

/* Expected tokens committed by a round of depth d: the drawn token plus every kept draft. */
static double expected(const cn_spec_ctl *c, int d) {
    double e = 1.0, run = 1.0;
    for (int j = 0; j < d; j++) {
        run *= c->acc[j];
        e += run;
    }
    return e;
}

/* Records v; returns the median of the window. */
static double observe(cn_spec_obs *o, double v) {
    o->v[o->n % CN_SPEC_CTL_WIN] = v;
    if (++o->n == 2 * CN_SPEC_CTL_WIN) o->n = CN_SPEC_CTL_WIN; /* same slot order, no overflow */
    int n = o->n < CN_SPEC_CTL_WIN ? o->n : CN_SPEC_CTL_WIN;
    double s[CN_SPEC_CTL_WIN];
    for (int i = 0; i < n; i++) { /* insertion sort: at most 15 values */
        double x = o->v[i];
        int j = i;
        for (; j > 0 && s[j - 1] > x; j--) s[j] = s[j - 1];
        s[j] = x;
    }
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* The best depth for extra ms per draft (0: plain decoding). */
static int best_depth_at(const cn_spec_ctl *c, int budget, double extra) {
    double a = c->plain_ms > 0 ? c->plain_ms : 1.0;
    double b = extra < 0 ? 0 : extra;
    int best = 0;
    double best_rate = 1.0 / (a + c->head_ms); /* a plain step also owes its draft slot */
    for (int d = 1; d <= c->max_depth && d <= budget; d++) {
        double rate = expected(c, d) / (a + b * d);
        if (rate > best_rate * 1.0001) {
            best_rate = rate;
            best = d;
        }
    }
    return best;
}

static int best_depth(const cn_spec_ctl *c, int budget) {
    /* a draft costs a third of a step, at first */
    double b = c->has_extra ? c->extra_ms : 0.3 * (c->plain_ms > 0 ? c->plain_ms : 1.0);
    return best_depth_at(c, budget, b);
}

int cn_spec_ctl_pick(cn_spec_ctl *c, int budget) {
    if (budget <= 0) return 0;
    int cap = budget < c->max_depth ? budget : c->max_depth;
    if (c->fixed) return cap;
    /* Without a measured plain step the rounds' cost has nothing to be set against: the extra
     * cost per draft would stay a guess (a third of a step) that makes deep drafts look cheap.
     * One measurement is not enough: if it was preempted, every round would look free. */
    if (c->plain.n < PLAIN_FIRST || c->since_plain >= REMEASURE) return 0;
    if (c->parked) {
        if (c->park_left > 0) {
            c->park_left--;
            return 0;
        }
        return PROBE_DEPTH < cap ? PROBE_DEPTH : cap; /* a probe */
    }
    int d = best_depth(c, cap);
    if (d == 0) {
        c->parked = 1;
        c->park_left = c->backoff;
    }
    return d;
}

void cn_spec_ctl_plain(cn_spec_ctl *c, double ms) {
    c->since_plain = 0;
    c->plain_ms = observe(&c->plain, ms);
}

void cn_spec_ctl_round(cn_spec_ctl *c, int depth, int accepted, double ms) {
    c->since_plain++;
    /* acceptance of position j is conditional on the drafts before it being kept */
    for (int j = 0; j < depth && j <= accepted; j++)
        c->acc[j] = (1 - EWMA) * c->acc[j] + EWMA * (j < accepted ? 1.0 : 0.0);
    double extra = 0;
    int measured = c->plain_ms > 0 && depth > 0 && !c->skip_cost;
    if (measured) {
        if (c->catchup_n > 0) c->head_ms = observe(&c->head, c->catchup_ms / c->catchup_n);
        extra = (ms - c->catchup_ms - c->plain_ms) / depth;
        c->extra_ms = observe(&c->extra, extra);
        c->has_extra = 1;
    }
    c->skip_cost = 0;
    c->catchup_ms = 0;
    c->catchup_n = 0;
    if (c->fixed) return;
    if (c->parked) {
        /* the probe decides: resume, or park twice as long. The estimate that parked speculation
         * may be stale (the machine's load moves), so a probe cheaper than it speaks for itself. */
        int cap = c->max_depth;
        double b = measured && extra < c->extra_ms ? extra : c->extra_ms;
        if (best_depth_at(c, cap, b) > 0) {
            c->parked = 0;
            c->backoff = PROBE_FIRST;
        } else {
            c->backoff = c->backoff * 2 > PROBE_MAX ? PROBE_MAX : c->backoff * 2;
            c->park_left = c->backoff;
        }
    }
}
