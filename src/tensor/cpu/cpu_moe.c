/* cpu_moe.c - the MoE router (sigmoid scores, bias for choosing, optional group limiting) and the
 * weighted combination of expert rows, on the CPU.
 *
 * Promises: routing is deterministic: experts are ranked by biased score, descending, ties to the
 * lower index (groups likewise); the unbiased sigmoid score is what gets weighted. Every id is in
 * [0, E). Never writes outside ids, weights and y.
 *
 * Group limiting (n_group > 1): a group's score is the sum of its two best biased scores (its one
 * score if groups hold one expert); experts outside the topk_group best groups are excluded. They
 * are chosen only if the kept groups hold fewer than top_k experts (then by the same ranking).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/error.h"
#include "tensor/cpu/cpu_impl.h"

/* Index of the best biased score among e with !taken[e] and excluded[e] == pass; -1 if none. */
static int best_expert(const float *sel, const uint8_t *taken, const uint8_t *excluded, int E,
                       int pass) {
    int best = -1;
    for (int e = 0; e < E; e++) {
        if (taken[e] || excluded[e] != pass) continue;
        if (best < 0 || sel[e] > sel[best]) best = e; /* strict: ties keep the lower index */
    }
    return best;
}

int cpu_moe_route(cn_backend *b, cn_tensor *ids, cn_tensor *weights, const cn_tensor *logits,
                  const cn_tensor *bias, const cn_route_args *a) {
    cpu_ctx *c = cpu_ctx_of(b);
    const int64_t T = logits->shape[0];
    const int E = (int)logits->shape[1], K = a->top_k;
    const int n_group = a->n_group > 1 ? a->n_group : 1;
    /* scratch: s[E], sel[E], gscore[n_group], taken[E], excluded[E], gtaken[n_group] */
    size_t bytes = (size_t)(2 * E + n_group) * sizeof(float) + (size_t)(2 * E + n_group);
    char *mem = cpu_scratch(c, bytes);
    if (!mem) return CN_ENOMEM;
    float *s = (float *)mem, *sel = s + E, *gscore = sel + E;
    uint8_t *taken = (uint8_t *)(gscore + n_group), *excluded = taken + E, *gtaken = excluded + E;
    const float *bv = bias ? (const float *)bias->data : NULL;

    for (int64_t t = 0; t < T; t++) {
        const float *lg = cpu_row(logits, t);
        int32_t *id = (int32_t *)((char *)ids->data + t * ids->stride[0]);
        float *wt = cpu_row(weights, t);
        for (int e = 0; e < E; e++) {
            s[e] = 1.0f / (1.0f + expf(-lg[e]));
            sel[e] = bv ? s[e] + bv[e] : s[e];
        }
        memset(taken, 0, (size_t)E);
        memset(excluded, 0, (size_t)E);
        if (n_group > 1) {
            const int gs = E / n_group;
            for (int g = 0; g < n_group; g++) { /* sum of the group's top two */
                const float *v = sel + g * gs;
                int i1 = 0;
                for (int e = 1; e < gs; e++)
                    if (v[e] > v[i1]) i1 = e;
                int i2 = -1;
                for (int e = 0; e < gs; e++)
                    if (e != i1 && (i2 < 0 || v[e] > v[i2])) i2 = e;
                gscore[g] = i2 < 0 ? v[i1] : v[i1] + v[i2];
            }
            memset(gtaken, 0, (size_t)n_group);
            for (int r = 0; r < a->topk_group; r++) {
                int best = -1;
                for (int g = 0; g < n_group; g++)
                    if (!gtaken[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
                gtaken[best] = 1;
            }
            for (int e = 0; e < E; e++) excluded[e] = !gtaken[e / gs];
        }
        for (int j = 0; j < K; j++) {
            int e = best_expert(sel, taken, excluded, E, 0);
            if (e < 0) e = best_expert(sel, taken, excluded, E, 1);
            taken[e] = 1;
            id[j] = e;
            wt[j] = s[e];
        }
        if (a->norm_topk) {
            float sum = 0;
            for (int j = 0; j < K; j++) sum += wt[j];
            for (int j = 0; j < K; j++) wt[j] /= sum + 1e-20f;
        }
        for (int j = 0; j < K; j++) wt[j] *= a->scaling;
    }
    return CN_OK;
}

typedef struct combine_job {
    const cn_tensor *y, *rows, *w;
    int64_t k, H;
} combine_job;

static void combine_rows(void *arg, int begin, int end) {
    const combine_job *j = arg;
    for (int t = begin; t < end; t++) {
        float *y = cpu_row(j->y, t);
        const float *w = cpu_row(j->w, t);
        for (int64_t i = 0; i < j->H; i++) y[i] = 0.0f;
        for (int64_t jj = 0; jj < j->k; jj++) {
            const float *r = cpu_row(j->rows, t * j->k + jj);
            const float wj = w[jj];
            for (int64_t i = 0; i < j->H; i++) y[i] += wj * r[i];
        }
    }
}

int cpu_moe_combine(cn_backend *b, cn_tensor *y, const cn_tensor *rows, const cn_tensor *weights) {
    combine_job j = {.y = y, .rows = rows, .w = weights, .k = weights->shape[1], .H = y->shape[1]};
    cpu_parallel_rows(cpu_ctx_of(b), (int)y->shape[0], y->shape[0] * j.k * j.H * 2, combine_rows, &j);
    return CN_OK;
}
