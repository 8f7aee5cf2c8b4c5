/* test_quant_ops.c - the block-scaled weight formats (NVFP4, MXFP8) under matmul, matmul_gather
 * and get_rows, on every ISA (best, AVX2, scalar), against double-precision references built here
 * from the dequantized weights.
 *
 * Weights and their block scales are rows strided wider than packed (views of bigger buffers);
 * activations are column views. Tolerances, on max |got - ref| relative to max |ref|:
 *   MXFP8 vs the dequantized weights in double                       2e-5 (fp32 sums only)
 *   NVFP4 vs double with x quantized as backend.h (2) states         2e-5 (int8 per 16, max-abs)
 *   NVFP4 vs double with x unquantized                               2e-2 (the int8 activations;
 *                                  measured <= 8.7e-3 here, on matrices of >= 8 outputs)
 *   get_rows                                                         1e-7 (one fp32 rounding)
 * SIMD vs scalar agree within 1e-5, and 1 vs 3 threads bit for bit.
 */
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
#include "base/fp.h"
#include "tensor/backend.h"
#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu_test_util.h"

static const char *k_isa_name[N_ISA] = {"best", "scalar", "avx2"};

/* ---------------------------------------------------------------- activations */

/* Values in [-1, 1], with every 7th row scaled by 30 and some exact zeros (blocks of all zeros
 * included), so per-block scales differ widely. */
static view view_rand(rng *r, int64_t T, int64_t C, int64_t pad) {
    view v = view_make(T, C, pad);
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < v.W; c++) {
            float f = rng_unif(r, -1, 1) * (t % 7 == 3 ? 30.0f : 1.0f);
            if ((c / 16) % 5 == 4 && t % 2) f = 0;
            v.buf[t * v.W + c] = f;
        }
    return v;
}

static float *at(const view *v, int64_t t, int64_t c) { return &v->buf[t * v->W + v->off + c]; }

static void view_free(view *v) { free(v->buf); }

static void expect_close(const char *what, const view *y, const double *ref, double tol) {
    double maxref = 1e-30, maxerr = 0;
    int64_t worst = 0;
    for (int64_t t = 0; t < y->T; t++)
        for (int64_t n = 0; n < y->C; n++) {
            double rv = ref[t * y->C + n], e = fabs((double)*at(y, t, n) - rv);
            if (fabs(rv) > maxref) maxref = fabs(rv);
            if (!(e <= maxerr)) {
                maxerr = isnan(e) ? INFINITY : e;
                worst = t * y->C + n;
            }
        }
    for (int64_t t = 0; t < y->T; t++) /* padding untouched */
        for (int64_t c = 0; c < y->W; c++)
            if (c < y->off || c >= y->off + y->C) assert_true(y->buf[t * y->W + c] == SENTINEL);
    if (maxerr > tol * maxref) {
        print_error("%s: max err %.3g at %lld (got %.9g, ref %.9g) > %.1g * max|ref| %.3g\n", what,
                    maxerr, (long long)worst, (double)*at(y, worst / y->C, worst % y->C),
                    ref[worst], tol, maxref);
        fail();
    }
}

/* max |got - ref| / max |ref| */
static double rel_err(const view *y, const double *ref) {
    double maxref = 1e-30, maxerr = 0;
    for (int64_t t = 0; t < y->T; t++)
        for (int64_t n = 0; n < y->C; n++) {
            double rv = ref[t * y->C + n];
            if (fabs(rv) > maxref) maxref = fabs(rv);
            double e = fabs((double)*at(y, t, n) - rv);
            if (e > maxerr) maxerr = e;
        }
    return maxerr / maxref;
}

/* x quantized as the CPU backend promises for NVFP4 (backend.h (2), cpu_impl.h): per 16 values,
 * q = round-half-even(x * (127 / amax)) in fp32, dequantized as q * (amax / 127). */
static double *quantized_x(const view *x) {
    double *o = malloc((size_t)(x->T * x->C) * sizeof(double));
    assert_non_null(o);
    for (int64_t t = 0; t < x->T; t++)
        for (int64_t b = 0; b < x->C; b += 16) {
            float amax = 0;
            for (int i = 0; i < 16; i++) amax = fmaxf(amax, fabsf(*at(x, t, b + i)));
            float id = amax > 0 ? 127.0f / amax : 0.0f, d = amax / 127.0f;
            for (int i = 0; i < 16; i++) {
                float q = nearbyintf(*at(x, t, b + i) * id);
                o[t * x->C + b + i] = (double)q * (double)d;
            }
        }
    return o;
}

