/* test_sampler.c - the token sampler: greedy, reproducibility, each filter, each penalty, and the
 * empirical distribution against softmax(logits / T). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "engine/sampler.h"

#define N_DRAWS 20000

/* Parameters with every filter and penalty off, temperature T. */
static cn_sampler_params plain(float T, uint64_t seed) {
    cn_sampler_params p;
    cn_sampler_params_default(&p);
    p.temperature = T;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = seed;
    return p;
}

static cn_sampler open_sampler(const cn_sampler_params *p, int V) {
    cn_sampler s;
    assert_int_equal(cn_sampler_init(&s, p, V), CN_OK);
    return s;
}

/* Counts N_DRAWS samples into freq[V] as fractions. */
static void draw_many(cn_sampler *s, const float *logits, double *freq) {
    int V = s->vocab_size;
    for (int i = 0; i < V; i++)
        freq[i] = 0.0;
    for (int d = 0; d < N_DRAWS; d++) {
        int32_t t = cn_sampler_sample(s, logits);
        assert_true(t >= 0 && t < V);
        freq[t] += 1.0 / N_DRAWS;
    }
}

/* Asserts freq matches want (a distribution) within 0.01 per token, and by chi-square: the
 * statistic must stay below the 0.1% critical value for df = categories - 1 (given by caller). */
static void assert_matches(const double *freq, const double *want, int V, double chi2_crit) {
    double chi2 = 0.0;
    for (int i = 0; i < V; i++) {
        assert_true(fabs(freq[i] - want[i]) < 0.01);
        if (want[i] > 0.0) {
            double d = (freq[i] - want[i]) * N_DRAWS;
            chi2 += d * d / (want[i] * N_DRAWS);
        } else {
            assert_true(freq[i] == 0.0); /* a filtered token is never drawn */
        }
    }
    if (chi2 >= chi2_crit) fprintf(stderr, "chi2 %.2f >= %.2f\n", chi2, chi2_crit);
    assert_true(chi2 < chi2_crit);
}

static void softmax(const float *logits, int V, float T, double *out) {
    double mx = -INFINITY, z = 0.0;
    for (int i = 0; i < V; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    for (int i = 0; i < V; i++)
        z += out[i] = exp((logits[i] - mx) / T);
    for (int i = 0; i < V; i++)
        out[i] /= z;
}

/* ------------------------------------------------------------------------------------------ */

static void test_defaults_match_ollama(void **state) {
    (void)state;
    cn_sampler_params p;
    cn_sampler_params_default(&p);
    assert_true(p.temperature == 0.8f && p.top_k == 40 && p.top_p == 0.9f && p.min_p == 0.0f);
    assert_true(p.repeat_penalty == 1.0f && p.presence_penalty == 0.0f &&
                p.frequency_penalty == 0.0f);
    assert_int_equal(p.penalty_last_n, 64);
    assert_true(p.seed == 0);
}

static void test_invalid_params_rejected(void **state) {
    (void)state;
    cn_sampler_params good = plain(1.0f, 1), p;
    cn_sampler s;
#define REJECT(field, value)                                                                \
    p = good;                                                                              \
    p.field = value;                                                                       \
    assert_int_equal(cn_sampler_init(&s, &p, 8), CN_EINVAL);                              \
    assert_null(s.work);
    REJECT(temperature, -0.1f)
    REJECT(temperature, NAN)
    REJECT(temperature, INFINITY)
    REJECT(top_k, -1)
    REJECT(top_p, 0.0f)
    REJECT(top_p, 1.01f)
    REJECT(top_p, NAN)
    REJECT(min_p, -0.1f)
    REJECT(min_p, 1.5f)
    REJECT(min_p, NAN)
    REJECT(repeat_penalty, 0.0f)
    REJECT(repeat_penalty, NAN)
    REJECT(presence_penalty, NAN)
    REJECT(frequency_penalty, INFINITY)
    REJECT(penalty_last_n, -2)
#undef REJECT
    assert_int_equal(cn_sampler_init(&s, &good, 0), CN_EINVAL);
    assert_int_equal(cn_sampler_init(&s, NULL, 8), CN_EINVAL);
    cn_sampler_free(&s); /* safe on the zeroed struct a failed init leaves */
    assert_int_equal(cn_sampler_init(&s, &good, 8), CN_OK);
    cn_sampler_free(&s);
    cn_sampler_free(&s); /* and twice */
}

static void test_greedy_argmax_lowest_id_on_ties(void **state) {
    (void)state;
    cn_sampler_params p = plain(0.0f, 7);
    cn_sampler s = open_sampler(&p, 6);
    const float a[6] = {0.1f, 2.0f, -3.0f, 1.9f, 0.0f, -1.0f};
    const float tie[6] = {0.1f, 2.0f, -3.0f, 2.0f, 0.0f, 2.0f};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(cn_sampler_sample(&s, a), 1);
        assert_int_equal(cn_sampler_sample(&s, tie), 1);
    }
    cn_sampler_free(&s);
}

