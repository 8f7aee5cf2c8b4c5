/* mtp_draft.c - the MTP head's drafting copy (model.h cn_model_mtp_draft_build): the head's
 * matrices and the lm_head re-encoded as NVFP4 (E2M1 values, an E4M3 scale per 16, one fp32
 * global scale, as cn_quantize_dir writes them; FP8 E4M3 with one scale per tensor for a matrix
 * whose K is not a multiple of 16, or a backend without NVFP4 weights), so a draft streams about
 * a quarter of the bytes of a BF16 head. On cobble NVFP4 kept the acceptance of the stored head
 * (0.761 against 0.757 at depth 4; FP8 0.763) and its rounds were the cheaper
 * (docs/performance.md).
 *
 * Promises: built once per model, on a backend whose weights live in host memory (the CPU); the
 * stored head is never changed, so cn_state_create(..., 1) states and everything the main stack
 * computes are untouched. A state made with cn_state_create(..., 2) runs the head on this copy
 * (mtp_forward picks it). Drafts only propose: a speculative round's output is the target's own
 * greedy or sampled choice whatever the draft weights, so outputs stay exact; only acceptance may
 * move. Matrices that are not F32, BF16 or F16 (already quantized), the router gate (its scores
 * pick experts: it is small and kept exact) and every vector are shared with the stored head.
 * On an error nothing is kept and the stored head serves drafts.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fp.h"
#include "base/threadpool.h"
#include "model/model_impl.h"
#include "model/quantize.h"

/* Element i of row r of a host matrix stored as F32, BF16 or F16. */
static float value(const cn_tensor *t, int64_t r, int64_t i) {
    const char *row = (const char *)t->data + r * t->stride[0];
    switch (t->dtype) {
    case CN_BF16: return cn_bf16_to_f32(((const uint16_t *)row)[i]);
    case CN_F16: return cn_f16_to_f32(((const uint16_t *)row)[i]);
    default: return ((const float *)row)[i];
    }
}

static int encodable(const cn_tensor *t) {
    return t->data && t->ndim == 2 &&
           (t->dtype == CN_F32 || t->dtype == CN_BF16 || t->dtype == CN_F16);
}

#define ENC_ROWS 256 /* rows encoded per upload */

/* Rows of one matrix on the pool: their largest magnitudes, or their codes (and block scales). */
typedef struct enc_job {
    const cn_tensor *src;
    cn_dtype fmt; /* CN_F8_E4M3 or CN_NVFP4 */
    int64_t r0, K;
    int64_t code_bytes, scale_bytes; /* per row */
    float scale;  /* FP8: amax / 448; NVFP4: the global scale amax / (6 * 448) */
    float *amax;  /* [rows] pass 1 */
    float *row;   /* [ENC_ROWS][K] pass 2: the source rows as F32 (NVFP4) */
    uint8_t *out; /* [ENC_ROWS][code_bytes] pass 2: rows r0 .. */
    uint8_t *bs;  /* [ENC_ROWS][scale_bytes] NVFP4 block scales */
} enc_job;

static void amax_task(void *arg, int begin, int end) {
    const enc_job *j = arg;
    for (int r = begin; r < end; r++) {
        float a = 0.0f;
        for (int64_t i = 0; i < j->K; i++) a = fmaxf(a, fabsf(value(j->src, r, i)));
        j->amax[r] = a;
    }
}

static void encode_task(void *arg, int begin, int end) {
    const enc_job *j = arg;
    for (int r = begin; r < end; r++) {
        uint8_t *out = j->out + (int64_t)r * j->code_bytes;
        if (j->fmt == CN_F8_E4M3) {
            for (int64_t i = 0; i < j->K; i++)
                out[i] = cn_e4m3_encode(value(j->src, j->r0 + r, i) / j->scale);
            continue;
        }
        float *row = j->row + (int64_t)r * j->K;
        for (int64_t i = 0; i < j->K; i++) row[i] = value(j->src, j->r0 + r, i);
        cn_quantize_nvfp4_row(row, j->K, j->scale, out, j->bs + (int64_t)r * j->scale_bytes);
    }
}

/* An owned U8 tensor [N, cols] (cn_backend_alloc's), listed in m->w.draft_owned. */
static cn_tensor *owned_u8(cn_model *m, int64_t N, int64_t cols) {
    cn_tensor *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    *t = cn_tensor_2d(CN_U8, N, cols, NULL);
    if (cn_backend_alloc(m->b, t)) {
        free(t);
        return NULL;
    }
    m->w.draft_owned[m->w.n_draft_owned++] = t;
    return t;
}