/* ---------------------------------------------------------------- weights */

typedef struct qweight {
    cn_tensor t, bs;   /* the weight and its block scales */
    uint8_t *buf, *sbuf;
    double *val;       /* [N][K] dequantized */
    int64_t N, K;
} qweight;

/* A random NVFP4 (dt CN_NVFP4) or MXFP8 (CN_MXFP8) weight. Rows and scale rows carry padding
 * bytes; scales cover subnormal E4M3 codes and zero blocks. */
static qweight qweight_rand(rng *r, cn_dtype dt, int64_t N, int64_t K, float g) {
    qweight w = {.N = N, .K = K};
    const int fp4 = dt == CN_NVFP4;
    const int64_t blk = fp4 ? 16 : 32, nb = K / blk;
    const int64_t ld = (fp4 ? K / 2 : K) + 3, lds = nb + 2;
    w.buf = malloc((size_t)(N * ld) + 1);
    w.sbuf = malloc((size_t)(N * lds) + 1);
    w.val = malloc((size_t)(N * K + 1) * sizeof(double));
    assert_true(w.buf && w.sbuf && w.val);
    memset(w.buf, 0xa5, (size_t)(N * ld));
    memset(w.sbuf, 0xa5, (size_t)(N * lds));
    for (int64_t n = 0; n < N; n++) {
        uint8_t *row = w.buf + n * ld, *srow = w.sbuf + n * lds;
        for (int64_t b = 0; b < nb; b++) {
            uint8_t sc;
            if (fp4) {
                uint64_t u = rng_next(r) % 16;
                sc = u == 0 ? 0 : u == 1 ? (uint8_t)(1 + rng_next(r) % 7) /* subnormal */
                                         : (uint8_t)(0x28 + rng_next(r) % 48);
            } else {
                sc = (uint8_t)(112 + rng_next(r) % 32); /* 2^-15 .. 2^16 (past 2^7 too) */
            }
            srow[b] = sc;
            double s = fp4 ? (double)cn_e4m3_to_f32(sc) * g : (double)cn_e8m0_to_f32(sc);
            for (int64_t i = 0; i < blk; i++) {
                int64_t k = b * blk + i;
                double v;
                if (fp4) {
                    uint8_t nib = (uint8_t)(rng_next(r) & 15);
                    if (k % 2) row[k / 2] = (uint8_t)((row[k / 2] & 0x0f) | (nib << 4));
                    else row[k / 2] = nib;
                    v = (double)cn_e2m1_to_f32(nib);
                } else {
                    uint8_t c = (uint8_t)rng_next(r);
                    if ((c & 0x7f) == 0x7f) c ^= 1;
                    row[k] = c;
                    v = (double)cn_e4m3_to_f32(c);
                }
                w.val[n * K + k] = v * s;
            }
        }
    }
    w.t = cn_tensor_2d(dt, N, K, w.buf);
    w.t.stride[0] = ld;
    w.bs = cn_tensor_2d(fp4 ? CN_F8_E4M3 : CN_F8_E8M0, N, nb, w.sbuf);
    w.bs.stride[0] = lds;
    w.t.block_scale = &w.bs;
    if (fp4) w.t.scale = g;
    return w;
}

/* Wires t.block_scale to this copy's bs (after the struct moved). */
static void qweight_fix(qweight *w) { w->t.block_scale = &w->bs; }

static void qweight_free(qweight *w) {
    free(w->buf);
    free(w->sbuf);
    free(w->val);
}

/* y[t][n] = sum_k xs[t][k] w[n][k] in double; xs packed [T][K] (NULL: x itself). */
static double *ref_mm(const view *x, const double *xs, const qweight *w) {
    double *y = malloc((size_t)(x->T * w->N + 1) * sizeof(double));
    assert_non_null(y);
    for (int64_t t = 0; t < x->T; t++)
        for (int64_t n = 0; n < w->N; n++) {
            double s = 0;
            for (int64_t k = 0; k < w->K; k++)
                s += (xs ? xs[t * w->K + k] : (double)*at(x, t, k)) * w->val[n * w->K + k];
            y[t * w->N + n] = s;
        }
    return y;
}

