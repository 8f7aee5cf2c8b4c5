/* speculate.h - self-speculative decoding with the model's multi-token-prediction (MTP) head.
 *
 * What it promises: output exactly as plain decoding would give it - the same tokens under greedy
 * sampling, the same distribution under any other sampler setting - while committing up to
 * depth + 1 tokens per target forward. Built once per engine (at open) when the model has an MTP
 * head: the drafter (the head's own attention state, the draft cache), the round scratch and the
 * depth controller, which all requests share; each request syncs the drafter to the prefix the
 * prefix cache restored (cn_spec_begin).
 * What it never does: re-run the prefix to roll back (attention rewinds by offset, Mamba loads
 * the state a capture took inside the verify forward), let a speculative draft row survive
 * (every committed draft slot is rewritten from the target's own hidden), or decide what is
 * recorded (the engine records, streams and stops; cn_spec_commit is told how far it got).
 *
 * The draft cache. Slot s of the head fuses the target's post-norm hidden at position s with the
 * token at s + 1, so it can be written only once that token is known. Pending slots wait here
 * (hidden kept on the host) until a flush forwards them through the head in one batch: at the
 * end of every prefill chunk, at every proposal, at close, and whenever CN_SPEC_FLUSH of them
 * pile up during plain decoding. At rest the draft offset equals the target's (the prefix cache
 * records them as one level, with token-pair keys); while the last token is still being sampled
 * the target is one ahead.
 *
 * A round, drawn as a state machine (P = target offset, cur = the sampled, unforwarded token):
 *
 *     LEVEL --cn_spec_round--> VERIFIED --cn_spec_commit(keep)--> LEVEL
 *
 *   LEVEL: target at P, the draft's newest pending slot is (hidden P-1, cur); no capture held.
 *   cn_spec_round: flush the draft (its last row's logits propose d1), apply the head on its own
 *     hidden d-1 more times (speculative draft rows, dropped right after), forward [cur, d1..dd]
 *     through the target in ONE batch with logits and hidden of every row and a Mamba capture at
 *     every position P+1..P+d, then accept by the standard rule: greedy - a draft is kept iff it
 *     is the target's argmax; sampling - kept with probability min(1, p/q), else the token is
 *     drawn from the normalised residual max(0, p - q); all kept - a bonus token from the last
 *     row. out[] = accepted drafts then the one drawn token.
 *   VERIFIED: target at P+1+d, d captures held, out[] decided; the engine records out[0..] and
 *     stops where it must (end of sequence, length, caller, cancel).
 *   cn_spec_commit(keep): out[keep] is the last token the request keeps (recorded, or an EOS that
 *     ends it): the target goes back to P+1+keep (nothing past it, so an accepted EOS keeps no
 *     state past itself), every capture is freed, and the draft slots P..P+keep are queued with
 *     the target's hiddens and out[0..keep].
 *
 * Invariants:
 *  (1) Outside a round no capture is held (n_caps == 0); the capture buffers themselves stay
 *      allocated from the first round that needed them until close (no allocation per round).
 *      Where the backend allows (model.h cn_replay), the captures hold conv tails only and a
 *      rejected draft's SSM states are scanned again from the verify's starting state: a
 *      verify then writes each Mamba state once instead of once per draft.
 *  (2) The draft offset never exceeds the target's outside cn_spec_round; its rows below its
 *      offset are the head's output for committed tokens and target hiddens only.
 *  (3) Every round consumes random draws only through the request's sampler, so a seed fixes it.
 */
#ifndef CN_SPECULATE_H
#define CN_SPECULATE_H

#include <stdint.h>

#include "engine/sampler.h"
#include "model/model.h"
#include "model/state.h"

#define CN_SPEC_MAX_DEPTH 8  /* drafts per round, at most */
#define CN_SPEC_FLUSH 256    /* pending draft slots that trigger a flush during plain decoding */