/* dst = src re-encoded as fmt (FP8 per tensor, or NVFP4 when K is a multiple of its blocks of 16)
 * in memory the model owns; a matrix that cannot be encoded is shared as it is. On an error
 * what was allocated stays listed in draft_owned (cn_model_mtp_draft_free releases it). */
static int enc_copy(cn_model *m, cn_pool *pool, cn_dtype fmt, const cn_tensor *src,
                    cn_tensor *dst) {
    *dst = *src;
    if (!encodable(src)) return CN_OK;
    const int64_t N = src->shape[0], K = src->shape[1];
    if (N > INT32_MAX) return CN_OK; /* rows are the pool's ints */
    if (fmt == CN_NVFP4 && K % 16) fmt = CN_F8_E4M3;
    enc_job j = {.src = src, .fmt = fmt, .K = K};
    j.code_bytes = fmt == CN_NVFP4 ? K / 2 : K;
    j.scale_bytes = fmt == CN_NVFP4 ? K / 16 : 0;
    j.amax = malloc((size_t)N * sizeof *j.amax);
    j.out = malloc((size_t)(ENC_ROWS * j.code_bytes));
    if (fmt == CN_NVFP4) {
        j.row = malloc((size_t)(ENC_ROWS * K) * sizeof *j.row);
        j.bs = malloc((size_t)(ENC_ROWS * j.scale_bytes));
    }
    int rc = j.amax && j.out && (fmt != CN_NVFP4 || (j.row && j.bs)) ? CN_OK : CN_ENOMEM;
    cn_tensor *codes = NULL, *scales = NULL;
    if (!rc) {
        cn_pool_for(pool, (int)N, 16, amax_task, &j);
        float amax = 0.0f;
        for (int64_t r = 0; r < N; r++) amax = fmaxf(amax, j.amax[r]);
        if (!(amax < INFINITY)) goto done; /* inf or NaN: no scale fits; drafts read it as stored */
        j.scale = amax > 0.0f ? amax / (fmt == CN_NVFP4 ? 6.0f * 448.0f : 448.0f) : 1.0f;
        codes = owned_u8(m, N, j.code_bytes);
        if (fmt == CN_NVFP4) scales = owned_u8(m, N, j.scale_bytes);
        if (!codes || (fmt == CN_NVFP4 && !scales)) rc = CN_ENOMEM;
    }
    for (int64_t r0 = 0; !rc && r0 < N; r0 += ENC_ROWS) {
        const int64_t n = N - r0 < ENC_ROWS ? N - r0 : ENC_ROWS;
        j.r0 = r0;
        cn_pool_for(pool, (int)n, 4, encode_task, &j);
        rc = cn_backend_upload(m->b, codes, (uint64_t)(r0 * codes->stride[0]), j.out,
                               (uint64_t)(n * j.code_bytes));
        if (!rc && scales)
            rc = cn_backend_upload(m->b, scales, (uint64_t)(r0 * scales->stride[0]), j.bs,
                                   (uint64_t)(n * j.scale_bytes));
    }
    if (!rc) {
        int64_t shape[2] = {N, K};
        cn_tensor_init(dst, fmt, 2, shape, codes->data);
        dst->name = src->name;
        dst->scale = j.scale;
        dst->block_scale = scales; /* E4M3 codes held as U8, as a checkpoint's may be */
    }
done:
    free(j.amax);
    free(j.out);
    free(j.row);
    free(j.bs);
    return rc;
}

/* Matrices the copy may hold: eh_proj, the lm_head and each layer's attention, expert and MLP
 * matrices. */
static int n_matrices(const cn_model *m) {
    const int per_layer = 4 + 2 * (m->cfg.n_routed_experts > 0 ? m->cfg.n_routed_experts : 0) + 2;
    return 2 * (2 + m->cfg.n_mtp_layers * per_layer); /* codes and block scales each */
}

