/* engine.h - a request's life over one loaded model: begin, prefill with restore points, decode,
 * close (DESIGN.md §2).
 *
 *     QUEUED -> PREFILL [cn_engine_generate: cn_pc_begin, cn_spec_begin]
 *     PREFILL -> DECODE  (prompt absorbed; logits of its last token sampled)
 *     DECODE -> DECODE   a plain step, or a speculative round [cn_spec_round, cn_spec_commit]
 *     PREFILL/DECODE -> CLOSED [cn_spec_flush, cn_pc_close]  on success, error AND cancellation
 *
 * With an MTP head (speculate.h) the engine also owns the drafter and its draft cache, built at
 * open: the prefix cache keys token pairs and keeps the draft's rows with the target's. Every
 * request keeps the draft cache level; one that asks for no speculation, or has a logits mask
 * (or logprobs, once they exist), decodes plainly, and the depth controller parks speculation on its own when it does not
 * pay. Either way the tokens are those plain decoding gives (greedy), or drawn from the same
 * distribution (sampling).
 *
 * The engine owns the model's live state and prefix cache, built once at open and reused by
 * every request. A cancel callback is polled between forwards (every `chunk` tokens and at every
 * restore point of the spacing; the branch point and the one before the prompt's end are
 * captured inside a forward), so a cancel is honoured within one chunk's time and everything the prefill
 * absorbed stays in the cache for the retry. Every generated token is recorded before it is
 * handed to on_token.
 *
 * Lanes. An engine opened with `lanes` N runs up to N requests at once, one per lane, each from
 * its own thread (cn_engine_generate_on): every lane has its own live state (and drafter) and all
 * share the one prefix cache, so a request begins from whatever any lane recorded. The model and
 * the cache are used by one thread at a time (the engine's lock, held for forwards and cache
 * work, never across a callback). Every running lane brings its next step to the gate (a decode
 * token, or its next prefill chunk) and the steps of all of them run as one forward
 * (cn_model_forward_seqs), each lane waiting for the others to be ready: a prompt being absorbed
 * costs the decoding lanes one larger step a chunk, never a wait of its own; restore points are
 * captured inside that forward. A lane speculates only while no other lane runs. On the CPU a request's tokens do not depend on what runs beside it (model.h,
 * cn_model_forward_seqs).
 *
 * The in-flight join: a request whose prompt shares with another lane's running prefill more than
 * the trie holds (CN_JOIN_MIN keys past its match, or more) has that prefill capture a restore
 * point where the two prompts part, waits until it is in the trie (or that request ends), and
 * begins from there: two requests that arrive together with one long shared prefix evaluate it
 * once. Its cancel callback is polled while it waits.
 */
#define CN_JOIN_MIN 64
#ifndef CN_ENGINE_H
#define CN_ENGINE_H

#include <pthread.h>
#include <stdint.h>

#include "base/error.h"
#include "cache/prefix_cache.h"
#include "engine/sampler.h"
#include "engine/speculate.h"
#include "model/model.h"

typedef struct cn_engine_opts {
    int ctx;          /* tokens per sequence (0: 4096) */
    int chunk;        /* tokens per prefill forward (0: 512 on the CPU, the model's piece elsewhere) */
    cn_pc_opts cache; /* restore-point spacing, RAM budget */
    int no_cache;     /* 1: every request starts from token 0 (cold runs for comparison) */
    const char *cache_dir; /* (optional) the disk tier's folder: restore points survive a restart */
    uint64_t disk_budget;  /* bytes of restore points kept there (0: 16 GiB) */
    int spec_depth;        /* most drafts per speculative round (0: 4; at most CN_SPEC_MAX_DEPTH) */
    int spec_fixed;        /* 1: always spec_depth drafts (tests, benchmarks); 0: the controller */
    int no_speculate;      /* 1: every request decodes plainly (the draft cache is still kept) */
    int lanes;             /* requests that may run at once (0: 1), each in a lane of its own */
} cn_engine_opts;

/* One lane: the live state a request runs in, with its drafter and scratch; the step gate's
 * slot (engine.c) while it waits for a batched step. */
typedef struct cn_engine_lane {
    cn_state *live;        /* owned */
    cn_spec *spec;         /* owned; NULL without a usable MTP head */
    float *logits;         /* [vocab] scratch */
    float *hidden;         /* [chunk][H] target hiddens of one forward, for the drafter */
    const int32_t *gate_ids; /* its next step: ids [gate_from, gate_to) of these, the first
                              * gate_known of them known */
    int gate_from, gate_to, gate_known;
    int32_t gate_pick;
    int gate_want, gate_done, gate_rc, gate_logits, gate_greedy;
    int gate_shared;       /* the running request's steps taken beside other lanes' */
    cn_pc_session *run;    /* the running request's session from begin to close, else NULL */
    uint64_t run_id;       /* counts the requests begun in this lane */
    int prefilling;        /* it is absorbing its prompt */
} cn_engine_lane;

typedef struct cn_engine {
    cn_model *m;          /* not owned */
    cn_engine_opts o;
    cn_prefix_cache pc;   /* one lane per engine lane, same index */
    int32_t *eos;         /* [n_eos] stop ids from the model's generation config */
    int n_eos;
    cn_engine_lane *lanes; /* [o.lanes] */
    /* lane 0's, the only ones of a one-lane engine: */
    cn_state *live;       /* the live caches */
    cn_spec *spec;        /* the drafter and depth controller; NULL without a usable MTP head */
    pthread_mutex_t mu;   /* the model, the cache and the gate */
    pthread_cond_t gate_cv;
    pthread_cond_t join_cv; /* a lane committed restore points or closed (the in-flight join) */
    _Atomic int lock_wanted;       /* threads blocked taking mu (lock() in engine.c) */
    _Atomic unsigned lock_epoch;   /* times mu was taken through lock() */
    int n_active;         /* lanes whose request runs (begun, not closed) */
    int n_ready;          /* of the lanes at the gate, waiting for the next step */
    uint64_t gate_steps;  /* counters for tests and logs: forwards of several lanes at once */
    uint64_t gate_tokens; /* and the tokens they took */
} cn_engine;