/* ---------------------------------------------------------------- matmul */

static double g_worst_unquantized = 0;

static void check_mm(cn_backend *b, int isa, rng *r, cn_dtype dt, int64_t T, int64_t N,
                     int64_t K) {
    char what[128];
    snprintf(what, sizeof what, "matmul %s %s T=%lld N=%lld K=%lld", cn_dtype_name(dt),
             k_isa_name[isa], (long long)T, (long long)N, (long long)K);
    qweight w = qweight_rand(r, dt, N, K, 0.013f);
    qweight_fix(&w);
    view x = view_rand(r, T, K, 5);
    view y = view_make(T, N, 2);
    assert_int_equal(cn_op_matmul(b, &y.t, &w.t, &x.t), CN_OK);
    if (dt == CN_NVFP4) {
        double *xq = quantized_x(&x);
        double *ref = ref_mm(&x, xq, &w);
        expect_close(what, &y, ref, 2e-5);
        double *ref0 = ref_mm(&x, NULL, &w);
        double e = rel_err(&y, ref0);
        if (T * N < 8) e = 0; /* one lone dot product may cancel down to its rounding error */
        if (e > g_worst_unquantized) g_worst_unquantized = e;
        if (e > 2e-2) {
            print_error("%s: %.3g from the unquantized-x reference\n", what, e);
            fail();
        }
        free(ref0);
        free(ref);
        free(xq);
    } else {
        double *ref = ref_mm(&x, NULL, &w);
        expect_close(what, &y, ref, 2e-5);
        free(ref);
    }
    view_free(&x);
    view_free(&y);
    qweight_free(&w);
}

static void test_matmul_every_isa_and_odd_shapes(void **state) {
    (void)state;
    /* K: one block, tails of 16/32/48 past a 64 chunk, 256 superchunks and their tails */
    static const int64_t fp4_shapes[][3] = {{1, 1, 16},   {1, 37, 112}, {5, 33, 48},
                                            {67, 70, 160}, {4, 16, 256}, {3, 5, 16},
                                            {2, 9, 272},  {6, 3, 320},  {9, 6, 528},
                                            {1, 7, 1344}};
    static const int64_t mx_shapes[][3] = {{1, 1, 32},   {1, 37, 96},  {5, 33, 64},
                                           {67, 70, 160}, {4, 16, 256}, {3, 5, 32},
                                           {2, 9, 288},  {6, 3, 320},  {1, 7, 1344}};
    rng r = {11};
    for (int isa = 0; isa < N_ISA; isa++) {
        cn_backend *b = cpu_backend_isa(2, isa);
        for (size_t s = 0; s < sizeof fp4_shapes / sizeof *fp4_shapes; s++)
            check_mm(b, isa, &r, CN_NVFP4, fp4_shapes[s][0], fp4_shapes[s][1], fp4_shapes[s][2]);
        for (size_t s = 0; s < sizeof mx_shapes / sizeof *mx_shapes; s++)
            check_mm(b, isa, &r, CN_MXFP8, mx_shapes[s][0], mx_shapes[s][1], mx_shapes[s][2]);
        cn_backend_free(b);
    }
    fprintf(stderr, "nvfp4 vs unquantized-x reference: worst rel err %.3g\n", g_worst_unquantized);
}

static int views_equal(const view *a, const view *c) {
    return a->T == c->T && a->W == c->W &&
           memcmp(a->buf, c->buf, (size_t)(a->T * a->W) * sizeof(float)) == 0;
}

