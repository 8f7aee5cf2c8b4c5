/* engine.c - request life cycle over the model and the prefix cache; see engine.h. */
#include "engine/engine.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "model/state.h"
#include "tensor/backend.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Lane k's state, drafter and scratch, and its lane in the prefix cache (lane 0's is the one
 * cn_pc_init made; the drafter of lane 0 makes the cache's keys pairs). */
static int lane_open(cn_engine *e, int k, cn_err *err) {
    cn_engine_lane *L = &e->lanes[k];
    const cn_config *c = cn_model_config(e->m);
    int rc = cn_state_create(&L->live, e->m, e->o.ctx, 0);
    if (rc) return cn_err_set(err, rc, "cannot allocate the state for %d tokens: %s", e->o.ctx, cn_strerror(rc));
    if (k == 0 && (rc = cn_pc_init(&e->pc, L->live, &e->o.cache)))
        return cn_err_set(err, rc, "cannot set up the prefix cache: %s", cn_strerror(rc));
    /* The drafter and its draft cache: a property of the model, built before the disk tier so
     * that the files hold the draft's rows and pair keys too. */
    if (cn_model_has_mtp(e->m) && (k == 0 || e->lanes[0].spec)) {
        rc = cn_spec_open(&L->spec, e->m, e->o.ctx, e->o.spec_depth, e->o.spec_fixed);
        if (rc == CN_EINVAL && k == 0) {
            cn_info("engine: the MTP head has recurrent layers; decoding without speculation");
            L->spec = NULL;
        } else if (rc || (k == 0 && (rc = cn_pc_attach_draft(&e->pc, L->spec->draft)))) {
            return cn_err_set(err, rc, "cannot set up the drafter: %s", cn_strerror(rc));
        } else if (!(L->hidden = malloc((size_t)e->o.chunk * c->hidden_size * sizeof *L->hidden))) {
            return cn_err_set(err, CN_ENOMEM, "out of memory");
        }
    }
    if (k > 0 && (rc = cn_pc_add_lane(&e->pc, L->live, L->spec ? L->spec->draft : NULL)) < 0)
        return cn_err_set(err, rc, "cannot add lane %d to the prefix cache: %s", k, cn_strerror(rc));
    if (!(L->logits = malloc((size_t)c->vocab_size * sizeof *L->logits)))
        return cn_err_set(err, CN_ENOMEM, "out of memory");
    return CN_OK;
}