/* Test-only hook (never set in production code): proposes depth tokens for positions
 * P+1..P+depth in place of the MTP head, each with a one-hot proposal distribution. The draft
 * cache is kept level as usual. Return nonzero to fail the round. */
typedef int (*cn_spec_test_oracle_fn)(void *ctx, int position, int depth, int32_t *tokens);

/* The depth controller: acceptance per draft position as EWMAs; a plain step's cost, a round's
 * cost per draft beyond a plain step and the draft head's cost per slot as medians of their last
 * CN_SPEC_CTL_WIN observations, across requests. It picks the depth that maximises committed
 * tokens per millisecond, parks at 0 (plain decoding) when speculation does not pay and probes
 * again after a back-off that doubles up to 512 plain steps. Three plain steps are taken first
 * and one after every 64 rounds so that the cost of a round is always set against measured plain
 * steps.
 *
 * Why medians: on a shared machine a step of a millisecond is now and then preempted for a
 * scheduler quantum (5-10 ms); one such observation moved an EWMA enough to park speculation for
 * hundreds of steps. A median ignores the outliers while following a lasting change of load.
 * Why the head's cost per slot: plain steps queue their draft slots and a later round flushes
 * them (the catch-up); that work is the plain steps' (plain decoding with a drafter pays it
 * anyway), so it is taken out of the round's cost and added to the plain step's.
 * Which clock: on a backend that computes in host memory, the calling thread's CPU time
 * (cn_spec_now): a step that was preempted took the same work, and on a machine shared with
 * other jobs wall-clock observations of a millisecond-long step are mostly the scheduler's (a
 * quantum lands in one observation in a few and the window fills with them); the thread's CPU
 * time still counts its own spinning while workers finish. A device backend is timed by the
 * wall clock: the host may sleep while the device works. */
#define CN_SPEC_CTL_WIN 15

typedef struct cn_spec_obs {
    double v[CN_SPEC_CTL_WIN];          /* the last observations, a ring */
    int n;                              /* observations so far (the ring holds min(n, WIN)) */
} cn_spec_obs;

typedef struct cn_spec_ctl {
    int max_depth;                      /* 1..CN_SPEC_MAX_DEPTH */
    int fixed;                          /* 1: always max_depth (tests, benchmarks) */
    double acc[CN_SPEC_MAX_DEPTH];      /* P(draft j kept | drafts before it kept) */
    cn_spec_obs plain;                  /* ms of a plain step */
    cn_spec_obs extra;                  /* ms of a round per draft beyond a plain step */
    cn_spec_obs head;                   /* ms of the head per catch-up slot */
    double plain_ms;                    /* median of `plain`; 0 until measured */
    double extra_ms;                    /* median of `extra` */
    double head_ms;                     /* median of `head`; 0 until measured */
    int has_extra;
    int parked;                         /* 1: plain decoding until park_left runs out */
    int park_left;                      /* plain steps before the next probe */
    int backoff;                        /* the next park's length */
    int since_plain;                    /* rounds since the last plain step */
    int skip_cost;                      /* 1: the round in flight allocated (its time is not
                                         * a round's cost) */
    double catchup_ms;                  /* of the round in flight: its flush's time spent on
                                         * slots plain steps queued, and their count */
    int catchup_n;
} cn_spec_ctl;