/* Greedy means the plain argmax only at temperature 0 without an active penalty: then a caller
 * may take the pick on the backend (cn_op_argmax) instead of sampling. */
static void test_is_greedy(void **state) {
    (void)state;
    cn_sampler_params p = plain(0.0f, 7);
    cn_sampler s = open_sampler(&p, 6);
    assert_true(cn_sampler_is_greedy(&s));
    cn_sampler_free(&s);
    p.repeat_penalty = 1.3f; /* a penalty changes the pick once a token repeats */
    s = open_sampler(&p, 6);
    assert_false(cn_sampler_is_greedy(&s));
    cn_sampler_free(&s);
    p.penalty_last_n = 0; /* the same penalty over an empty window: inactive */
    s = open_sampler(&p, 6);
    assert_true(cn_sampler_is_greedy(&s));
    cn_sampler_free(&s);
    p = plain(0.5f, 7);
    s = open_sampler(&p, 6);
    assert_false(cn_sampler_is_greedy(&s));
    cn_sampler_free(&s);
}

static void test_logits_not_modified(void **state) {
    (void)state;
    cn_sampler_params p = plain(1.0f, 3);
    p.repeat_penalty = 1.5f;
    p.top_k = 3;
    p.top_p = 0.8f;
    cn_sampler s = open_sampler(&p, 5);
    float l[5] = {1.0f, NAN, 3.0f, -INFINITY, 0.5f}, copy[5];
    memcpy(copy, l, sizeof l);
    cn_sampler_accept(&s, 2);
    for (int i = 0; i < 100; i++)
        cn_sampler_sample(&s, l);
    assert_memory_equal(l, copy, sizeof l);
    cn_sampler_free(&s);
}

/* The stream is ours (xoshiro256** from splitmix64), so these tokens are the same everywhere;
 * a change here means saved seeds replay differently. */
static void test_same_seed_same_sequence_golden(void **state) {
    (void)state;
    enum { V = 16, N = 32 };
    float l[V];
    for (int i = 0; i < V; i++)
        l[i] = 0.25f * (float)(i % 5); /* a few levels, so draws vary but stay well apart */
    cn_sampler_params p = plain(1.0f, 42);
    cn_sampler a = open_sampler(&p, V), b = open_sampler(&p, V);
    int32_t sa[N], sb[N];
    for (int i = 0; i < N; i++) {
        sa[i] = cn_sampler_sample(&a, l);
        sb[i] = cn_sampler_sample(&b, l);
    }
    assert_memory_equal(sa, sb, sizeof sa);
    static const int32_t golden[N] = {2, 6, 11, 14, 15, 12, 11, 13, 12, 9, 11, 4, 13, 5, 11, 14,
                                      9, 13, 11, 11, 2, 3, 7, 9, 4, 8, 6, 13, 9, 4, 7, 9};
    assert_memory_equal(sa, golden, sizeof sa);

    /* reset restarts the stream and the history */
    cn_sampler_reset(&a);
    for (int i = 0; i < N; i++)
        assert_int_equal(cn_sampler_sample(&a, l), sa[i]);

    /* another seed gives another sequence */
    p.seed = 43;
    cn_sampler c = open_sampler(&p, V);
    int same = 0;
    for (int i = 0; i < N; i++)
        same += cn_sampler_sample(&c, l) == sa[i];
    assert_true(same < N / 2);
    cn_sampler_free(&a);
    cn_sampler_free(&b);
    cn_sampler_free(&c);
}

