/* sampler.h - picks the next token from a row of logits: penalties, top-k, temperature, top-p,
 * min-p, then a seeded draw.
 *
 * The caller owns the cn_sampler struct; cn_sampler_init allocates its scratch once, so sampling
 * never allocates, never fails and never modifies the logits it is given. The pipeline is Ollama's
 * (and llama.cpp's, bar where temperature sits):
 *     penalties -> (temperature 0: argmax) -> top-k -> temperature -> softmax -> top-p -> min-p
 *     -> draw
 * Randomness comes from a private xoshiro256** stream seeded through splitmix64: the same seed,
 * history and logits give the same tokens on every machine (up to the last bit of the C library's
 * expf, which glibc rounds correctly). The sampler never reads the clock: a caller that wants a
 * random seed picks one.
 *
 * Invariants:
 *  (1) Logits are read as: NaN -> -inf (never chosen), +inf -> FLT_MAX (chosen above all finite
 *      ones, ties among them to the lowest id). A -inf token is never returned unless every token
 *      is -inf, in which case the result is token 0.
 *  (2) Candidates are ordered by (logit descending, id ascending), so every tie breaks to the
 *      lowest id; greedy (temperature 0) and top_k == 1 return the same token.
 *  (3) The penalties see exactly the last penalty_last_n accepted tokens (all of them for -1,
 *      none for 0); counts[t] is the number of times t occurs in that window.
 *  (4) Each cn_sampler_sample with temperature > 0 consumes exactly one draw from the stream,
 *      whatever the filters leave; temperature 0 consumes none.
 */
#ifndef CN_SAMPLER_H
#define CN_SAMPLER_H

#include <stdint.h>

typedef struct cn_sampler_params {
    float temperature;       /* >= 0; 0 = greedy (argmax, ties to the lowest id) */
    int top_k;               /* >= 0; 0 = off */
    float top_p;             /* (0, 1]; 1 = off; keep the smallest best-first prefix with mass >= top_p */
    float min_p;             /* [0, 1]; 0 = off; keep tokens with p >= min_p * p_max */
    float repeat_penalty;    /* > 0; 1 = off; for tokens in the window, logit > 0 ? logit / pen : logit * pen */
    float presence_penalty;  /* 0 = off; subtracted once from each token present in the window */
    float frequency_penalty; /* 0 = off; count * penalty subtracted, count = occurrences in window */
    int penalty_last_n;      /* >= -1; window of recent accepted tokens; -1 = all, 0 = penalties off */
    uint64_t seed;           /* any value; the stream restarts from it on init and reset */
} cn_sampler_params;

/* One surviving candidate; scratch, meaningful only inside cn_sampler_sample. */
typedef struct cn_sampler_cand {
    int32_t id;  /* token id */
    float logit; /* after penalties */
    float w;     /* exp((logit - logit_max) / temperature): unnormalized probability, max is 1 */
} cn_sampler_cand;

typedef struct cn_sampler {
    /* read-only after init */
    cn_sampler_params params; /* copy of the validated parameters */
    int vocab_size;           /* V */
    /* private */
    uint64_t rng[4];          /* xoshiro256** state */
    float *work;              /* (V) logits after NaN/inf cleanup and penalties, per sample */
    cn_sampler_cand *cand;    /* (V) candidates, best first once selected */
    uint32_t *counts;         /* (V) occurrences of each token in the penalty window */
    int32_t *ring;            /* (penalty_last_n) last accepted tokens, circular; NULL unless > 0 */
    int ring_len;             /* tokens in ring, <= penalty_last_n */
    int ring_pos;             /* next slot to write */
} cn_sampler;

/* Fills p with Ollama's defaults: temperature 0.8, top_k 40, top_p 0.9, min_p 0, every penalty
 * off (repeat 1, presence 0, frequency 0), penalty_last_n 64, seed 0. This function can't fail. */
void cn_sampler_params_default(cn_sampler_params *p);

/* Validates p and allocates scratch for a vocabulary of vocab_size tokens (about 20 bytes per
 * token). Returns 0; CN_EINVAL for vocab_size < 1 or a parameter outside the ranges above
 * (NaN included); CN_ENOMEM. On error s is zeroed and nothing is held. */
int cn_sampler_init(cn_sampler *s, const cn_sampler_params *p, int vocab_size);
/* Releases the scratch; safe on a zeroed or already-freed sampler. */
void cn_sampler_free(cn_sampler *s);

/* Records a token (prompt or generated) for the penalties: O(1). Returns 0, or CN_EINVAL with
 * the history unchanged when token is outside [0, V). */
int cn_sampler_accept(cn_sampler *s, int32_t token);

/* Returns a token id in [0, V) for logits (V floats, unmodified). It does not accept the token:
 * the caller calls cn_sampler_accept if it keeps it. Cost per call, V = vocab size:
 *   O(V) for the cleanup, the penalties and greedy;
 *   O(V log k) with top_k = k (a bounded heap, never a full sort);
 *   O(V) with top_k and top_p both off (no ordering is needed: min-p is a threshold on w);
 *   top_k off, top_p on: heap-selects the best 64, then 512, 4096, ... until the nucleus fits:
 *   typically one O(V log 64) pass, at worst a handful of passes up to O(V log V).
 * This function can't fail. */
int32_t cn_sampler_sample(cn_sampler *s, const float *logits);

/* 1 if cn_sampler_sample returns exactly the plain greedy pick of the logits whatever the history
 * (temperature 0 and no penalty active: invariant (1) alone), so a caller may take that pick
 * where the logits are (cn_op_argmax) and hand the sampler only cn_sampler_accept. */
int cn_sampler_is_greedy(const cn_sampler *s);

/* The exact distribution cn_sampler_sample draws from for these logits and this history: probs
 * (V floats, OUT) gets each surviving candidate's normalized weight and 0 elsewhere (one-hot on
 * the argmax for temperature 0 or a single finite logit). Returns the most likely token (ties to
 * the lowest id). Consumes no random draw; O(V) plus the cost of the filters. Speculative
 * decoding accepts a draft against this distribution. This function can't fail. */
int32_t cn_sampler_dist(cn_sampler *s, const float *logits, float *probs);

/* One uniform draw in [0, 1) from the sampler's stream (53 bits). */
double cn_sampler_uniform(cn_sampler *s);

/* Draws a token in proportion to weights (V floats, not necessarily normalized; entries <= 0 or
 * NaN are never chosen), consuming exactly one uniform draw. Returns -1 when no weight is
 * positive. O(V). */
int32_t cn_sampler_draw(cn_sampler *s, const float *weights);

/* Forgets the history and restarts the random stream from params.seed: O(V). */
void cn_sampler_reset(cn_sampler *s);

#endif