typedef struct cn_spec {
    cn_model *m;                        /* not owned */
    cn_state *draft;                    /* the MTP head's state (the draft cache); owned */
    int H, V;
    /* pending draft slots draft->offset + i, i < n_pend */
    float *pend_h;                      /* [cap_pend][H] target hidden of each */
    int32_t *pend_next;                 /* [cap_pend] token after each; -1 until known (last only) */
    int n_pend, cap_pend;
    int round_pend;                     /* the oldest pending slots a round's commit queued
                                         * (the rest were queued by plain steps or a prefill) */
    float *last_logits;                 /* [V] head logits of the last slot flushed */
    float *last_hidden;                 /* [H] head output (pre-norm) of the last slot flushed */
    int last_at;                        /* draft offset just after that slot; -1: none */
    /* round scratch */
    int32_t drafts[CN_SPEC_MAX_DEPTH];
    float *q;                           /* [CN_SPEC_MAX_DEPTH][V] proposal distributions */
    float *p;                           /* [V] target distribution of one row */
    float *vlogits;                     /* [CN_SPEC_MAX_DEPTH + 1][V] verify logits */
    float *vhidden;                     /* [CN_SPEC_MAX_DEPTH + 1][H] verify hiddens */
    float *mh;                          /* [H] head hidden while drafting */
    cn_rsnap caps[CN_SPEC_MAX_DEPTH];   /* captures at P+1..P+d of the round in flight; the
                                         * buffers of the first n_caps_alloc live until close */
    int n_caps;                         /* captures the round in flight holds */
    int n_caps_alloc;
    cn_replay rp;                       /* the verify's SSM states as its start and inputs
                                         * (model.h), from the first round until close */
    int rp_state;                       /* 0: not tried yet, 1: rp in use, -1: unsupported */
    int round_p, round_d;               /* P and d of the round in flight */
    int32_t out[CN_SPEC_MAX_DEPTH + 1];
    int n_out, n_acc;
    cn_spec_ctl ctl;
    int cpu_clock;                      /* 1: costs in the thread's CPU time (cn_spec_now) */
    cn_spec_test_oracle_fn oracle;      /* test builds only: see cn_spec_test_oracle_fn */
    void *oracle_ctx;
} cn_spec;

/* Builds the drafter for model m (which must have an MTP head without Mamba layers) for
 * max_ctx tokens; max_depth 0 means 4. Returns 0, CN_EINVAL (no usable head), CN_ENOMEM. */
int cn_spec_open(cn_spec **out, cn_model *m, int max_ctx, int max_depth, int fixed);
void cn_spec_close(cn_spec *sp);

/* A request starts: the draft cache was restored to the target's offset with it (prefix cache);
 * nothing is pending. */
void cn_spec_begin(cn_spec *sp);

/* Queues k slots at the draft's frontier: hidden[i] (H floats) paired with next[i]; only the
 * last next may be -1 (not known yet). With keep_last, more than CN_SPEC_FLUSH pending slots are
 * flushed except the newest. Returns 0 or CN_ENOMEM / a forward error. */
int cn_spec_feed(cn_spec *sp, const float *hidden, const int32_t *next, int k, int keep_last);
/* The token that closes the newest pending slot (no-op when it is closed already). */
void cn_spec_close_pair(cn_spec *sp, int32_t next);
/* Forwards every pending slot whose token is known through the head; last_logits then belong to
 * the last of them. */
int cn_spec_flush(cn_spec *sp);

/* The round from LEVEL to VERIFIED (see the drawing): target live at P = live->offset, cur the
 * token at P, depth in 1..max. On return sp->out[0..n_out) and sp->n_acc (drafts accepted) are
 * set and the sampler has accepted every out token. On error no capture is held and the target's
 * recurrent state is undefined (the request must end). */
int cn_spec_round(cn_spec *sp, cn_state *live, cn_sampler *smp, int32_t cur, int depth);
/* VERIFIED -> LEVEL, keeping out[0..keep] (keep < n_out). */
int cn_spec_commit(cn_spec *sp, cn_state *live, int keep);

/* Now in ms on the clock the controller's costs are measured with (see the controller). */
double cn_spec_now(const cn_spec *sp);

/* The controller: the depth for the next step given that at most budget drafts fit (0: a plain
 * step), then what it cost. */
int cn_spec_ctl_pick(cn_spec_ctl *c, int budget);
void cn_spec_ctl_plain(cn_spec_ctl *c, double ms);
void cn_spec_ctl_round(cn_spec_ctl *c, int depth, int accepted, double ms);

/* Test builds only: replace the MTP proposals by fn (NULL restores them). */
void cn_spec_set_test_oracle(cn_spec *sp, cn_spec_test_oracle_fn fn, void *ctx);

#endif