int cn_engine_open(cn_engine **out, cn_model *m, const cn_engine_opts *o, cn_err *err) {
    cn_engine *e = calloc(1, sizeof *e);
    if (!e) return cn_err_set(err, CN_ENOMEM, "out of memory");
    e->m = m;
    if (o) e->o = *o;
    else e->o.cache.pre_end = 4;
    if (e->o.ctx <= 0) e->o.ctx = 4096;
    if (e->o.lanes <= 0) e->o.lanes = 1;
    if (e->o.lanes > 1 && e->o.no_cache) { /* a cold run resets the one cache before each request */
        free(e);
        return cn_err_set(err, CN_EINVAL, "cold runs (no cache) take one lane");
    }
    /* a device forwards a whole piece (2048 tokens) in milliseconds: cancels stay prompt there,
     * and smaller forwards would halve its prefill; the CPU keeps 512 so a cancel is honoured
     * within seconds on a large model */
    if (e->o.chunk <= 0)
        e->o.chunk = strcmp(cn_backend_name(cn_model_backend(m)), "cpu") ? cn_model_ubatch(m) : 512;
    const cn_config *c = cn_model_config(m);
    int rc = CN_OK;
    if (pthread_mutex_init(&e->mu, NULL)) {
        free(e);
        return cn_err_set(err, CN_ENOMEM, "cannot create the engine's lock");
    }
    if (pthread_cond_init(&e->gate_cv, NULL) || pthread_cond_init(&e->join_cv, NULL)) {
        pthread_mutex_destroy(&e->mu);
        free(e);
        return cn_err_set(err, CN_ENOMEM, "cannot create the engine's conditions");
    }
    e->lanes = calloc((size_t)e->o.lanes, sizeof *e->lanes);
    e->eos = malloc((size_t)(c->n_eos ? c->n_eos : 1) * sizeof *e->eos);
    if (!e->lanes || !e->eos) {
        rc = cn_err_set(err, CN_ENOMEM, "out of memory");
        goto fail;
    }
    for (int k = 0; k < e->o.lanes; k++)
        if ((rc = lane_open(e, k, err))) goto fail;
    e->live = e->lanes[0].live;
    e->spec = e->lanes[0].spec;
    /* A cold-run engine restores nothing, so it neither reads nor writes the disk tier. */
    if (e->o.cache_dir && !e->o.no_cache &&
        (rc = cn_pc_attach_disk(&e->pc, e->o.cache_dir, cn_model_identity(m), e->o.disk_budget, err)))
        goto fail;
    e->o.cache_dir = NULL; /* the caller's string; the tier keeps its own copy */
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
    if (e->lanes && e->lanes[0].live) cn_pc_free(&e->pc);
    for (int k = 0; e->lanes && k < e->o.lanes; k++) {
        cn_engine_lane *L = &e->lanes[k];
        cn_spec_close(L->spec);
        free(L->hidden);
        cn_state_free(L->live);
        free(L->logits);
    }
    free(e->lanes);
    free(e->eos);
    pthread_cond_destroy(&e->gate_cv);
    pthread_cond_destroy(&e->join_cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

/* CLOCK_REALTIME ms from now: a pthread_cond_timedwait deadline. */
static struct timespec deadline_ms(long ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    return ts;
}

static void lock(cn_engine *e) {
    atomic_fetch_add(&e->lock_wanted, 1);
    pthread_mutex_lock(&e->mu);
    atomic_fetch_sub(&e->lock_wanted, 1);
    atomic_fetch_add(&e->lock_epoch, 1);
}

static void unlock(cn_engine *e) { pthread_mutex_unlock(&e->mu); }

/* After a prefill chunk, with the lock given up: a lane that waits for the lock (its decode
 * token, its own chunk, its in-flight join) takes it before this one takes it again. A mutex
 * hands itself to whoever asks first after the unlock, which is most often the thread that just
 * gave it up, so a long prompt would otherwise run chunk after chunk while the others wait. */
static void let_others(cn_engine *e) {
    const unsigned ep = atomic_load(&e->lock_epoch);
    for (int i = 0; i < 1000 && atomic_load(&e->lock_wanted) > 0 && atomic_load(&e->lock_epoch) == ep; i++)
        sched_yield();
}

static int is_eos(const cn_engine *e, int32_t t) {
    for (int i = 0; i < e->n_eos; i++)
        if (e->eos[i] == t) return 1;
    return 0;
}

/* After a forward of lane L absorbed [from, to): the cache records it, and with a drafter each
 * position's hidden is queued as a draft slot with the token after it (-1 for the last known
 * token, whose successor is yet to be sampled). */
static int absorbed(cn_engine *e, cn_engine_lane *L, cn_pc_session *sess, const int32_t *tokens,
                    int from, int to, int known, cn_rsnap *caps, int nc) {
    int rc = cn_pc_absorbed(&e->pc, sess, from, to, caps, nc);
    if (rc || !L->spec) return rc;
    int32_t next[64];
    for (int s = from; !rc && s < to; s += 64) {
        int k = to - s < 64 ? to - s : 64;
        for (int i = 0; i < k; i++) next[i] = s + i + 1 < known ? tokens[s + i + 1] : -1;
        rc = cn_spec_feed(L->spec, L->hidden + (size_t)(s - from) * L->spec->H, next, k, 1);
    }
    return rc;
}

#define GATE_WAIT_MS 5 /* the longest a step waits for a running lane that is not at the gate */

/* Lane L's forward over [from, to) alone, capturing where its session asks (caller holds the
 * lock): one ordinary cn_model_forward. */
static int forward_alone(cn_engine *e, cn_engine_lane *L, cn_pc_session *sess, const int32_t *tokens,
                         int from, int to, int want_logits, int known, int32_t *greedy) {
    int at[64];
    cn_rsnap caps[64];
    int nc = cn_pc_captures_in(sess, from, to, at, 64);
    cn_batch bt = {.tokens = tokens + from, .n = to - from,
                   .logits = want_logits && !greedy ? L->logits : NULL, .argmax = greedy,
                   .capture_at = at, .n_capture = nc, .captures = caps};
    if (L->spec) {
        bt.all_hidden = 1;
        bt.hidden = L->hidden;
    }
    int rc = cn_model_forward(e->m, L->live, &bt);
    return rc ? rc : absorbed(e, L, sess, tokens, from, to, known, caps, nc);
}

#define GATE_CAPS 8 /* restore points a lane's step may carry into the shared forward */

/* The step gate (caller holds the lock): every lane waiting here (a decode token, or a prefill
 * chunk) goes into one forward of all of them, its restore points captured inside it, as long as
 * the model's piece holds their rows (a lane that does not fit, or asks for more than GATE_CAPS
 * restore points, runs alone first). Wakes them all. */
static void run_gate(cn_engine *e) {
    cn_seq_batch sb[64];
    cn_engine_lane *in[64];
    int at[64][GATE_CAPS];
    cn_rsnap caps[64][GATE_CAPS];
    const int U = cn_model_ubatch(e->m);
    int n = 0, rows = 0;
    for (int k = 0; k < e->o.lanes; k++) {
        cn_engine_lane *L = &e->lanes[k];
        if (!L->gate_want) continue;
        const int from = L->gate_from, to = L->gate_to, len = to - from;
        int all[GATE_CAPS + 1];
        const int nc = cn_pc_captures_in(L->run, from, to, all, GATE_CAPS + 1);
        if (n == 64 || nc > GATE_CAPS || len > U - rows) {
            L->gate_rc = forward_alone(e, L, L->run, L->gate_ids, from, to, L->gate_logits, L->gate_known,
                                       L->gate_greedy ? &L->gate_pick : NULL);
            L->gate_want = 0;
            L->gate_done = 1;
            continue;
        }
        memcpy(at[n], all, (size_t)nc * sizeof *all);
        sb[n] = (cn_seq_batch){.state = L->live, .tokens = L->gate_ids + from, .n = len,
                               .logits = L->gate_logits && !L->gate_greedy ? L->logits : NULL,
                               .argmax = L->gate_greedy ? &L->gate_pick : NULL,
                               .hidden = L->spec ? L->hidden : NULL, .all_hidden = L->spec != NULL,
                               .capture_at = at[n], .n_capture = nc, .captures = caps[n]};
        in[n++] = L;
        rows += len;
    }
    int rc = n ? cn_model_forward_seqs(e->m, sb, n) : CN_OK;
    /* a model the batched forward does not take (sliding windows): each lane alone, in turn */
    const int apart = rc == CN_EUNSUPPORTED;
    if (n > 1 && !apart) {
        e->gate_steps++;
        e->gate_tokens += (uint64_t)rows;
    }
    for (int i = 0; i < n; i++) {
        cn_engine_lane *L = in[i];
        int lrc = apart ? cn_model_forward_seqs(e->m, &sb[i], 1) : rc;
        /* the captures move into the cache (absorbed frees them) */
        if (!lrc)
            lrc = absorbed(e, L, L->run, L->gate_ids, L->gate_from, L->gate_to, L->gate_known,
                           caps[i], sb[i].n_capture);
        L->gate_shared += n > 1 && !apart;
        L->gate_rc = lrc;
        L->gate_want = 0;
        L->gate_done = 1;
    }
    e->n_ready = 0;
    pthread_cond_broadcast(&e->gate_cv);
}

/* A request of lane L starts or stops running (caller holds the lock): the gate waits for the
 * running lanes only, so one that stops may complete the step the others wait for. */
static void set_active(cn_engine *e, int on) {
    e->n_active += on ? 1 : -1;
    if (!on && e->n_ready > 0 && e->n_ready >= e->n_active) run_gate(e);
}

/* Forwards tokens [from, to) of lane L (tokens[0..known) are known), capturing at scheduled
 * offsets (caller holds the lock). With `greedy` the last position's greedy pick lands there
 * (taken on the backend) instead of its logits in L->logits. With several lanes it goes through
 * the gate: it runs in one forward with every other running lane's next step, the lock given up
 * while it waits for them. */
static int forward(cn_engine *e, cn_engine_lane *L, cn_pc_session *sess, const int32_t *tokens, int from,
                   int to, int want_logits, int known, int32_t *greedy) {
    if (e->o.lanes == 1) return forward_alone(e, L, sess, tokens, from, to, want_logits, known, greedy);
    L->gate_ids = tokens; /* sess is L->run, which the gate reads */
    L->gate_from = from;
    L->gate_to = to;
    L->gate_known = known;
    L->gate_logits = want_logits;
    L->gate_greedy = greedy != NULL;
    L->gate_done = 0;
    L->gate_want = 1;
    if (++e->n_ready >= e->n_active) run_gate(e);
    while (!L->gate_done) {
        /* a lane away in its callbacks for longer than GATE_WAIT_MS joins the step after: the
         * others never wait on what a callback does (it might wait on them) */
        const struct timespec ts = deadline_ms(GATE_WAIT_MS);
        if (pthread_cond_timedwait(&e->gate_cv, &e->mu, &ts) == ETIMEDOUT && !L->gate_done) run_gate(e);
    }
    if (greedy) *greedy = L->gate_pick;
    return L->gate_rc;
}

/* Samples the next token from L->logits under the request's mask (which may rewrite the row), or
 * takes `picked` (>= 0: the backend's greedy pick, for a request without mask whose sampler is
 * greedy). Returns 0 with *t, or 1: the mask ends the output here, as an end of sequence would. */
static int pick(cn_engine *e, cn_engine_lane *L, const cn_request *r, cn_sampler *smp, int32_t picked,
                int32_t *t) {
    if (picked >= 0) {
        *t = picked;
        return 0;
    }
    if (r->mask) {
        float keep[16];
        int ne = e->n_eos < 16 ? e->n_eos : 16;
        for (int i = 0; i < ne; i++) keep[i] = L->logits[e->eos[i]];
        int fl = r->mask->apply(r->mask->ctx, L->logits, cn_model_config(e->m)->vocab_size);
        if (fl & CN_MASK_ONLY_EOS) return 1;
        for (int i = 0; i < ne; i++) L->logits[e->eos[i]] = (fl & CN_MASK_EOS_OK) ? keep[i] : -INFINITY;
    }
    *t = cn_sampler_sample(smp, L->logits);
    return 0;
}

/* ---- decoding with a drafter -------------------------------------------------------------------- */

/* One request's decode state with a drafter: what the speculative loop threads through. */
typedef struct dec {
    cn_engine *e;
    cn_engine_lane *L;
    const cn_request *r;
    cn_result *res;
    cn_pc_session *sess;
    cn_sampler *smp;
    int32_t *all;   /* [n + max_tokens + 1] prompt then generated tokens */
    int n;          /* prompt tokens */
    uint32_t prev;  /* key symbol of the last token keyed (pairs pack it with the next) */
    int rc;         /* CN_ECANCELED or an error that ended decoding */
} dec;

enum { GO = 0, STOP = 1 };

/* Takes a token the sampler produced: its pair key is recorded (an end-of-sequence closes the
 * last pair too, though it is not output), then it is recorded, handed out and checked against
 * every way decoding stops. Returns GO or STOP. */
static int take(dec *d, int32_t t) {
    cn_result *res = d->res;
    const cn_request *r = d->r;
    int rc = cn_pc_push_key(d->sess, ((cn_key)d->prev << 32) | (uint32_t)t);
    d->prev = (uint32_t)t;
    if (rc) {
        d->rc = rc;
        return STOP;
    }
    if (!r->ignore_eos && is_eos(d->e, t)) {
        res->stop = CN_STOP_EOS;
        return STOP;
    }
    res->tokens[res->eval_count++] = t;
    d->all[d->n + res->eval_count - 1] = t;
    if (r->mask) r->mask->accept(r->mask->ctx, t);
    if (r->on_token && r->on_token(r->ctx, t)) {
        res->stop = CN_STOP_CALLER;
        return STOP;
    }
    if (r->cancel && r->cancel(r->ctx)) {
        d->rc = CN_ECANCELED;
        res->stop = CN_STOP_CANCELED;
        return STOP;
    }
    return res->eval_count == r->max_tokens ? STOP : GO;
}

/* The mask ended the output: as if an end of sequence had been sampled, which closes the last
 * pair (*t gets the id that closes it). Returns STOP. */
static int end_here(dec *d, int32_t *t) {
    *t = d->e->n_eos ? d->e->eos[0] : 0;
    int rc = cn_pc_push_key(d->sess, ((cn_key)d->prev << 32) | (uint32_t)*t);
    d->prev = (uint32_t)*t;
    if (rc) d->rc = rc;
    d->res->stop = CN_STOP_EOS;
    return STOP;
}

/* DECODE with a drafter: plain steps or speculative rounds, as the controller (or the request)
 * decides; every step keeps the draft cache level with the target. Called without the lock: it
 * is taken for the forwards, never across a callback (take). A lane speculates only while no
 * other lane runs: the others would wait for its rounds at the gate. */
static int decode_spec(dec *d) {
    cn_engine *e = d->e;
    cn_engine_lane *L = d->L;
    cn_spec *sp = L->spec;
    cn_result *res = d->res;
    int speculate = !d->r->no_speculate && !e->o.no_speculate && !d->r->mask;
    /* a greedy request without mask takes a plain step's pick on the backend: 4 bytes to the
     * host, not the logits (beside other lanes, a download of every lane's logits each step) */
    const int greedy = !d->r->mask && cn_sampler_is_greedy(d->smp);
    int32_t cur = 0;
    int st = pick(e, L, d->r, d->smp, -1, &cur) ? end_here(d, &cur) : take(d, cur);
    if (st == GO) cn_sampler_accept(d->smp, cur);
    cn_spec_close_pair(sp, cur);
    /* one clock read per step: a step's end is the next one's start (cn_spec_now may be a
     * system call) */
    double t0 = cn_spec_now(sp), t1;
    while (st == GO) {
        int budget = d->r->max_tokens - res->eval_count - 1; /* drafts that leave room for one more */
        lock(e);
        int depth = speculate && e->n_active <= 1 ? cn_spec_ctl_pick(&sp->ctl, budget) : 0;
        if (depth == 0) {
            int at = L->live->offset;
            int32_t picked = -1;
            d->rc = forward(e, L, d->sess, d->all, at, at + 1, 1, at + 1, greedy ? &picked : NULL);
            unlock(e);
            if (d->rc) break;
            res->plain_steps++;
            st = pick(e, L, d->r, d->smp, picked, &cur) ? end_here(d, &cur) : take(d, cur);
            if (st == GO) cn_sampler_accept(d->smp, cur);
            cn_spec_close_pair(sp, cur);
            cn_spec_ctl_plain(&sp->ctl, (t1 = cn_spec_now(sp)) - t0);
            t0 = t1;
            continue;
        }
        d->rc = cn_spec_round(sp, L->live, d->smp, cur, depth);
        unlock(e);
        if (d->rc) break;
        int keep = sp->n_out - 1;
        for (int i = 0; i < sp->n_out && st == GO; i++) {
            st = take(d, sp->out[i]);
            keep = i;
        }
        res->spec_rounds++;
        res->draft_proposed += depth;
        res->draft_accepted += sp->n_acc < keep + 1 ? sp->n_acc : keep + 1;
        for (int j = 0; j < depth; j++) {
            res->pos_proposed[j]++;
            res->pos_accepted[j] += j < sp->n_acc;
        }
        lock(e);
        int crc = cn_spec_commit(sp, L->live, keep);
        unlock(e);
        if (crc) {
            d->rc = crc;
            break;
        }
        cur = sp->out[keep];
        cn_spec_ctl_round(&sp->ctl, depth, sp->n_acc, (t1 = cn_spec_now(sp)) - t0);
        t0 = t1;
    }
    return d->rc;
}

/* The in-flight join (engine.h), before lane `lane` begins over keys[0, nk) (caller holds the
 * lock; it is given up while waiting). Returns 0 or CN_ECANCELED (the request's cancel callback
 * fired while it waited). */
static int join_wait(cn_engine *e, int lane, const cn_request *r, const cn_key *keys, int nk) {
    int matched = 0;
    cn_trie_match(&e->pc.trie, keys, nk, &matched);
    cn_engine_lane *A = NULL;
    int shared = 0;
    for (int k = 0; k < e->o.lanes; k++) {
        cn_engine_lane *B = &e->lanes[k];
        if (k == lane || !B->run || !B->prefilling) continue;
        const cn_pc_session *s = B->run;
        int d = 0, lim = nk < s->n_prompt ? nk : s->n_prompt;
        while (d < lim && keys[d] == s->keys[d]) d++;
        if (d > shared) shared = d, A = B;
    }
    if (!A || shared < matched + CN_JOIN_MIN || A->live->offset >= shared) return CN_OK;
    /* where the two part: a restore point in the running prefill (it dedups), one that resists
     * merging, as the next restore point of that prefill would merge it away before this one
     * wakes */
    if (shared <= A->run->restored || cn_pc_schedule(A->run, shared, 1)) return CN_OK;
    const uint64_t id = A->run_id;
    /* until it is in the trie, or that request passed it anyway (a capture it could not keep),
     * stopped absorbing or ended */
    while (matched < shared && A->run_id == id && A->run && A->prefilling && A->live->offset < shared) {
        const struct timespec ts = deadline_ms(100); /* the cancel poll's period */
        pthread_cond_timedwait(&e->join_cv, &e->mu, &ts);
        if (r->cancel) {
            unlock(e);
            int stop = r->cancel(r->ctx);
            lock(e);
            if (stop) return CN_ECANCELED;
        }
        cn_trie_match(&e->pc.trie, keys, nk, &matched);
    }
    return CN_OK;
}

int cn_engine_generate(cn_engine *e, const cn_request *r, cn_result *res) {
    return cn_engine_generate_on(e, 0, r, res);
}

int cn_engine_generate_on(cn_engine *e, int lane, const cn_request *r, cn_result *res) {
    memset(res, 0, sizeof *res);
    const cn_config *c = cn_model_config(e->m);
    int n = r->n_tokens;
    if (lane < 0 || lane >= e->o.lanes) return CN_EINVAL;
    cn_engine_lane *L = &e->lanes[lane];
    if (n <= 0 || !r->tokens || r->max_tokens < 0) return CN_EINVAL;
    for (int i = 0; i < n; i++)
        if (r->tokens[i] < 0 || r->tokens[i] >= c->vocab_size) return CN_EINVAL;
    if ((int64_t)n + r->max_tokens > e->o.ctx) return CN_ECONTEXT;
    cn_sampler smp;
    if (cn_sampler_init(&smp, &r->sampling, c->vocab_size)) return CN_EINVAL;
    int32_t *all = malloc(((size_t)n + r->max_tokens + 1) * sizeof *all);
    cn_key *keys = malloc((size_t)n * sizeof *keys);
    res->tokens = malloc(((size_t)r->max_tokens + 1) * sizeof *res->tokens);
    int rc = all && keys && res->tokens ? CN_OK : CN_ENOMEM;
    if (!rc) memcpy(all, r->tokens, (size_t)n * sizeof *all);
    if (!rc && cn_keys_build(all, n, r->media, r->n_media, 0, keys))
        rc = CN_EINVAL; /* media items out of order or outside the prompt */
    /* a cold run restores nothing (one lane: cmd options make no_cache engines of one) */
    if (!rc && e->o.no_cache) {
        lock(e);
        rc = cn_pc_reset(&e->pc);
        unlock(e);
    }
    if (rc) {
        free(keys);
        free(all);
        free(res->tokens);
        res->tokens = NULL;
        cn_sampler_free(&smp);
        return rc;
    }
    /* With a drafter, key i packs (symbol i, symbol i+1): n tokens give n-1 keys. */
    int nk = n;
    uint32_t last_sym = (uint32_t)keys[n - 1];
    if (L->spec) {
        for (int i = 0; i + 1 < n; i++) keys[i] = (keys[i] << 32) | (uint32_t)keys[i + 1];
        nk = n - 1;
    }
    double t0 = now_ms();
    cn_pc_session sess;
    int active = 0; /* counted in e->n_active */
    L->gate_shared = 0;
    lock(e);
    rc = e->o.lanes > 1 ? join_wait(e, lane, r, keys, nk) : CN_OK;
    if (!rc) rc = cn_pc_begin_on(&e->pc, lane, &sess, keys, nk);
    free(keys);
    if (rc == CN_ECANCELED) res->stop = CN_STOP_CANCELED;
    if (rc) goto out;
    L->run = &sess;
    L->run_id++;
    L->prefilling = 1;
    set_active(e, 1);
    active = 1;
    res->prompt_tokens = n;
    res->matched_tokens = sess.matched;
    res->cached_tokens = sess.restored;
    if (L->spec) {
        cn_spec_begin(L->spec);
        if (L->spec->draft->offset != sess.restored) {
            rc = CN_EINVAL; /* the prefix cache restores target and draft as one level */
            goto close;
        }
        /* Nothing will close the prompt's last pair: a restore point where the keys end. */
        if (r->max_tokens == 0 && n - 1 > sess.restored) rc = cn_pc_schedule(&sess, n - 1, 0);
        if (rc) goto close;
    }

    /* The caller's marks: restore points that resist merging, captured inside the forwards. */
    for (int i = 0; !rc && i < r->n_marks; i++)
        if (r->marks[i] > sess.restored && r->marks[i] < n) rc = cn_pc_schedule(&sess, r->marks[i], 1);
    if (rc) goto close;

    /* PREFILL: forwards end at chunk boundaries and at the spacing's restore points (the
     * cancellation points). The others (the branch point, the one before the prompt's end) are
     * captured inside a forward: cutting there would cost a pass over the weights for a few
     * tokens and buy no cancellation point worth having. The lock is given up between chunks:
     * the other lanes' decode steps and chunks run there. */
    int pos = sess.restored;
    while (pos < n) {
        int end = pos + e->o.chunk < n ? pos + e->o.chunk : n;
        for (int i = 0; i < sess.n_sched; i++)
            if (sess.sched[i] > pos && sess.sched[i] < end && sess.sched[i] % e->pc.o.spacing == 0) {
                end = sess.sched[i];
                break;
            }
        if ((rc = forward(e, L, &sess, all, pos, end, end == n, n, NULL))) goto close;
        if (L->spec && (rc = cn_spec_flush(L->spec))) goto close; /* level at every chunk's end */
        /* the restore points passed join the trie now (with a disk tier, their files are queued):
         * a process killed later in this prompt resumes from the last one on disk */
        if ((rc = cn_pc_commit(&e->pc, &sess))) goto close;
        if (e->o.lanes > 1) pthread_cond_broadcast(&e->join_cv); /* a joining lane may begin */
        res->prompt_eval_count += end - pos;
        pos = end;
        if (pos < n) cn_pc_evict_step(&e->pc, 1); /* what closes left over budget, a node at a time */
        unlock(e);
        if (e->o.lanes > 1) let_others(e);
        if (r->on_progress) r->on_progress(r->ctx, pos, n);
        int stop = pos < n && r->cancel && r->cancel(r->ctx);
        lock(e);
        if (stop) {
            rc = CN_ECANCELED;
            res->stop = CN_STOP_CANCELED;
            goto close;
        }
    }
    res->prompt_ms = now_ms() - t0;
    if (r->prompt_logits) memcpy(r->prompt_logits, L->logits, (size_t)c->vocab_size * sizeof(float));
    if (r->draft_logits && L->spec && L->spec->last_at == n - 1)
        memcpy(r->draft_logits, L->spec->last_logits, (size_t)c->vocab_size * sizeof(float));
    for (int i = 0; i < n; i++) cn_sampler_accept(&smp, all[i]);

    /* DECODE: record, hand out, then forward (the last token is never forwarded). The lock is
     * held for the forwards only. */
    double t1 = now_ms();
    res->stop = CN_STOP_LENGTH;
    L->prefilling = 0;
    unlock(e);
    if (L->spec) {
        if (r->max_tokens > 0) {
            dec d = {e, L, r, res, &sess, &smp, all, n, last_sym, CN_OK};
            rc = decode_spec(&d);
        }
        res->eval_ms = now_ms() - t1;
        lock(e);
        goto close;
    }
    /* a greedy request without mask brings 4 bytes per token to the host, not its logits */
    const int greedy = !r->mask && cn_sampler_is_greedy(&smp);
    int32_t picked = -1; /* the last forward's greedy pick (greedy), else -1 */
    while (res->eval_count < r->max_tokens) {
        int32_t t = 0;
        if (pick(e, L, r, &smp, picked, &t) || (!r->ignore_eos && is_eos(e, t))) {
            res->stop = CN_STOP_EOS;
            break;
        }
        res->tokens[res->eval_count++] = t;
        all[n + res->eval_count - 1] = t;
        if (r->mask) r->mask->accept(r->mask->ctx, t);
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
        int at = L->live->offset;
        lock(e);
        rc = forward(e, L, &sess, all, at, at + 1, 1, at + 1, greedy ? &picked : NULL);
        unlock(e);
        if (rc) break;
    }
    res->eval_ms = now_ms() - t1;
    lock(e);
close:
    {
        if (active) set_active(e, 0);
        /* The draft settles on every path: the final token closed its last pair, or a cancelled
         * prefill stopped at a chunk's end where every pair is closed. */
        int crc = L->spec ? cn_spec_flush(L->spec) : CN_OK;
        if (!rc) rc = crc;
        /* after a failed forward the recurrent state is undefined: never record it */
        if (rc && rc != CN_ECANCELED) e->pc.lanes[lane].live_stale = 1;
        crc = cn_pc_close(&e->pc, &sess);
        if (!rc) rc = crc;
        L->run = NULL;
        L->prefilling = 0;
        if (e->o.lanes > 1) pthread_cond_broadcast(&e->join_cv);
    }
    res->batched_steps = L->gate_shared;
    char beside[64] = "";
    if (res->batched_steps)
        snprintf(beside, sizeof beside, ", %d steps beside other requests", res->batched_steps);
    cn_log(CN_LOG_INFO, "request: %d tokens, %d matched, %d restored from cache, %d evaluated, %d generated%s%s",
           n, res->matched_tokens, res->cached_tokens, res->prompt_eval_count, res->eval_count, beside,
           rc == CN_ECANCELED ? " (canceled)" : "");
out:
    unlock(e);
    free(all);
    cn_sampler_free(&smp);
    return rc;
}

int cn_engine_maintain(cn_engine *e, int max_nodes) {
    lock(e);
    int more = cn_pc_evict_step(&e->pc, max_nodes);
    unlock(e);
    return more;
}
