/* sampler.c - the token sampler; the contract and invariants are in sampler.h. */
#include "engine/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

/* First heap size tried for top-p without top-k: nuclei of real models at usual top_p are mostly
 * a few dozen tokens, so one cheap pass usually settles it. */
#define CN_SAMPLER_NUCLEUS_FIRST 64
#define CN_SAMPLER_NUCLEUS_GROW 8

/* ---------------------------------------------------------------------------------------------
 * Random stream: xoshiro256** (Blackman & Vigna), seeded by splitmix64 so that any 64-bit seed,
 * 0 included, gives a well-mixed nonzero state. Written out here so that no libc rand() leaks in.
 */

static uint64_t rotl64(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void rng_seed(uint64_t st[4], uint64_t seed) {
    for (int i = 0; i < 4; i++)
        st[i] = splitmix64(&seed);
}

static uint64_t rng_next(uint64_t st[4]) {
    uint64_t result = rotl64(st[1] * 5, 7) * 9;
    uint64_t t = st[1] << 17;
    st[2] ^= st[0];
    st[3] ^= st[1];
    st[1] ^= st[2];
    st[0] ^= st[3];
    st[2] ^= t;
    st[3] = rotl64(st[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits: exact in a double, identical on every machine. */
static double rng_uniform(uint64_t st[4]) {
    return (double)(rng_next(st) >> 11) * 0x1.0p-53;
}

/* ---------------------------------------------------------------------------------------------
 * Parameters and life cycle.
 */

void cn_sampler_params_default(cn_sampler_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 0.8f;
    p->top_k = 40;
    p->top_p = 0.9f;
    p->min_p = 0.0f;
    p->repeat_penalty = 1.0f;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->penalty_last_n = 64;
    p->seed = 0;
}

/* Comparisons are written so that NaN fails them. */
static int params_valid(const cn_sampler_params *p) {
    return p->temperature >= 0.0f && isfinite(p->temperature) && p->top_k >= 0 &&
           p->top_p > 0.0f && p->top_p <= 1.0f && p->min_p >= 0.0f && p->min_p <= 1.0f &&
           p->repeat_penalty > 0.0f && isfinite(p->repeat_penalty) &&
           isfinite(p->presence_penalty) && isfinite(p->frequency_penalty) &&
           p->penalty_last_n >= -1;
}

int cn_sampler_init(cn_sampler *s, const cn_sampler_params *p, int vocab_size) {
    memset(s, 0, sizeof *s);
    if (!p || vocab_size < 1 || !params_valid(p))
        return CN_EINVAL;
    s->params = *p;
    s->vocab_size = vocab_size;
    size_t v = (size_t)vocab_size;
    if (!(s->work = malloc(v * sizeof *s->work)))
        goto err;
    if (!(s->cand = malloc(v * sizeof *s->cand)))
        goto err;
    if (!(s->counts = calloc(v, sizeof *s->counts)))
        goto err;
    if (p->penalty_last_n > 0 &&
        !(s->ring = malloc((size_t)p->penalty_last_n * sizeof *s->ring)))
        goto err;
    rng_seed(s->rng, p->seed);
    return CN_OK;
err:
    cn_sampler_free(s);
    return CN_ENOMEM;
}

void cn_sampler_free(cn_sampler *s) {
    free(s->work);
    free(s->cand);
    free(s->counts);
    free(s->ring);
    memset(s, 0, sizeof *s);
}

void cn_sampler_reset(cn_sampler *s) {
    memset(s->counts, 0, (size_t)s->vocab_size * sizeof *s->counts);
    s->ring_len = 0;
    s->ring_pos = 0;
    rng_seed(s->rng, s->params.seed);
}

int cn_sampler_accept(cn_sampler *s, int32_t token) {
    if (token < 0 || token >= s->vocab_size)
        return CN_EINVAL;
    int n = s->params.penalty_last_n;
    if (n == 0)
        return CN_OK; /* penalties off: nothing to remember */
    if (n > 0) {
        if (s->ring_len == n)
            s->counts[s->ring[s->ring_pos]]--; /* the oldest leaves the window */
        else
            s->ring_len++;
        s->ring[s->ring_pos] = token;
        s->ring_pos = (s->ring_pos + 1) % n;
    }
    if (s->counts[token] < UINT32_MAX) /* -1 keeps counting forever; saturate, don't wrap */
        s->counts[token]++;
    return CN_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Selection: a bounded min-heap keyed on "worse" = (lower logit, or equal logit and higher id),
 * so its root is the candidate to drop next and heapsorting it leaves the best first.
 */

static int cand_worse(const cn_sampler_cand *a, const cn_sampler_cand *b) {
    return a->logit < b->logit || (a->logit == b->logit && a->id > b->id);
}

static void cand_swap(cn_sampler_cand *a, cn_sampler_cand *b) {
    cn_sampler_cand t = *a;
    *a = *b;
    *b = t;
}

static void heap_down(cn_sampler_cand *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && cand_worse(&h[l], &h[m]))
            m = l;
        if (r < n && cand_worse(&h[r], &h[m]))
            m = r;
        if (m == i)
            return;
        cand_swap(&h[i], &h[m]);
        i = m;
    }
}

static void heap_up(cn_sampler_cand *h, int i) {
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (!cand_worse(&h[i], &h[parent]))
            return;
        cand_swap(&h[i], &h[parent]);
        i = parent;
    }
}

/* Writes the k best finite entries of work into cand, best first; returns how many (< k only if
 * fewer are finite). O(V log k). */
static int select_best(const float *work, int V, cn_sampler_cand *cand, int k) {
    int n = 0;
    for (int i = 0; i < V; i++) {
        if (work[i] == -INFINITY)
            continue;
        cn_sampler_cand c = {i, work[i], 0.0f};
        if (n < k) {
            cand[n] = c;
            heap_up(cand, n++);
        } else if (cand_worse(&cand[0], &c)) {
            cand[0] = c;
            heap_down(cand, n, 0);
        }
    }
    for (int m = n; m > 1; m--) {
        cand_swap(&cand[0], &cand[m - 1]);
        heap_down(cand, m - 1, 0);
    }
    return n;
}

/* ---------------------------------------------------------------------------------------------
 * The pipeline.
 */

static float penalize(const cn_sampler_params *p, float x, uint32_t count) {
    if (p->repeat_penalty != 1.0f)
        x = x > 0.0f ? x / p->repeat_penalty : x * p->repeat_penalty;
    x -= (float)count * p->frequency_penalty + p->presence_penalty;
    return x > FLT_MAX ? FLT_MAX : x; /* a negative penalty must not make +inf (invariant 1) */
}

/* Copies logits into s->work with invariant (1) and the penalties applied. Returns the argmax
 * (lowest id on ties, 0 if all are -inf); *n_finite gets the count of tokens that are not -inf.
 * Penalties scan counts over all V instead of the window so that repeated tokens need no dedup;
 * this pass is O(V) anyway. */
static int32_t prepare(cn_sampler *s, const float *logits, int *n_finite) {
    const cn_sampler_params *p = &s->params;
    int pen = p->penalty_last_n != 0 &&
              (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f ||
               p->frequency_penalty != 0.0f);
    int32_t best = 0;
    float best_x = -INFINITY;
    int nf = 0;
    for (int i = 0; i < s->vocab_size; i++) {
        float x = logits[i];
        if (isnan(x))
            x = -INFINITY;
        else if (x > FLT_MAX)
            x = FLT_MAX;
        if (pen && s->counts[i])
            x = penalize(p, x, s->counts[i]);
        s->work[i] = x;
        if (x != -INFINITY) {
            nf++;
            if (x > best_x) {
                best_x = x;
                best = i;
            }
        }
    }
    *n_finite = nf;
    return best;
}

/* Sets w for cand[0..n) and returns their sum. logit_max is the best logit of all, so w <= 1
 * and the best has w == 1 exactly. Subtracting before dividing keeps FLT_MAX logits finite. */
static double weigh(cn_sampler_cand *cand, int n, float logit_max, float temp) {
    double z = 0.0;
    for (int j = 0; j < n; j++) {
        cand[j].w = expf((cand[j].logit - logit_max) / temp);
        z += cand[j].w;
    }
    return z;
}

/* Length of the shortest best-first prefix of cand[0..n) whose weight reaches target; n if
 * none does (*reached = 0). */
static int nucleus(const cn_sampler_cand *cand, int n, double target, int *reached) {
    double cum = 0.0;
    for (int j = 0; j < n; j++) {
        cum += cand[j].w;
        if (cum >= target) {
            *reached = 1;
            return j + 1;
        }
    }
    *reached = 0;
    return n;
}

/* The pipeline up to the draw: leaves the surviving candidates in s->cand[0..*n) with their
 * weights and returns -1, or returns the one token the draw cannot avoid (greedy, or at most one
 * finite logit) without touching the random stream. */
static int32_t filter(cn_sampler *s, const float *logits, int *n_out) {
    const cn_sampler_params *p = &s->params;
    int V = s->vocab_size, n_finite;
    int32_t argmax = prepare(s, logits, &n_finite);
    if (p->temperature == 0.0f || n_finite <= 1)
        return argmax;

    const float T = p->temperature, lmax = s->work[argmax];
    cn_sampler_cand *cand = s->cand;
    int n, reached;
    if (p->top_k > 0 && p->top_k < n_finite) {
        /* top-k, then softmax over the k, then top-p on that softmax */
        n = select_best(s->work, V, cand, p->top_k);
        double z = weigh(cand, n, lmax, T);
        if (p->top_p < 1.0f)
            n = nucleus(cand, n, (double)p->top_p * z, &reached);
    } else if (p->top_p < 1.0f) {
        /* top-p over all tokens: the normalizer needs every token, the order only the nucleus */
        double z = 0.0;
        for (int i = 0; i < V; i++)
            if (s->work[i] != -INFINITY)
                z += expf((s->work[i] - lmax) / T);
        double target = (double)p->top_p * z;
        int k = CN_SAMPLER_NUCLEUS_FIRST;
        for (;;) {
            if (k >= n_finite / 2)
                k = n_finite; /* a round this big costs about a full sort: do that instead */
            n = select_best(s->work, V, cand, k);
            weigh(cand, n, lmax, T);
            n = nucleus(cand, n, target, &reached);
            if (reached || k == n_finite)
                break;
            k = k > n_finite / CN_SAMPLER_NUCLEUS_GROW ? n_finite : k * CN_SAMPLER_NUCLEUS_GROW;
        }
    } else {
        /* no ordering needed: every finite token in id order */
        n = 0;
        for (int i = 0; i < V; i++)
            if (s->work[i] != -INFINITY)
                cand[n++] = (cn_sampler_cand){i, s->work[i], 0.0f};
        weigh(cand, n, lmax, T);
    }

    /* min-p: p_i >= min_p * p_max  <=>  w_i >= min_p, since w_max == 1 */
    if (p->min_p > 0.0f) {
        int m = 0;
        for (int j = 0; j < n; j++)
            if (cand[j].w >= p->min_p)
                cand[m++] = cand[j];
        n = m; /* >= 1: the best token has w == 1 >= min_p */
    }
    *n_out = n;
    return -1;
}

int cn_sampler_is_greedy(const cn_sampler *s) {
    const cn_sampler_params *p = &s->params;
    const int pen = p->penalty_last_n != 0 &&
                    (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f ||
                     p->frequency_penalty != 0.0f);
    return p->temperature == 0.0f && !pen;
}

int32_t cn_sampler_sample(cn_sampler *s, const float *logits) {
    int n = 0;
    int32_t only = filter(s, logits, &n);
    if (only >= 0) {
        if (s->params.temperature != 0.0f)
            (void)rng_next(s->rng); /* nothing to choose, but keep invariant (4) */
        return only;
    }
    const cn_sampler_cand *cand = s->cand;
    double total = 0.0;
    for (int j = 0; j < n; j++)
        total += cand[j].w;
    double r = rng_uniform(s->rng) * total, acc = 0.0;
    int32_t last = cand[0].id;
    for (int j = 0; j < n; j++) {
        if (cand[j].w <= 0.0f)
            continue;
        acc += cand[j].w;
        last = cand[j].id;
        if (r < acc)
            return cand[j].id;
    }
    return last; /* r within rounding of total */
}

int32_t cn_sampler_dist(cn_sampler *s, const float *logits, float *probs) {
    int n = 0;
    int32_t only = filter(s, logits, &n);
    memset(probs, 0, (size_t)s->vocab_size * sizeof *probs);
    if (only >= 0) {
        probs[only] = 1.0f;
        return only;
    }
    const cn_sampler_cand *cand = s->cand;
    double total = 0.0;
    for (int j = 0; j < n; j++)
        total += cand[j].w;
    int32_t best = cand[0].id;
    float best_w = -1.0f;
    for (int j = 0; j < n; j++) {
        if (cand[j].w <= 0.0f)
            continue;
        probs[cand[j].id] = (float)(cand[j].w / total);
        if (cand[j].w > best_w || (cand[j].w == best_w && cand[j].id < best)) {
            best_w = cand[j].w;
            best = cand[j].id;
        }
    }
    return best;
}

double cn_sampler_uniform(cn_sampler *s) {
    return rng_uniform(s->rng);
}

int32_t cn_sampler_draw(cn_sampler *s, const float *weights) {
    double total = 0.0;
    for (int i = 0; i < s->vocab_size; i++)
        if (weights[i] > 0.0f)
            total += weights[i];
    double u = rng_uniform(s->rng);
    int32_t last = -1;
    if (total > 0.0) {
        double r = u * total, acc = 0.0;
        for (int i = 0; i < s->vocab_size; i++) {
            if (!(weights[i] > 0.0f))
                continue;
            acc += weights[i];
            last = i;
            if (r < acc)
                return i;
        }
    }
    return last; /* r within rounding of total, or no positive weight (-1) */
}