static void test_top_k_1_is_greedy_at_any_temperature(void **state) {
    (void)state;
    enum { V = 1000 };
    float *l = malloc(V * sizeof *l);
    uint32_t x = 12345;
    for (int i = 0; i < V; i++) {
        x = x * 1664525u + 1013904223u;
        l[i] = (float)(x >> 8) / (float)(1u << 24) * 10.0f - 5.0f;
    }
    l[700] = l[300] = 6.0f; /* a tie at the top: lowest id wins */
    cn_sampler_params g = plain(0.0f, 0);
    cn_sampler greedy = open_sampler(&g, V);
    int32_t want = cn_sampler_sample(&greedy, l);
    assert_int_equal(want, 300);
    const float temps[] = {0.01f, 0.7f, 1.0f, 5.0f, 100.0f};
    for (size_t t = 0; t < sizeof temps / sizeof *temps; t++) {
        cn_sampler_params p = plain(temps[t], t);
        p.top_k = 1;
        cn_sampler s = open_sampler(&p, V);
        for (int i = 0; i < 200; i++)
            assert_int_equal(cn_sampler_sample(&s, l), want);
        cn_sampler_free(&s);
    }
    cn_sampler_free(&greedy);
    free(l);
}

static void test_tiny_top_p_is_greedy(void **state) {
    (void)state;
    const float l[6] = {0.5f, 1.0f, 1.2f, 1.2f, 1.1f, -2.0f};
    const int top_ks[] = {0, 4};
    for (int k = 0; k < 2; k++) {
        cn_sampler_params p = plain(2.0f, 9);
        p.top_p = 1e-6f;
        p.top_k = top_ks[k];
        cn_sampler s = open_sampler(&p, 6);
        for (int i = 0; i < 500; i++)
            assert_int_equal(cn_sampler_sample(&s, l), 2);
        cn_sampler_free(&s);
    }
}

/* Empirical frequencies over N_DRAWS draws match softmax(logits / T): the sampler really samples. */
static void test_frequencies_match_softmax(void **state) {
    (void)state;
    enum { V = 8 };
    const float l[V] = {1.0f, 0.5f, 2.0f, -1.0f, 0.0f, 1.5f, -0.5f, 0.8f};
    const float temps[] = {0.7f, 1.0f, 1.8f};
    for (size_t t = 0; t < sizeof temps / sizeof *temps; t++) {
        double want[V], freq[V];
        softmax(l, V, temps[t], want);
        cn_sampler_params p = plain(temps[t], 1000 + t);
        cn_sampler s = open_sampler(&p, V);
        draw_many(&s, l, freq);
        assert_matches(freq, want, V, 24.32); /* chi2(df 7), p = 0.001 */
        cn_sampler_free(&s);
    }
}

/* top-k and top-p truncate and renormalize: softmax over the survivors only. */
static void test_top_k_top_p_distribution(void **state) {
    (void)state;
    enum { V = 8 };
    const float l[V] = {1.0f, 0.5f, 2.0f, -1.0f, 0.0f, 1.5f, -0.5f, 0.8f};
    const float T = 1.0f;
    double full[V], want[V], freq[V];
    softmax(l, V, T, full);

    /* top_k = 3 keeps ids 2, 5, 0 */
    cn_sampler_params p = plain(T, 5);
    p.top_k = 3;
    cn_sampler s = open_sampler(&p, V);
    double z = full[2] + full[5] + full[0];
    for (int i = 0; i < V; i++)
        want[i] = (i == 2 || i == 5 || i == 0) ? full[i] / z : 0.0;
    draw_many(&s, l, freq);
    assert_matches(freq, want, V, 13.82); /* df 2 */
    cn_sampler_free(&s);

    /* top_p = 0.7: order 2, 5, 0, 7, ... ; cumulative mass crosses 0.7 at id 0 */
    assert_true(full[2] + full[5] < 0.7 && full[2] + full[5] + full[0] >= 0.7);
    p = plain(T, 6);
    p.top_p = 0.7f;
    s = open_sampler(&p, V);
    draw_many(&s, l, freq);
    assert_matches(freq, want, V, 13.82); /* same survivors, same renormalization */
    cn_sampler_free(&s);
}