static int copy_layer(cn_model *m, cn_pool *pool, cn_dtype fmt, const cn_layer_w *src,
                      cn_layer_w *dst) {
    *dst = *src;
    dst->moe.up = dst->moe.down = NULL;
    dst->moe.up_p = dst->moe.down_p = NULL;
    int rc = CN_OK;
    switch (src->type) {
    case CN_BLOCK_ATTN:
    case CN_BLOCK_SWA:
        if (!rc) rc = enc_copy(m, pool, fmt, &src->attn.q, &dst->attn.q);
        if (!rc) rc = enc_copy(m, pool, fmt, &src->attn.k, &dst->attn.k);
        if (!rc) rc = enc_copy(m, pool, fmt, &src->attn.v, &dst->attn.v);
        if (!rc) rc = enc_copy(m, pool, fmt, &src->attn.o, &dst->attn.o);
        return rc;
    case CN_BLOCK_MLP:
        if (!rc) rc = enc_copy(m, pool, fmt, &src->mlp.up, &dst->mlp.up);
        if (!rc) rc = enc_copy(m, pool, fmt, &src->mlp.down, &dst->mlp.down);
        return rc;
    case CN_BLOCK_MOE: {
        const int E = m->cfg.n_routed_experts;
        dst->moe.up = calloc((size_t)E, sizeof *dst->moe.up);
        dst->moe.down = calloc((size_t)E, sizeof *dst->moe.down);
        dst->moe.up_p = calloc((size_t)(E + CN_MOE_MAX_PARTS), sizeof *dst->moe.up_p);
        dst->moe.down_p = calloc((size_t)(E + CN_MOE_MAX_PARTS), sizeof *dst->moe.down_p);
        if (!dst->moe.up || !dst->moe.down || !dst->moe.up_p || !dst->moe.down_p) return CN_ENOMEM;
        for (int e = 0; e < E && !rc; e++) {
            rc = enc_copy(m, pool, fmt, &src->moe.up[e], &dst->moe.up[e]);
            if (!rc) rc = enc_copy(m, pool, fmt, &src->moe.down[e], &dst->moe.down[e]);
            dst->moe.up_p[e] = &dst->moe.up[e];
            dst->moe.down_p[e] = &dst->moe.down[e];
        }
        if (src->moe.has_shared) {
            if (!rc) rc = enc_copy(m, pool, fmt, &src->moe.shared_up, &dst->moe.shared_up);
            if (!rc) rc = enc_copy(m, pool, fmt, &src->moe.shared_down, &dst->moe.shared_down);
        }
        if (!rc) cn_moe_fold_shared(m, &dst->moe); /* the parts of the copies */
        else dst->moe.n_parts = 0;
        return rc;
    }
    default: return CN_OK; /* Mamba: a head with one is never drafted with (speculate.h) */
    }
}

void cn_model_mtp_draft_free(cn_model *m) {
    cn_weights *w = &m->w;
    for (int i = 0; i < w->n_draft_owned; i++) {
        cn_backend_release(m->b, w->draft_owned[i]);
        free(w->draft_owned[i]);
    }
    free(w->draft_owned);
    if (w->mtp_draft.layers)
        for (int l = 0; l < m->cfg.n_mtp_layers; l++) cn_model_free_layer(&w->mtp_draft.layers[l]);
    free(w->mtp_draft.layers);
    memset(&w->mtp_draft, 0, sizeof w->mtp_draft);
    memset(&w->lm_head_draft, 0, sizeof w->lm_head_draft);
    w->draft_owned = NULL;
    w->n_draft_owned = 0;
    w->has_mtp_draft = 0;
}

int cn_model_mtp_draft_build(cn_model *m) {
    cn_weights *w = &m->w;
    if (!w->has_mtp) return CN_EINVAL;
    if (w->has_mtp_draft) return CN_OK;
    if (cn_backend_has_device_memory(m->b) || (!cn_backend_supports_weight(m->b, CN_NVFP4) &&
                                                !cn_backend_supports_weight(m->b, CN_F8_E4M3)))
        return CN_EUNSUPPORTED;
    const int L = m->cfg.n_mtp_layers;
    const cn_dtype fmt = cn_backend_supports_weight(m->b, CN_NVFP4) ? CN_NVFP4 : CN_F8_E4M3;
    w->draft_owned = calloc((size_t)n_matrices(m), sizeof *w->draft_owned);
    w->mtp_draft = w->mtp;
    w->mtp_draft.layers = calloc((size_t)L, sizeof *w->mtp_draft.layers);
    /* the rows on every online core, as cn_quantize_dir does: a large head (hundreds of millions
     * of weights with its lm_head) would otherwise take one core through an engine's opening;
     * NULL runs them inline */
    long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
    cn_pool *pool = n_cpu > 1 ? cn_pool_create((int)n_cpu) : NULL;
    int rc = w->draft_owned && w->mtp_draft.layers ? CN_OK : CN_ENOMEM;
    if (!rc) rc = enc_copy(m, pool, fmt, &w->mtp.eh_proj, &w->mtp_draft.eh_proj);
    if (!rc) rc = enc_copy(m, pool, fmt, &w->lm_head, &w->lm_head_draft);
    for (int l = 0; l < L && !rc; l++)
        rc = copy_layer(m, pool, fmt, &w->mtp.layers[l], &w->mtp_draft.layers[l]);
    cn_pool_free(pool);
    if (rc) {
        cn_model_mtp_draft_free(m);
        return rc;
    }
    w->has_mtp_draft = 1;
    return CN_OK;
}