static void test_simd_matches_scalar_and_threads_agree(void **state) {
    (void)state;
    rng r = {12};
    cn_backend *bs[6];
    for (int i = 0; i < 6; i++) bs[i] = cpu_backend_isa(i % 2 ? 3 : 1, i / 2);
    const cn_dtype dts[2] = {CN_NVFP4, CN_MXFP8};
    for (int d = 0; d < 2; d++) {
        const int64_t T = 13, N = 45, K = 352;
        qweight w = qweight_rand(&r, dts[d], N, K, 0.5f);
        qweight_fix(&w);
        view x = view_rand(&r, T, K, 4);
        view y[6];
        for (int i = 0; i < 6; i++) {
            y[i] = view_make(T, N, 1);
            assert_int_equal(cn_op_matmul(bs[i], &y[i].t, &w.t, &x.t), CN_OK);
        }
        for (int i = 0; i < 6; i += 2) assert_true(views_equal(&y[i], &y[i + 1]));
        /* decode's one-row matmul (the streaming path) gives each row exactly as prefill did */
        for (int i = 0; i < 6; i += 2)
            for (int64_t t = 0; t < T; t++) {
                view y1 = view_make(1, N, 1);
                cn_tensor x1 = cn_tensor_rows(&x.t, t, 1);
                assert_int_equal(cn_op_matmul(bs[i], &y1.t, &w.t, &x1), CN_OK);
                assert_memory_equal(at(&y1, 0, 0), at(&y[i], t, 0), (size_t)N * sizeof(float));
                view_free(&y1);
            }
        double *ys = malloc((size_t)(T * N) * sizeof(double));
        for (int64_t t = 0; t < T; t++)
            for (int64_t n = 0; n < N; n++) ys[t * N + n] = *at(&y[2], t, n);
        expect_close("best vs scalar", &y[0], ys, 1e-5);
        expect_close("avx2 vs scalar", &y[4], ys, 1e-5);
        free(ys);
        for (int i = 0; i < 6; i++) view_free(&y[i]);
        view_free(&x);
        qweight_free(&w);
    }
    for (int i = 0; i < 6; i++) cn_backend_free(bs[i]);
}

/* ---------------------------------------------------------------- matmul_gather */

/* Experts of dts[e] (NVFP4, MXFP8 or BF16); ids random; x has T rows or T*k rows. */
static void check_gather(cn_backend *b, int isa, rng *r, const cn_dtype *dts, int n_w, int64_t T,
                         int64_t k, int64_t N, int64_t K, int x_per_row) {
    qweight w[6];
    uint16_t *bf[6] = {NULL};
    cn_tensor bft[6];
    const cn_tensor *wp[6];
    double *val[6];
    for (int e = 0; e < n_w; e++) {
        if (dts[e] == CN_BF16) {
            bf[e] = malloc((size_t)(N * K) * 2);
            val[e] = malloc((size_t)(N * K) * sizeof(double));
            for (int64_t i = 0; i < N * K; i++) {
                bf[e][i] = cn_f32_to_bf16(rng_unif(r, -0.1f, 0.1f));
                val[e][i] = cn_bf16_to_f32(bf[e][i]);
            }
            bft[e] = cn_tensor_2d(CN_BF16, N, K, bf[e]);
            wp[e] = &bft[e];
        } else {
            w[e] = qweight_rand(r, dts[e], N, K, 0.02f * (float)(e + 1));
            qweight_fix(&w[e]);
            wp[e] = &w[e].t;
            val[e] = w[e].val;
        }
    }
    const int64_t rows = T * k;
    int32_t *idb = malloc((size_t)rows * sizeof(int32_t));
    for (int64_t i = 0; i < rows; i++) idb[i] = (int32_t)(rng_next(r) % (uint64_t)n_w);
    cn_tensor ids = cn_tensor_2d(CN_I32, T, k, idb);
    view x = view_rand(r, x_per_row ? rows : T, K, 3);
    view y = view_make(rows, N, 2);
    assert_int_equal(cn_op_matmul_gather(b, &y.t, wp, n_w, &x.t, &ids), CN_OK);
    double *xq = quantized_x(&x);
    double *ref = malloc((size_t)(rows * N) * sizeof(double));
    for (int64_t row = 0; row < rows; row++) {
        int e = idb[row];
        int64_t xr = x_per_row ? row : row / k;
        for (int64_t n = 0; n < N; n++) {
            double s = 0;
            for (int64_t kk = 0; kk < K; kk++) {
                double xv = dts[e] == CN_NVFP4 ? xq[xr * K + kk] : (double)*at(&x, xr, kk);
                s += xv * val[e][n * K + kk];
            }
            ref[row * N + n] = s;
        }
    }
    char what[96];
    snprintf(what, sizeof what, "matmul_gather %s T=%lld k=%lld", k_isa_name[isa], (long long)T,
             (long long)k);
    expect_close(what, &y, ref, 2e-5);
    free(ref);
    free(xq);
    view_free(&x);
    view_free(&y);
    free(idb);
    for (int e = 0; e < n_w; e++) {
        if (bf[e]) {
            free(bf[e]);
            free(val[e]);
        } else {
            qweight_free(&w[e]);
        }
    }
}