static void test_min_p_filters(void **state) {
    (void)state;
    enum { V = 5 };
    /* T = 1: p_i / p_max = exp(l_i - 2): 1, 0.607, 0.368, 0.135, 0.018 */
    const float l[V] = {2.0f, 1.5f, 1.0f, 0.0f, -2.0f};
    double full[V], want[V], freq[V];
    softmax(l, V, 1.0f, full);
    cn_sampler_params p = plain(1.0f, 11);
    p.min_p = 0.3f; /* keeps ids 0, 1, 2 */
    cn_sampler s = open_sampler(&p, V);
    double z = full[0] + full[1] + full[2];
    for (int i = 0; i < V; i++)
        want[i] = i < 3 ? full[i] / z : 0.0;
    draw_many(&s, l, freq);
    assert_matches(freq, want, V, 13.82);
    cn_sampler_free(&s);

    p.min_p = 1.0f; /* only the max survives */
    s = open_sampler(&p, V);
    for (int i = 0; i < 200; i++)
        assert_int_equal(cn_sampler_sample(&s, l), 0);
    cn_sampler_free(&s);

    /* min-p applies after temperature: at T = 0.25 the ratios are exp(4 (l_i - 2)), so 0.3
     * keeps only id 0 (ratio of id 1 is 0.135) */
    p = plain(0.25f, 12);
    p.min_p = 0.3f;
    s = open_sampler(&p, V);
    for (int i = 0; i < 200; i++)
        assert_int_equal(cn_sampler_sample(&s, l), 0);
    cn_sampler_free(&s);
}

static void test_repeat_penalty(void **state) {
    (void)state;
    cn_sampler_params p = plain(0.0f, 0);
    p.repeat_penalty = 1.1f;
    cn_sampler s = open_sampler(&p, 4);
    /* positive logit: 2.0 / 1.1 = 1.82 < 1.9 */
    const float pos[4] = {2.0f, 1.9f, -5.0f, -5.0f};
    assert_int_equal(cn_sampler_sample(&s, pos), 0);
    cn_sampler_accept(&s, 0);
    assert_int_equal(cn_sampler_sample(&s, pos), 1);
    /* negative logit is multiplied (dividing would raise it): -1.0 * 1.1 = -1.1 < -1.05 */
    const float neg[4] = {-1.0f, -1.05f, -5.0f, -5.0f};
    assert_int_equal(cn_sampler_sample(&s, neg), 1);
    /* applied once however often the token repeats: 2.0 / 1.1 = 1.82 > 1.8 */
    const float once[4] = {2.0f, 1.8f, -5.0f, -5.0f};
    for (int i = 0; i < 5; i++)
        cn_sampler_accept(&s, 0);
    assert_int_equal(cn_sampler_sample(&s, once), 0);
    /* reset forgets */
    cn_sampler_reset(&s);
    assert_int_equal(cn_sampler_sample(&s, pos), 0);
    cn_sampler_free(&s);
}