/* Polled between forwards; nonzero cancels the request. */
typedef int (*cn_cancel_fn)(void *ctx);
/* Called with each generated token after it is recorded; nonzero stops generation. */
typedef int (*cn_token_fn)(void *ctx, int32_t token);
/* Called after each prefill forward: `done` of `total` prompt tokens are in the caches (restored
 * ones included), so a server can send keep-alives with progress during a long prompt. */
typedef void (*cn_progress_fn)(void *ctx, int done, int total);

/* Flags a logits mask returns. */
enum {
    CN_MASK_EOS_OK = 1,   /* the output may end here: end-of-sequence ids keep their logits */
    CN_MASK_ONLY_EOS = 2, /* the output must end here: decoding stops as at an end of sequence */
};

/* A constraint on what may be generated (structured output, forced tool calls). */
typedef struct cn_logit_mask {
    /* Before every sample: sets the logits of tokens that may not come next to -INFINITY. The
     * end-of-sequence ids are the engine's business: it gives them back their logits with
     * CN_MASK_EOS_OK and masks them without. Returns CN_MASK_* flags. */
    int (*apply)(void *ctx, float *logits, int n_vocab);
    /* After every token taken (never an end of sequence), before on_token. */
    void (*accept)(void *ctx, int32_t token);
    void *ctx;
} cn_logit_mask;

typedef struct cn_request {
    const int32_t *tokens; /* [n_tokens] the prompt */
    int n_tokens;
    int max_tokens;
    cn_sampler_params sampling;
    cn_cancel_fn cancel;   /* (optional) */
    cn_token_fn on_token;  /* (optional) */
    cn_progress_fn on_progress; /* (optional) */
    int ignore_eos;        /* 1: end-of-sequence ids are ordinary tokens (vLLM's ignore_eos) */
    void *ctx;
    float *prompt_logits;  /* OUT (optional): [vocab] logits after the prompt's last token */
    const cn_media_item *media; /* (optional) [n_media] media expansions in the prompt, sorted: their
                                 * ranges are keyed by content in the cache, the model sees ids */
    int n_media;
    int no_speculate;      /* 1: decode plainly (what logprobs will need); the draft cache is kept */
    const int *marks;      /* (optional) [n_marks] prompt offsets where a restore point is worth
                            * having beyond the cache's own schedule (where the chat's turns
                            * begin: a conversation's next request most often differs there) */
    int n_marks;
    const cn_logit_mask *mask; /* (optional) applied before every sample; a masked request decodes
                                * plainly (exactly: drafts would be verified unmasked) */
    float *draft_logits;   /* OUT (optional): [vocab] the drafter's logits at the prompt's last
                            * pair (slot n-2), for prompts of 2+ tokens on a model with a drafter
                            * (the MTP head's NVFP4 copy where one was built: model.h) */
} cn_request;

typedef enum cn_stop { CN_STOP_LENGTH = 0, CN_STOP_EOS, CN_STOP_CALLER, CN_STOP_CANCELED } cn_stop;

typedef struct cn_result {
    int prompt_tokens;     /* tokens in the prompt */
    int matched_tokens;    /* tokens the trie matched */
    int cached_tokens;     /* tokens restored from the cache, not evaluated */
    int prompt_eval_count; /* prompt tokens evaluated by this request */
    int eval_count;        /* tokens generated */
    int32_t *tokens;       /* [eval_count] generated ids; caller frees (free()) */
    cn_stop stop;
    double prompt_ms, eval_ms;
    /* speculation: drafts proposed and kept (an accepted end-of-sequence counts as kept) */
    int draft_proposed, draft_accepted;
    int spec_rounds;       /* target forwards that verified drafts */
    int plain_steps;       /* target forwards of one generated token */
    int batched_steps;     /* decode steps taken in one forward with other requests' (lanes) */
    int pos_proposed[CN_SPEC_MAX_DEPTH], pos_accepted[CN_SPEC_MAX_DEPTH]; /* per draft position */
} cn_result;

/* With o->cache_dir, the restore points stored there for this model (cn_model_identity) are
 * loaded; files that fail verification are skipped with a warning. An unusable folder is an error
 * naming it. */
int cn_engine_open(cn_engine **out, cn_model *m, const cn_engine_opts *o, cn_err *err);
/* Waits for the disk tier's writer to finish (so a cancelled request's restore points are on
 * disk when the process exits), then frees. */
void cn_engine_close(cn_engine *e);

/* Runs one request. Returns 0 (res->stop says why it ended), CN_ECANCELED (res filled, cache
 * kept), CN_ECONTEXT (prompt + max_tokens past the context), CN_EINVAL (bad ids or sampling
 * parameters), or a backend error; in every case the cache was closed properly. Lane 0. */
int cn_engine_generate(cn_engine *e, const cn_request *r, cn_result *res);
/* The same in lane `lane` (0 <= lane < o.lanes, else CN_EINVAL), one request at a time per lane;
 * requests in different lanes run at once, each from its own thread. */
int cn_engine_generate_on(cn_engine *e, int lane, const cn_request *r, cn_result *res);

/* Between requests (the server when its queue is empty): at most max_nodes of the eviction work
 * earlier closes left (cn_pc_evict_step). Returns 1 while work remains. */
int cn_engine_maintain(cn_engine *e, int max_nodes);

#endif