static void test_matmul_gather(void **state) {
    (void)state;
    for (int isa = 0; isa < N_ISA; isa++) {
        cn_backend *b = cpu_backend_isa(2, isa);
        rng r = {13};
        const cn_dtype fp4[4] = {CN_NVFP4, CN_NVFP4, CN_NVFP4, CN_NVFP4};
        const cn_dtype mx[4] = {CN_MXFP8, CN_MXFP8, CN_MXFP8, CN_MXFP8};
        const cn_dtype mixed[3] = {CN_NVFP4, CN_BF16, CN_MXFP8};
        check_gather(b, isa, &r, fp4, 4, 7, 3, 21, 96, 0);
        check_gather(b, isa, &r, fp4, 4, 7, 3, 21, 96, 1);
        check_gather(b, isa, &r, mx, 4, 7, 3, 21, 96, 0);
        check_gather(b, isa, &r, mx, 4, 1, 1, 1, 64, 1);
        check_gather(b, isa, &r, mixed, 3, 9, 2, 17, 160, 0);
        check_gather(b, isa, &r, mixed, 3, 150, 2, 8, 32, 1); /* > 64 rows per expert */
        cn_backend_free(b);
    }
}

/* cn_weight_view: a block of a quantized weight (rows from r0, columns from c0, whole scale blocks)
 * multiplies as that block of the parent: its data and its block scales both start there, and its
 * rows keep the parent's strides (the MoE's shared-expert parts are such views). */
static void check_view(cn_backend *b, int isa, rng *r, cn_dtype dt, int64_t T) {
    const int64_t N = 40, K = 256, r0 = 8, nr = 24, c0 = 64, nc = 128;
    qweight w = qweight_rand(r, dt, N, K, 0.013f);
    qweight_fix(&w);
    cn_tensor bs;
    cn_tensor v = cn_weight_view(&w.t, r0, nr, c0, nc, &bs);
    assert_ptr_equal(v.block_scale, &bs);
    assert_int_equal(bs.shape[0], nr);
    assert_int_equal(bs.shape[1], nc / (dt == CN_NVFP4 ? 16 : 32));
    assert_int_equal(v.stride[0], w.t.stride[0]);
    qweight sub = {.N = nr, .K = nc};
    sub.val = malloc((size_t)(nr * nc) * sizeof(double));
    assert_non_null(sub.val);
    for (int64_t n = 0; n < nr; n++)
        for (int64_t k = 0; k < nc; k++) sub.val[n * nc + k] = w.val[(r0 + n) * K + c0 + k];
    view x = view_rand(r, T, nc, 3);
    view y = view_make(T, nr, 2);
    assert_int_equal(cn_op_matmul(b, &y.t, &v, &x.t), CN_OK);
    double *xq = dt == CN_NVFP4 ? quantized_x(&x) : NULL;
    double *ref = ref_mm(&x, xq, &sub);
    char what[96];
    snprintf(what, sizeof what, "view of %s %s T=%lld", cn_dtype_name(dt), k_isa_name[isa],
             (long long)T);
    expect_close(what, &y, ref, 2e-5);
    free(ref);
    free(xq);
    free(sub.val);
    view_free(&x);
    view_free(&y);
    qweight_free(&w);
}

static void test_weight_view(void **state) {
    (void)state;
    for (int isa = 0; isa < N_ISA; isa++) {
        cn_backend *b = cpu_backend_isa(2, isa);
        rng r = {17};
        for (int t = 0; t < 2; t++) {
            check_view(b, isa, &r, CN_NVFP4, t ? 37 : 1); /* decode's walk and the tiles' */
            check_view(b, isa, &r, CN_MXFP8, t ? 37 : 1);
        }
        cn_backend_free(b);
    }
}

/* ---------------------------------------------------------------- get_rows */