static void test_presence_and_frequency_penalties(void **state) {
    (void)state;
    const float l[3] = {1.0f, 0.8f, -5.0f};
    cn_sampler_params p = plain(0.0f, 0);
    p.presence_penalty = 0.1f; /* once: 1.0 - 0.1 = 0.9 > 0.8, however many repeats */
    cn_sampler s = open_sampler(&p, 3);
    for (int i = 0; i < 3; i++)
        cn_sampler_accept(&s, 0);
    assert_int_equal(cn_sampler_sample(&s, l), 0);
    cn_sampler_free(&s);

    p.presence_penalty = 0.3f; /* 1.0 - 0.3 = 0.7 < 0.8 */
    s = open_sampler(&p, 3);
    cn_sampler_accept(&s, 0);
    assert_int_equal(cn_sampler_sample(&s, l), 1);
    cn_sampler_free(&s);

    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.1f; /* count * 0.1: after 1 → 0.9 (keeps 0), after 3 → 0.7 */
    s = open_sampler(&p, 3);
    cn_sampler_accept(&s, 0);
    assert_int_equal(cn_sampler_sample(&s, l), 0);
    cn_sampler_accept(&s, 0);
    cn_sampler_accept(&s, 0);
    assert_int_equal(cn_sampler_sample(&s, l), 1);
    cn_sampler_free(&s);

    /* a negative presence penalty encourages: token 1 rises to 0.8 + 0.5 */
    p.frequency_penalty = 0.0f;
    p.presence_penalty = -0.5f;
    s = open_sampler(&p, 3);
    cn_sampler_accept(&s, 1);
    assert_int_equal(cn_sampler_sample(&s, l), 1);
    cn_sampler_free(&s);
}

static void test_penalty_window(void **state) {
    (void)state;
    const float l[4] = {1.0f, 0.8f, -5.0f, -5.0f};
    cn_sampler_params p = plain(0.0f, 0);
    p.frequency_penalty = 0.5f;

    p.penalty_last_n = 2; /* 0 then 2, 3: token 0 has left the window */
    cn_sampler s = open_sampler(&p, 4);
    cn_sampler_accept(&s, 0);
    assert_int_equal(cn_sampler_sample(&s, l), 1);
    cn_sampler_accept(&s, 2);
    assert_int_equal(cn_sampler_sample(&s, l), 1);
    cn_sampler_accept(&s, 3);
    assert_int_equal(cn_sampler_sample(&s, l), 0);
    cn_sampler_free(&s);

    p.penalty_last_n = -1; /* all history: token 0 stays penalized */
    s = open_sampler(&p, 4);
    cn_sampler_accept(&s, 0);
    for (int i = 0; i < 500; i++)
        cn_sampler_accept(&s, 2 + i % 2);
    assert_int_equal(cn_sampler_sample(&s, l), 1);
    cn_sampler_free(&s);

    p.penalty_last_n = 0; /* penalties off */
    s = open_sampler(&p, 4);
    cn_sampler_accept(&s, 0);
    assert_int_equal(cn_sampler_sample(&s, l), 0);
    cn_sampler_free(&s);
}

static void test_accept_rejects_out_of_range(void **state) {
    (void)state;
    cn_sampler_params p = plain(0.0f, 0);
    p.frequency_penalty = 1.0f;
    cn_sampler s = open_sampler(&p, 4);
    assert_int_equal(cn_sampler_accept(&s, -1), CN_EINVAL);
    assert_int_equal(cn_sampler_accept(&s, 4), CN_EINVAL);
    assert_int_equal(cn_sampler_accept(&s, 3), CN_OK);
    const float l[4] = {1.0f, 0.8f, -5.0f, -5.0f};
    assert_int_equal(cn_sampler_sample(&s, l), 0); /* nothing was recorded for 0 */
    cn_sampler_free(&s);
}

static void test_vocab_of_one(void **state) {
    (void)state;
    cn_sampler_params p;
    cn_sampler_params_default(&p);
    p.repeat_penalty = 1.3f;
    cn_sampler s = open_sampler(&p, 1);
    const float l[1] = {-3.0f}, bad[1] = {NAN};
    for (int i = 0; i < 10; i++) {
        assert_int_equal(cn_sampler_sample(&s, l), 0);
        assert_int_equal(cn_sampler_sample(&s, bad), 0);
        assert_int_equal(cn_sampler_accept(&s, 0), CN_OK);
    }
    cn_sampler_free(&s);
}

static void test_all_neg_inf_but_one_and_nan(void **state) {
    (void)state;
    enum { V = 300 };
    float l[V];
    for (int i = 0; i < V; i++)
        l[i] = (i % 3) ? -INFINITY : NAN; /* NaN counts as -inf */
    l[217] = -50.0f;
    const float temps[] = {0.0f, 0.5f, 1.0f, 50.0f};
    const int top_ks[] = {0, 1, 40};
    const float top_ps[] = {1.0f, 0.9f};
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 2; c++) {
                cn_sampler_params p = plain(temps[a], 1);
                p.top_k = top_ks[b];
                p.top_p = top_ps[c];
                p.min_p = 0.05f;
                cn_sampler s = open_sampler(&p, V);
                for (int i = 0; i < 20; i++)
                    assert_int_equal(cn_sampler_sample(&s, l), 217);
                cn_sampler_free(&s);
            }

    /* everything -inf: token 0, no crash */
    l[217] = -INFINITY;
    cn_sampler_params p = plain(1.0f, 1);
    cn_sampler s = open_sampler(&p, V);
    assert_int_equal(cn_sampler_sample(&s, l), 0);
    cn_sampler_free(&s);

    /* +inf beats every finite logit: greedy takes the lowest such id, sampling shares between them */
    for (int i = 0; i < V; i++)
        l[i] = (float)i;
    l[100] = l[50] = INFINITY;
    p = plain(0.0f, 2);
    s = open_sampler(&p, V);
    assert_int_equal(cn_sampler_sample(&s, l), 50);
    cn_sampler_free(&s);
    p = plain(1.0f, 2);
    s = open_sampler(&p, V);
    for (int i = 0; i < 20; i++) {
        int32_t t = cn_sampler_sample(&s, l);
        assert_true(t == 50 || t == 100);
    }
    cn_sampler_free(&s);
}

/* top-p without top-k over a vocabulary whose nucleus needs several selection rounds (it is
 * larger than the first heap of 64): the drawn set must equal the nucleus found by a full sort. */