static void test_get_rows(void **state) {
    (void)state;
    rng r = {14};
    for (int isa = 0; isa < N_ISA; isa++) {
        cn_backend *b = cpu_backend_isa(1, isa);
        const cn_dtype dts[2] = {CN_NVFP4, CN_MXFP8};
        for (int d = 0; d < 2; d++) {
            const int64_t V = 11, H = 96;
            qweight w = qweight_rand(&r, dts[d], V, H, 0.3f);
            qweight_fix(&w);
            int32_t idb[5] = {3, 0, 10, 3, 7};
            cn_tensor ids = cn_tensor_1d(CN_I32, 5, idb);
            view y = view_make(5, H, 3);
            assert_int_equal(cn_op_get_rows(b, &y.t, &w.t, &ids), CN_OK);
            double *ref = malloc((size_t)(5 * H) * sizeof(double));
            for (int t = 0; t < 5; t++)
                for (int64_t h = 0; h < H; h++) ref[t * H + h] = w.val[idb[t] * H + h];
            expect_close("get_rows", &y, ref, 1e-7);
            free(ref);
            view_free(&y);
            qweight_free(&w);
        }
        cn_backend_free(b);
    }
}

/* ---------------------------------------------------------------- contract */

static void test_bad_block_scales_rejected(void **state) {
    (void)state;
    cn_backend *b = cpu_backend_isa(1, ISA_BEST);
    rng r = {15};
    qweight w = qweight_rand(&r, CN_NVFP4, 4, 32, 1.0f);
    qweight_fix(&w);
    view x = view_rand(&r, 2, 32, 0), y = view_make(2, 4, 1);
    assert_int_equal(cn_op_matmul(b, &y.t, &w.t, &x.t), CN_OK);
    w.t.block_scale = NULL; /* missing */
    assert_int_equal(cn_op_matmul(b, &y.t, &w.t, &x.t), CN_EINVAL);
    qweight_fix(&w);
    w.bs.shape[1] = 3; /* wrong shape */
    assert_int_equal(cn_op_matmul(b, &y.t, &w.t, &x.t), CN_EINVAL);
    w.bs.shape[1] = 2;
    w.bs.dtype = CN_F32; /* wrong dtype */
    assert_int_equal(cn_op_matmul(b, &y.t, &w.t, &x.t), CN_EINVAL);
    w.bs.dtype = CN_U8; /* raw bytes are accepted */
    assert_int_equal(cn_op_matmul(b, &y.t, &w.t, &x.t), CN_OK);
    view_free(&x);
    view_free(&y);
    qweight_free(&w);

    qweight m = qweight_rand(&r, CN_MXFP8, 4, 64, 1.0f);
    qweight_fix(&m);
    m.t.shape[1] = 48; /* K not a multiple of 32 */
    m.bs.shape[1] = 1;
    view x2 = view_rand(&r, 1, 48, 0), y2 = view_make(1, 4, 0);
    assert_int_equal(cn_op_matmul(b, &y2.t, &m.t, &x2.t), CN_EINVAL);
    view_free(&x2);
    view_free(&y2);
    qweight_free(&m);
    cn_backend_free(b);
}

/* A non-finite activation never turns into a finite result. */
static void test_nonfinite_activation_propagates(void **state) {
    (void)state;
    rng r = {16};
    for (int isa = 0; isa < N_ISA; isa++) {
        cn_backend *b = cpu_backend_isa(1, isa);
        qweight w = qweight_rand(&r, CN_NVFP4, 3, 64, 1.0f);
        qweight_fix(&w);
        memset(w.sbuf, 0x38, 3 * (64 / 16 + 2)); /* every block scale 1: no zero blocks */
        view x = view_rand(&r, 2, 64, 0), y = view_make(2, 3, 0);
        *at(&x, 1, 20) = INFINITY;
        assert_int_equal(cn_op_matmul(b, &y.t, &w.t, &x.t), CN_OK);
        for (int n = 0; n < 3; n++) {
            assert_true(isfinite(*at(&y, 0, n)));
            assert_false(isfinite(*at(&y, 1, n)));
        }
        view_free(&x);
        view_free(&y);
        qweight_free(&w);
        cn_backend_free(b);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_every_isa_and_odd_shapes),
        cmocka_unit_test(test_simd_matches_scalar_and_threads_agree),
        cmocka_unit_test(test_matmul_gather),
        cmocka_unit_test(test_weight_view),
        cmocka_unit_test(test_get_rows),
        cmocka_unit_test(test_bad_block_scales_rejected),
        cmocka_unit_test(test_nonfinite_activation_propagates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