static int cmp_desc(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

static void test_top_p_large_nucleus(void **state) {
    (void)state;
    enum { V = 2048, FLAT = 200 };
    float *l = malloc(V * sizeof *l);
    /* FLAT tokens near 0 carry most mass, the rest trail off far below */
    for (int i = 0; i < V; i++)
        l[i] = (i % 17 == 0 && i / 17 < FLAT) ? -0.001f * (float)(i / 17) : -8.0f - 0.001f * i;
    double *prob = malloc(V * sizeof *prob), *sorted = malloc(V * sizeof *sorted);
    softmax(l, V, 1.0f, prob);
    memcpy(sorted, prob, V * sizeof *prob);
    qsort(sorted, V, sizeof *sorted, cmp_desc);
    const float top_p = 0.9f;
    double cum = 0.0;
    int nucleus = 0;
    while (cum < top_p)
        cum += sorted[nucleus++];
    assert_true(nucleus > 64 && nucleus < FLAT); /* several rounds, inside the flat part */
    double cut = sorted[nucleus - 1];

    cn_sampler_params p = plain(1.0f, 77);
    p.top_p = top_p;
    cn_sampler s = open_sampler(&p, V);
    char *seen = calloc(V, 1);
    for (int d = 0; d < 4000; d++) { /* each nucleus token is expected ~22 times */
        int32_t t = cn_sampler_sample(&s, l);
        assert_true(prob[t] >= cut); /* inside the nucleus */
        seen[t] = 1;
    }
    int n_seen = 0;
    for (int i = 0; i < V; i++)
        n_seen += seen[i];
    assert_int_equal(n_seen, nucleus); /* and all of it */
    cn_sampler_free(&s);
    free(seen);
    free(sorted);
    free(prob);
    free(l);
}

/* cn_sampler_dist is the distribution cn_sampler_sample draws from: same survivors, same
 * weights, under every filter and with penalties; cn_sampler_draw from it matches too; neither
 * dist nor a greedy sample touches the stream, and draw consumes exactly one uniform. */
static void test_dist_is_what_sample_draws(void **state) {
    (void)state;
    enum { V = 12 };
    const float l[V] = {1.0f, 0.5f, 2.0f, -1.0f, 0.0f, 1.5f, -0.5f, 0.8f, 1.9f, -2.0f, 0.3f, 1.1f};
    cn_sampler_params ps[5];
    ps[0] = plain(1.0f, 3);
    ps[1] = plain(0.7f, 4);
    ps[1].top_k = 5;
    ps[2] = plain(1.3f, 15);
    ps[2].top_p = 0.8f;
    ps[3] = plain(1.0f, 6);
    ps[3].min_p = 0.3f;
    ps[4] = plain(0.9f, 7);
    ps[4].repeat_penalty = 1.4f;
    ps[4].presence_penalty = 0.2f;
    for (int k = 0; k < 5; k++) {
        cn_sampler s = open_sampler(&ps[k], V);
        if (k == 4) {
            cn_sampler_accept(&s, 2);
            cn_sampler_accept(&s, 8);
        }
        float probs[V];
        double want[V], freq[V], sum = 0;
        int32_t best = cn_sampler_dist(&s, l, probs);
        int df = -1;
        for (int i = 0; i < V; i++) {
            want[i] = probs[i];
            sum += probs[i];
            df += probs[i] > 0;
            assert_true(probs[i] <= probs[best]);
        }
        assert_true(fabs(sum - 1.0) < 1e-5);
        draw_many(&s, l, freq);
        /* 0.1% critical values of chi-square for df 1..11 */
        static const double crit[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88, 29.59, 31.26};
        assert_matches(freq, want, V, crit[df > 0 ? df : 1]);
        for (int i = 0; i < V; i++) freq[i] = 0;
        for (int d = 0; d < N_DRAWS; d++) freq[cn_sampler_draw(&s, probs)] += 1.0 / N_DRAWS;
        assert_matches(freq, want, V, crit[df > 0 ? df : 1]);
        cn_sampler_free(&s);
    }
    /* the stream: dist consumes nothing, draw exactly one uniform */
    cn_sampler a = open_sampler(&ps[0], V), b = open_sampler(&ps[0], V);
    float probs[V];
    cn_sampler_dist(&a, l, probs);
    (void)cn_sampler_draw(&a, probs);
    (void)cn_sampler_uniform(&b);
    assert_int_equal(cn_sampler_sample(&a, l), cn_sampler_sample(&b, l));
    cn_sampler_free(&a);
    cn_sampler_free(&b);
    /* greedy: one-hot on the argmax */
    cn_sampler g = open_sampler(&ps[0], V);
    g.params.temperature = 0;
    assert_int_equal(cn_sampler_dist(&g, l, probs), 2);
    for (int i = 0; i < V; i++) assert_true(probs[i] == (i == 2 ? 1.0f : 0.0f));
    float none[V] = {0};
    assert_int_equal(cn_sampler_draw(&g, none), -1);
    cn_sampler_free(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_match_ollama),
        cmocka_unit_test(test_dist_is_what_sample_draws),
        cmocka_unit_test(test_invalid_params_rejected),
        cmocka_unit_test(test_greedy_argmax_lowest_id_on_ties),
        cmocka_unit_test(test_is_greedy),
        cmocka_unit_test(test_logits_not_modified),
        cmocka_unit_test(test_same_seed_same_sequence_golden),
        cmocka_unit_test(test_top_k_1_is_greedy_at_any_temperature),
        cmocka_unit_test(test_tiny_top_p_is_greedy),
        cmocka_unit_test(test_frequencies_match_softmax),
        cmocka_unit_test(test_top_k_top_p_distribution),
        cmocka_unit_test(test_min_p_filters),
        cmocka_unit_test(test_repeat_penalty),
        cmocka_unit_test(test_presence_and_frequency_penalties),
        cmocka_unit_test(test_penalty_window),
        cmocka_unit_test(test_accept_rejects_out_of_range),
        cmocka_unit_test(test_vocab_of_one),
        cmocka_unit_test(test_all_neg_inf_but_one_and_nan),
        cmocka_unit_test(test_top_p_large_nucleus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
