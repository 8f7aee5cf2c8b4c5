/* test_cpu_ops.c - every CPU backend op against a naive double-precision reference written here.
 *
 * Inputs come from a fixed-seed PRNG. Activations are column views of wider buffers (rows
 * strided, first column misaligned), and the padding around every output view is checked to be
 * untouched. Tolerances are on max |got - ref| relative to max |ref| and are stated per op:
 *   matmul / matmul_gather (fp32 sums of up to ~300 terms)  2e-5
 *   rmsnorm, gated_rmsnorm, moe_combine, elementwise          2e-6
 *   conv1d                                                    2e-6
 *   ssm_scan (9 steps of a recurrence)                        2e-5
 *   attention, sliding-window attention (online softmax)      2e-5
 *   get_rows, routing ids                                     exact
 * Equalities that the backend promises exactly (thread counts 1 vs 3, a scan vs its steps or
 * segments, conv1d in one call vs two, either with captures vs cut at them) are checked with
 * memcmp.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/fp.h"
#include "tensor/backend.h"
#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/cpu_exp.h"
#include "tensor/cpu_test_util.h"

/* ---------------------------------------------------------------- helpers */

static cn_backend *backend(int n_threads, int isa) {
    cn_backend *b = cpu_backend_isa(n_threads, isa);
    assert_string_equal(cn_backend_name(b), "cpu");
    return b;
}

static view view_rand(rng *r, int64_t T, int64_t C, int64_t pad, float lo, float hi) {
    view v = view_make(T, C, pad);
    for (int64_t i = 0; i < T * v.W; i++) v.buf[i] = rng_unif(r, lo, hi);
    return v;
}

static float *at(const view *v, int64_t t, int64_t c) { return &v->buf[t * v->W + v->off + c]; }

/* Copies the view's values out, rows packed. */
static float *view_get(const view *v) {
    float *o = malloc((size_t)(v->T * v->C + 1) * sizeof(float));
    assert_non_null(o);
    for (int64_t t = 0; t < v->T; t++)
        for (int64_t c = 0; c < v->C; c++) o[t * v->C + c] = *at(v, t, c);
    return o;
}

static void view_check_pad(const view *v) {
    for (int64_t t = 0; t < v->T; t++)
        for (int64_t c = 0; c < v->W; c++)
            if (c < v->off || c >= v->off + v->C) assert_true(v->buf[t * v->W + c] == SENTINEL);
}

static view view_clone(const view *v) {
    view o = *v;
    o.buf = malloc((size_t)(v->T * v->W + 1) * sizeof(float));
    assert_non_null(o.buf);
    memcpy(o.buf, v->buf, (size_t)(v->T * v->W) * sizeof(float));
    cn_tensor full = cn_tensor_2d(CN_F32, v->T, v->W, o.buf);
    o.t = cn_tensor_cols(&full, v->off, v->C);
    return o;
}

static void view_free(view *v) { free(v->buf); }

static int views_equal(const view *a, const view *b) {
    return a->T == b->T && a->W == b->W &&
           memcmp(a->buf, b->buf, (size_t)(a->T * a->W) * sizeof(float)) == 0;
}

static void expect_close(const char *what, const float *got, const double *ref, int64_t n,
                         double tol) {
    double maxref = 1e-30, maxerr = 0;
    int64_t worst = 0;
    for (int64_t i = 0; i < n; i++) {
        if (fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
        double e = fabs((double)got[i] - ref[i]);
        if (!(e <= maxerr)) { /* catches NaN too */
            maxerr = isnan(e) ? INFINITY : e;
            worst = i;
        }
    }
    if (maxerr > tol * maxref) {
        print_error("%s: max err %.3g at %lld (got %.9g, ref %.9g) > %.1g * max|ref| %.3g\n", what,
                    maxerr, (long long)worst, (double)got[worst], ref[worst], tol, maxref);
        fail();
    }
}

static void expect_view_close(const char *what, const view *v, const double *ref, double tol) {
    float *g = view_get(v);
    expect_close(what, g, ref, v->T * v->C, tol);
    free(g);
    view_check_pad(v);
}

/* A weight matrix [N, K] of a dtype, rows strided by K + pad values; val holds the decoded values
 * times the tensor scale, in double. */
typedef struct weight {
    cn_tensor t;
    void *buf;
    double *val; /* [N][K] */
    int64_t N, K;
} weight;

static weight weight_rand(rng *r, cn_dtype dt, int64_t N, int64_t K, int64_t pad, float scale) {
    weight w = {.N = N, .K = K};
    size_t es = cn_dtype_size(dt);
    int64_t ld = K + pad;
    w.buf = malloc((size_t)(N * ld) * es + 1);
    w.val = malloc((size_t)(N * K + 1) * sizeof(double));
    assert_non_null(w.buf);
    assert_non_null(w.val);
    memset(w.buf, 0x55, (size_t)(N * ld) * es);
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            char *p = (char *)w.buf + (n * ld + k) * (int64_t)es;
            float f = rng_unif(r, -1, 1);
            double v;
            switch (dt) {
            case CN_BF16: {
                uint16_t h = cn_f32_to_bf16(f);
                memcpy(p, &h, 2);
                v = cn_bf16_to_f32(h);
                break;
            }
            case CN_F16: {
                uint16_t h = cn_f32_to_f16(f);
                memcpy(p, &h, 2);
                v = cn_f16_to_f32(h);
                break;
            }
            case CN_F8_E4M3: { /* every finite code, subnormals and 448 included */
                uint8_t c = (uint8_t)rng_next(r);
                if ((c & 0x7f) == 0x7f) c ^= 1;
                *(uint8_t *)p = c;
                v = (double)cn_e4m3_to_f32(c) * scale;
                break;
            }
            default:
                memcpy(p, &f, 4);
                v = f;
                break;
            }
            w.val[n * K + k] = v;
        }
    w.t = cn_tensor_2d(dt, N, K, w.buf);
    w.t.stride[0] = ld * (int64_t)es;
    if (dt == CN_F8_E4M3) w.t.scale = scale;
    return w;
}

static void weight_free(weight *w) {
    free(w->buf);
    free(w->val);
}

static const cn_dtype k_wdtypes[] = {CN_F32, CN_BF16, CN_F16, CN_F8_E4M3};
#define N_WDTYPES 4

/* y[t][n] = sum_k x[t][k] w[n][k], in double. */
static double *ref_matmul(const view *x, const weight *w) {
    double *y = malloc((size_t)(x->T * w->N + 1) * sizeof(double));
    assert_non_null(y);
    for (int64_t t = 0; t < x->T; t++)
        for (int64_t n = 0; n < w->N; n++) {
            double s = 0;
            for (int64_t k = 0; k < w->K; k++) s += (double)*at(x, t, k) * w->val[n * w->K + k];
            y[t * w->N + n] = s;
        }
    return y;
}

/* ---------------------------------------------------------------- matmul */

static void check_matmul(cn_backend *b, rng *r, cn_dtype dt, int64_t T, int64_t N, int64_t K) {
    char what[96];
    snprintf(what, sizeof what, "matmul %s T=%lld N=%lld K=%lld", cn_dtype_name(dt), (long long)T,
             (long long)N, (long long)K);
    weight w = weight_rand(r, dt, N, K, 3, 0.37f);
    view x = view_rand(r, T, K, 5, -1, 1);
    view y = view_make(T, N, 2);
    assert_int_equal(cn_op_matmul(b, &y.t, &w.t, &x.t), CN_OK);
    double *ref = ref_matmul(&x, &w);
    expect_view_close(what, &y, ref, 2e-5);
    free(ref);
    view_free(&x);
    view_free(&y);
    weight_free(&w);
}

static void test_matmul_all_dtypes_and_odd_sizes(void **state) {
    (void)state;
    static const int64_t shapes[][3] = {{1, 1, 1},   {1, 37, 100}, {5, 33, 67}, {67, 70, 129},
                                        {4, 16, 256}, {3, 5, 16},   {2, 9, 8},   {1, 1, 300},
                                        {6, 3, 31}};
    rng r = {1};
    for (int isa = 0; isa < N_ISA; isa++) {
        cn_backend *b = backend(2, isa);
        for (int d = 0; d < N_WDTYPES; d++)
            for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
                check_matmul(b, &r, k_wdtypes[d], shapes[s][0], shapes[s][1], shapes[s][2]);
        cn_backend_free(b);
    }
}

static void test_matmul_simd_matches_scalar_and_threads_agree(void **state) {
    (void)state;
    rng r = {2};
    /* pairs of (1 thread, 3 threads) for best, scalar and AVX2 */
    cn_backend *bs[6];
    for (int i = 0; i < 6; i++) bs[i] = backend(i % 2 ? 3 : 1, i / 2);
    /* K = 301 takes the per-output sums of each block; K = 256 (a multiple of 16) the transposed
     * ones, with T = 14 or 15 reaching tiles of 4, 2 or 3, and 1 rows */
    for (int d = 0; d < 2 * N_WDTYPES; d++) {
        const int64_t T = d < N_WDTYPES ? 13 : 14 + d % 2, N = 45, K = d < N_WDTYPES ? 301 : 256;
        weight w = weight_rand(&r, k_wdtypes[d % N_WDTYPES], N, K, 0, 1.5f);
        view x = view_rand(&r, T, K, 4, -1, 1);
        view y[6];
        for (int i = 0; i < 6; i++) {
            y[i] = view_make(T, N, 1);
            assert_int_equal(cn_op_matmul(bs[i], &y[i].t, &w.t, &x.t), CN_OK);
        }
        for (int i = 0; i < 6; i += 2) assert_true(views_equal(&y[i], &y[i + 1])); /* bit-identical */
        /* decode's one-row matmul (the streaming path) gives each row exactly as prefill did */
        for (int i = 0; i < 6; i += 2)
            for (int64_t t = 0; t < T; t++) {
                view y1 = view_make(1, N, 1);
                cn_tensor x1 = cn_tensor_rows(&x.t, t, 1);
                assert_int_equal(cn_op_matmul(bs[i], &y1.t, &w.t, &x1), CN_OK);
                assert_memory_equal(at(&y1, 0, 0), at(&y[i], t, 0), (size_t)N * sizeof(float));
                view_free(&y1);
            }
        float *ys = view_get(&y[2]);
        double *yd = malloc((size_t)(T * N) * sizeof(double));
        for (int64_t i = 0; i < T * N; i++) yd[i] = ys[i];
        expect_view_close("matmul best vs scalar", &y[0], yd, 1e-5);
        expect_view_close("matmul avx2 vs scalar", &y[4], yd, 1e-5);
        free(ys);
        free(yd);
        for (int i = 0; i < 6; i++) view_free(&y[i]);
        view_free(&x);
        weight_free(&w);
    }
    for (int i = 0; i < 6; i++) cn_backend_free(bs[i]);
}

/* Decode's one-row matmul takes weight blocks of up to 1024 rows (a share of N per thread) and
 * streams 8 runs of consecutive rows of each at once, with the odd rows left over done apart.
 * Each row must come out as the multi-row matmul computes it, on 1, 2 or 3 threads, and close
 * to the reference; the gathered matmul of one token (MoE decode) likewise per expert. */
static void test_matmul_decode_streams_match_rows(void **state) {
    (void)state;
    static const int64_t shapes[][2] = {{1003, 256}, {777, 301}, {2100, 48}};
    rng r = {21};
    for (int isa = 0; isa < N_ISA; isa++) {
        cn_backend *bs[3];
        for (int i = 0; i < 3; i++) bs[i] = backend(i + 1, isa);
        for (int d = 0; d < N_WDTYPES; d++)
            for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
                const int64_t N = shapes[sh][0], K = shapes[sh][1], T = 12; /* a prefill's path */
                weight w = weight_rand(&r, k_wdtypes[d], N, K, 1, 0.8f);
                view x = view_rand(&r, T, K, 2, -1, 1);
                view y = view_make(T, N, 1);
                assert_int_equal(cn_op_matmul(bs[0], &y.t, &w.t, &x.t), CN_OK);
                double *ref = ref_matmul(&x, &w);
                expect_view_close("matmul rows for decode", &y, ref, 2e-5);
                free(ref);
                for (int i = 0; i < 3; i++)
                    for (int64_t n = 2; n <= 8; n++) { /* a verify's rows stream like decode's */
                        view yn = view_make(n, N, 1);
                        cn_tensor xn = cn_tensor_rows(&x.t, 1, n);
                        assert_int_equal(cn_op_matmul(bs[i], &yn.t, &w.t, &xn), CN_OK);
                        for (int64_t t = 0; t < n; t++)
                            assert_memory_equal(at(&yn, t, 0), at(&y, 1 + t, 0), (size_t)N * sizeof(float));
                        view_free(&yn);
                    }
                for (int i = 0; i < 3; i++)
                    for (int64_t t = 0; t < T; t += 2) {
                        view y1 = view_make(1, N, 1);
                        cn_tensor x1 = cn_tensor_rows(&x.t, t, 1);
                        assert_int_equal(cn_op_matmul(bs[i], &y1.t, &w.t, &x1), CN_OK);
                        assert_memory_equal(at(&y1, 0, 0), at(&y, t, 0), (size_t)N * sizeof(float));
                        /* one token through two experts, w twice: both rows equal y's row t */
                        const cn_tensor *wp[2] = {&w.t, &w.t};
                        int32_t idb[2] = {1, 0};
                        cn_tensor ids = cn_tensor_2d(CN_I32, 1, 2, idb);
                        view yg = view_make(2, N, 1);
                        assert_int_equal(cn_op_matmul_gather(bs[i], &yg.t, wp, 2, &x1, &ids), CN_OK);
                        assert_memory_equal(at(&yg, 0, 0), at(&y, t, 0), (size_t)N * sizeof(float));
                        assert_memory_equal(at(&yg, 1, 0), at(&y, t, 0), (size_t)N * sizeof(float));
                        view_free(&yg);
                        view_free(&y1);
                    }
                view_free(&x);
                view_free(&y);
                weight_free(&w);
            }
        for (int i = 0; i < 3; i++) cn_backend_free(bs[i]);
    }
}

/* BF16 prefill on AVX-512 runs its own kernel (kernel table mm_rows: tiles of 6 x rows by 4 weight
 * rows, k in chunks of 1024 values, tasks of 96 x rows by 64 weight rows). Shapes that cross each
 * of those bounds (K over two chunks with and without a tail, or under one vector; T over one
 * task and not a multiple of 6; N over one task with a remainder under 4) must give every row the
 * bits of the one-row matmul (decode's path), on 1 and 3 threads, close to the reference; the
 * gathered matmul of the same rows (two experts sharing w, more than a task's rows each) too. */
static void test_matmul_bf16_prefill_rows_match_decode(void **state) {
    (void)state;
    static const int64_t shapes[][3] = {{103, 70, 2100}, {100, 67, 2048}, {7, 9, 1040}, {9, 5, 12}};
    rng r = {22};
    cn_backend *bs[2] = {backend(1, ISA_BEST), backend(3, ISA_BEST)};
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
        const int64_t T = shapes[sh][0], N = shapes[sh][1], K = shapes[sh][2];
        weight w = weight_rand(&r, CN_BF16, N, K, 1, 0.8f);
        view x = view_rand(&r, T, K, 2, -1, 1);
        view y[2];
        for (int i = 0; i < 2; i++) {
            y[i] = view_make(T, N, 1);
            assert_int_equal(cn_op_matmul(bs[i], &y[i].t, &w.t, &x.t), CN_OK);
        }
        assert_true(views_equal(&y[0], &y[1]));
        double *ref = ref_matmul(&x, &w);
        expect_view_close("bf16 prefill matmul", &y[0], ref, 2e-5);
        free(ref);
        for (int64_t t = 0; t < T; t++) {
            view y1 = view_make(1, N, 1);
            cn_tensor x1 = cn_tensor_rows(&x.t, t, 1);
            assert_int_equal(cn_op_matmul(bs[t % 2], &y1.t, &w.t, &x1), CN_OK);
            assert_memory_equal(at(&y1, 0, 0), at(&y[0], t, 0), (size_t)N * sizeof(float));
            view_free(&y1);
        }
        /* every token to both experts, in either order: rows 2t and 2t + 1 both equal y's row t */
        const cn_tensor *wp[2] = {&w.t, &w.t};
        int32_t *idb = malloc((size_t)(2 * T) * sizeof *idb);
        assert_non_null(idb);
        for (int64_t t = 0; t < T; t++) {
            idb[2 * t] = (int32_t)(t % 2);
            idb[2 * t + 1] = (int32_t)(1 - t % 2);
        }
        cn_tensor ids = cn_tensor_2d(CN_I32, T, 2, idb);
        view yg = view_make(2 * T, N, 1);
        assert_int_equal(cn_op_matmul_gather(bs[1], &yg.t, wp, 2, &x.t, &ids), CN_OK);
        for (int64_t t = 0; t < 2 * T; t++)
            assert_memory_equal(at(&yg, t, 0), at(&y[0], t / 2, 0), (size_t)N * sizeof(float));
        view_check_pad(&yg);
        view_free(&yg);
        free(idb);
        for (int i = 0; i < 2; i++) view_free(&y[i]);
        view_free(&x);
        weight_free(&w);
    }
    for (int i = 0; i < 2; i++) cn_backend_free(bs[i]);
}

/* Every E4M3 code through each ISA's decoding, exactly: one-hot rows of x pick single weights. */
static void test_matmul_f8_every_code(void **state) {
    (void)state;
    const int64_t K = 256, N = 2;
    uint8_t wb[2 * 256];
    for (int k = 0; k < K; k++) {
        uint8_t c = (uint8_t)k;
        if ((c & 0x7f) == 0x7f) c = 0; /* NaN codes: weights never hold them */
        wb[k] = c;
        wb[K + (K - 1 - k)] = c;
    }
    cn_tensor w = cn_tensor_2d(CN_F8_E4M3, N, K, wb);
    w.scale = 0.75f;
    float *xb = calloc((size_t)(K * K), sizeof(float)), *yb = malloc((size_t)(K * N) * sizeof(float));
    assert_true(xb && yb);
    for (int64_t t = 0; t < K; t++) xb[t * K + t] = 1.0f;
    cn_tensor x = cn_tensor_2d(CN_F32, K, K, xb), y = cn_tensor_2d(CN_F32, K, N, yb);
    for (int isa = 0; isa < N_ISA; isa++) {
        cn_backend *b = backend(1, isa);
        for (int64_t T = 1; T <= K; T += K - 1) { /* a decode row alone, then all rows */
            cn_tensor xs = cn_tensor_rows(&x, 0, T), ys = cn_tensor_rows(&y, 0, T);
            assert_int_equal(cn_op_matmul(b, &ys, &w, &xs), CN_OK);
            for (int64_t t = 0; t < T; t++) {
                assert_true(yb[t * N] == cn_e4m3_to_f32(wb[t]) * 0.75f);
                assert_true(yb[t * N + 1] == cn_e4m3_to_f32(wb[K + t]) * 0.75f);
            }
        }
        cn_backend_free(b);
    }
    free(xb);
    free(yb);
}

static void test_matmul_unsupported_weight(void **state) {
    (void)state;
    cn_backend *b = backend(1, ISA_BEST);
    assert_true(cn_backend_supports_weight(b, CN_F32));
    assert_true(cn_backend_supports_weight(b, CN_BF16));
    assert_true(cn_backend_supports_weight(b, CN_F16));
    assert_true(cn_backend_supports_weight(b, CN_F8_E4M3));
    assert_false(cn_backend_supports_weight(b, CN_I8));
    assert_true(cn_backend_supports_weight(b, CN_NVFP4));
    assert_true(cn_backend_supports_weight(b, CN_MXFP8));
    assert_false(cn_backend_supports_weight(b, CN_U8));
    assert_false(cn_backend_supports_weight(b, CN_F8_E5M2));
    int8_t wb[6] = {0};
    float xb[3] = {0}, yb[2] = {0};
    cn_tensor w = cn_tensor_2d(CN_I8, 2, 3, wb), x = cn_tensor_2d(CN_F32, 1, 3, xb),
              y = cn_tensor_2d(CN_F32, 1, 2, yb);
    assert_int_equal(cn_op_matmul(b, &y, &w, &x), CN_EUNSUPPORTED);
    cn_backend_free(b);
}

/* ---------------------------------------------------------------- matmul_gather */

/* ids [T, k] random in [0, n_used); x has T rows or T*k rows. */
static void check_gather(cn_backend *b, rng *r, const cn_dtype *dts, int n_w, int n_used, int64_t T,
                         int64_t k, int64_t N, int64_t K, int x_per_row, view *y_out) {
    weight w[8];
    const cn_tensor *wp[8];
    for (int e = 0; e < n_w; e++) {
        w[e] = weight_rand(r, dts[e], N, K, e % 2, 0.5f + (float)e);
        wp[e] = &w[e].t;
    }
    const int64_t rows = T * k;
    int32_t *idb = malloc((size_t)rows * sizeof(int32_t));
    for (int64_t i = 0; i < rows; i++) idb[i] = rng_int(r, n_used);
    cn_tensor ids = cn_tensor_2d(CN_I32, T, k, idb);
    view x = view_rand(r, x_per_row ? rows : T, K, 3, -1, 1);
    view y = view_make(rows, N, 2);
    assert_int_equal(cn_op_matmul_gather(b, &y.t, wp, n_w, &x.t, &ids), CN_OK);
    double *ref = malloc((size_t)(rows * N) * sizeof(double));
    for (int64_t row = 0; row < rows; row++) {
        const weight *we = &w[idb[row]];
        int64_t xr = x_per_row ? row : row / k;
        for (int64_t n = 0; n < N; n++) {
            double s = 0;
            for (int64_t kk = 0; kk < K; kk++) s += (double)*at(&x, xr, kk) * we->val[n * K + kk];
            ref[row * N + n] = s;
        }
    }
    expect_view_close("matmul_gather", &y, ref, 2e-5);
    free(ref);
    if (y_out) *y_out = y;
    else view_free(&y);
    view_free(&x);
    free(idb);
    for (int e = 0; e < n_w; e++) weight_free(&w[e]);
}

static void test_matmul_gather(void **state) {
    (void)state;
    for (int isa = 0; isa < N_ISA; isa++) {
        cn_backend *b = backend(2, isa);
        rng r = {3};
        for (int d = 0; d < N_WDTYPES; d++) {
            cn_dtype dts[5] = {k_wdtypes[d], k_wdtypes[d], k_wdtypes[d], k_wdtypes[d], k_wdtypes[d]};
            check_gather(b, &r, dts, 5, 4, 7, 3, 21, 70, 0, NULL); /* x: T rows; expert 4 unused */
            check_gather(b, &r, dts, 5, 4, 7, 3, 21, 70, 1, NULL); /* x: T*k rows */
            check_gather(b, &r, dts, 5, 5, 1, 1, 1, 9, 0, NULL);   /* one row, one column */
        }
        cn_dtype mixed[4] = {CN_BF16, CN_F8_E4M3, CN_F32, CN_F16};
        check_gather(b, &r, mixed, 4, 4, 9, 2, 17, 33, 0, NULL);
        check_gather(b, &r, mixed, 2, 2, 150, 2, 8, 16, 1, NULL); /* > 64 rows per expert */
        cn_backend_free(b);
    }
}

static void test_matmul_gather_threads_agree_and_bad_ids(void **state) {
    (void)state;
    cn_backend *b1 = backend(1, ISA_BEST), *b3 = backend(3, ISA_BEST);
    cn_dtype dts[6] = {CN_BF16, CN_BF16, CN_BF16, CN_BF16, CN_BF16, CN_BF16};
    view y1, y3;
    rng r1 = {4}, r3 = {4};
    check_gather(b1, &r1, dts, 6, 6, 20, 4, 64, 128, 0, &y1);
    check_gather(b3, &r3, dts, 6, 6, 20, 4, 64, 128, 0, &y3);
    assert_true(views_equal(&y1, &y3));
    view_free(&y1);
    view_free(&y3);

    /* an id out of range: CN_EINVAL and nothing written */
    rng r = {5};
    weight w = weight_rand(&r, CN_F32, 4, 8, 0, 1);
    const cn_tensor *wp[2] = {&w.t, &w.t};
    int32_t idb[4] = {0, 1, 2, 1};
    cn_tensor ids = cn_tensor_2d(CN_I32, 2, 2, idb);
    view x = view_rand(&r, 2, 8, 0, -1, 1);
    view y = view_make(4, 4, 1);
    assert_int_equal(cn_op_matmul_gather(b3, &y.t, wp, 2, &x.t, &ids), CN_EINVAL);
    idb[2] = -1;
    assert_int_equal(cn_op_matmul_gather(b3, &y.t, wp, 2, &x.t, &ids), CN_EINVAL);
    for (int64_t i = 0; i < y.T * y.W; i++) assert_true(y.buf[i] == SENTINEL);
    view_free(&x);
    view_free(&y);
    weight_free(&w);
    cn_backend_free(b1);
    cn_backend_free(b3);
}

/* ---------------------------------------------------------------- get_rows */

static void test_get_rows(void **state) {
    (void)state;
    cn_backend *b = backend(2, ISA_BEST);
    rng r = {6};
    for (int d = 0; d < N_WDTYPES; d++) {
        const int64_t V = 11, H = 37;
        weight w = weight_rand(&r, k_wdtypes[d], V, H, 2, 0.25f);
        int32_t idb[5] = {3, 0, 10, 3, 7};
        cn_tensor ids = cn_tensor_1d(CN_I32, 5, idb);
        view y = view_make(5, H, 3);
        assert_int_equal(cn_op_get_rows(b, &y.t, &w.t, &ids), CN_OK);
        double *ref = malloc((size_t)(5 * H) * sizeof(double));
        for (int t = 0; t < 5; t++)
            for (int64_t h = 0; h < H; h++) ref[t * H + h] = w.val[idb[t] * H + h];
        expect_view_close("get_rows", &y, ref, 0); /* decoding is exact */
        idb[1] = (int32_t)V;
        view y2 = view_make(5, H, 3);
        assert_int_equal(cn_op_get_rows(b, &y2.t, &w.t, &ids), CN_EINVAL);
        for (int64_t i = 0; i < y2.T * y2.W; i++) assert_true(y2.buf[i] == SENTINEL);
        free(ref);
        view_free(&y);
        view_free(&y2);
        weight_free(&w);
    }
    cn_backend_free(b);
}

/* ---------------------------------------------------------------- norms */

static void test_rmsnorm(void **state) {
    (void)state;
    cn_backend *b = backend(3, ISA_BEST);
    rng r = {7};
    const int64_t T = 3, C = 75;
    const float eps = 1e-5f;
    view x = view_rand(&r, T, C, 4, -2, 2);
    float wb[75];
    for (int i = 0; i < C; i++) wb[i] = rng_unif(&r, 0.5f, 1.5f);
    cn_tensor w = cn_tensor_1d(CN_F32, C, wb);
    view y = view_make(T, C, 1);
    assert_int_equal(cn_op_rmsnorm(b, &y.t, &x.t, &w, eps), CN_OK);
    double ref[3 * 75];
    for (int64_t t = 0; t < T; t++) {
        double ss = 0;
        for (int64_t c = 0; c < C; c++) ss += (double)*at(&x, t, c) * *at(&x, t, c);
        double inv = 1.0 / sqrt(ss / C + eps);
        for (int64_t c = 0; c < C; c++) ref[t * C + c] = *at(&x, t, c) * inv * wb[c];
    }
    expect_view_close("rmsnorm", &y, ref, 2e-6);
    /* in place gives the same values */
    view xi = view_clone(&x);
    assert_int_equal(cn_op_rmsnorm(b, &xi.t, &xi.t, &w, eps), CN_OK);
    float *a = view_get(&xi), *c = view_get(&y);
    assert_memory_equal(a, c, (size_t)(T * C) * sizeof(float));
    free(a);
    free(c);
    view_free(&xi);
    view_free(&x);
    view_free(&y);
    cn_backend_free(b);
}

static void test_gated_rmsnorm(void **state) {
    (void)state;
    cn_backend *b = backend(3, ISA_BEST);
    rng r = {8};
    const int64_t T = 3, C = 48, G = 16;
    const float eps = 1e-5f;
    view x = view_rand(&r, T, C, 2, -2, 2), z = view_rand(&r, T, C, 3, -4, 4);
    float wb[48];
    for (int i = 0; i < C; i++) wb[i] = rng_unif(&r, 0.5f, 1.5f);
    cn_tensor w = cn_tensor_1d(CN_F32, C, wb);
    view y = view_make(T, C, 1);
    assert_int_equal(cn_op_gated_rmsnorm(b, &y.t, &x.t, &z.t, &w, (int)G, eps), CN_OK);
    double ref[3 * 48];
    for (int64_t t = 0; t < T; t++)
        for (int64_t g0 = 0; g0 < C; g0 += G) {
            double v[16], ss = 0;
            for (int64_t i = 0; i < G; i++) {
                double zz = *at(&z, t, g0 + i);
                v[i] = *at(&x, t, g0 + i) * zz / (1 + exp(-zz));
                ss += v[i] * v[i];
            }
            double inv = 1.0 / sqrt(ss / G + eps);
            for (int64_t i = 0; i < G; i++) ref[t * C + g0 + i] = v[i] * inv * wb[g0 + i];
        }
    expect_view_close("gated_rmsnorm", &y, ref, 2e-6);
    view xi = view_clone(&x);
    assert_int_equal(cn_op_gated_rmsnorm(b, &xi.t, &xi.t, &z.t, &w, (int)G, eps), CN_OK);
    float *a = view_get(&xi), *c = view_get(&y);
    assert_memory_equal(a, c, (size_t)(T * C) * sizeof(float));
    free(a);
    free(c);
    view_free(&xi);
    view_free(&x);
    view_free(&z);
    view_free(&y);
    cn_backend_free(b);
}

/* ---------------------------------------------------------------- conv1d */

static void test_conv1d_reference_and_split(void **state) {
    (void)state;
    cn_backend *b = backend(3, ISA_BEST);
    rng r = {9};
    const int64_t T = 9, C = 70, K = 4;
    view x = view_rand(&r, T, C, 3, -1, 1);
    view w = view_rand(&r, C, K, 0, -1, 1);
    view s0 = view_rand(&r, K - 1, C, 0, -1, 1);
    float bb[70];
    for (int i = 0; i < C; i++) bb[i] = rng_unif(&r, -1, 1);
    cn_tensor bias = cn_tensor_1d(CN_F32, C, bb);

    for (int with_bias = 0; with_bias <= 1; with_bias++) {
        const cn_tensor *bp = with_bias ? &bias : NULL;
        /* reference over state ++ x */
        double ref[9 * 70];
        for (int64_t t = 0; t < T; t++)
            for (int64_t c = 0; c < C; c++) {
                double acc = with_bias ? bb[c] : 0;
                for (int64_t k = 0; k < K; k++) {
                    int64_t src = t - K + 1 + k;
                    double in = src < 0 ? *at(&s0, K - 1 + src, c) : *at(&x, src, c);
                    acc += (double)*at(&w, c, k) * in;
                }
                ref[t * C + c] = acc;
            }
        view y = view_make(T, C, 2), st = view_clone(&s0);
        assert_int_equal(cn_op_conv1d(b, &y.t, &x.t, &w.t, bp, 0, &st.t), CN_OK);
        expect_view_close("conv1d", &y, ref, 2e-6);
        for (int64_t i = 0; i < K - 1; i++) /* last K-1 raw inputs */
            for (int64_t c = 0; c < C; c++) assert_true(*at(&st, i, c) == *at(&x, T - K + 1 + i, c));
        { /* silu fused: the bits of the conv and then the silu op, the same state */
            view ys = view_make(T, C, 2), yf = view_make(T, C, 2), stf = view_clone(&s0);
            assert_int_equal(cn_op_silu(b, &ys.t, &y.t), CN_OK);
            assert_int_equal(cn_op_conv1d(b, &yf.t, &x.t, &w.t, bp, 1, &stf.t), CN_OK);
            assert_true(views_equal(&ys, &yf));
            assert_true(views_equal(&st, &stf));
            int changed = 0; /* the flag did something: silu moved some value */
            for (int64_t t = 0; t < T; t++)
                for (int64_t c = 0; c < C; c++) changed |= *at(&yf, t, c) != *at(&y, t, c);
            assert_true(changed);
            view_free(&ys);
            view_free(&yf);
            view_free(&stf);
        }

        /* two calls split anywhere == one call, bit for bit */
        for (int64_t split = 1; split < T; split++) {
            view y2 = view_make(T, C, 2), st2 = view_clone(&s0);
            cn_tensor xa = cn_tensor_rows(&x.t, 0, split), xb = cn_tensor_rows(&x.t, split, T - split);
            cn_tensor ya = cn_tensor_rows(&y2.t, 0, split), yb = cn_tensor_rows(&y2.t, split, T - split);
            assert_int_equal(cn_op_conv1d(b, &ya, &xa, &w.t, bp, 0, &st2.t), CN_OK);
            assert_int_equal(cn_op_conv1d(b, &yb, &xb, &w.t, bp, 0, &st2.t), CN_OK);
            assert_true(views_equal(&y, &y2));
            assert_true(views_equal(&st, &st2));
            view_free(&y2);
            view_free(&st2);
        }
        view_free(&y);
        view_free(&st);
    }
    view_free(&x);
    view_free(&w);
    view_free(&s0);
    cn_backend_free(b);
}

/* ---------------------------------------------------------------- ssm */

typedef struct ssm_case {
    int H, P, G, N, T;
    cn_ssm_args a;
    float A_log[16], D[16], dt_bias[16];
    cn_tensor tA, tD, tdt;
    view x, dt, B, C;
    float *state0; /* [H*P*N] */
} ssm_case;

static void ssm_case_init(ssm_case *s, rng *r, int H, int P, int G, int N, int T) {
    memset(s, 0, sizeof *s);
    s->H = H, s->P = P, s->G = G, s->N = N, s->T = T;
    for (int h = 0; h < H; h++) {
        s->A_log[h] = rng_unif(r, -1, 1);
        s->D[h] = rng_unif(r, -1, 1);
        s->dt_bias[h] = rng_unif(r, -1, 1);
    }
    s->tA = cn_tensor_1d(CN_F32, H, s->A_log);
    s->tD = cn_tensor_1d(CN_F32, H, s->D);
    s->tdt = cn_tensor_1d(CN_F32, H, s->dt_bias);
    s->a = (cn_ssm_args){.A_log = &s->tA, .D = &s->tD, .dt_bias = &s->tdt, .n_heads = H,
                         .head_dim = P, .n_groups = G, .d_state = N, .chunk = 4,
                         .dt_min = 1e-3f, .dt_max = 2.5f};
    s->x = view_rand(r, T, (int64_t)H * P, 3, -1, 1);
    s->dt = view_rand(r, T, H, 1, -4, 3);
    *at(&s->dt, T / 2, H - 1) = 30.0f; /* softplus' linear branch, then the dt_max clamp */
    *at(&s->dt, 0, 0) = -30.0f;        /* softplus ~ 1e-13: the dt_min clamp */
    s->B = view_rand(r, T, (int64_t)G * N, 2, -1, 1);
    s->C = view_rand(r, T, (int64_t)G * N, 0, -1, 1);
    s->state0 = malloc((size_t)H * P * N * sizeof(float));
    for (int i = 0; i < H * P * N; i++) s->state0[i] = rng_unif(r, -1, 1);
}

static void ssm_case_free(ssm_case *s) {
    view_free(&s->x);
    view_free(&s->dt);
    view_free(&s->B);
    view_free(&s->C);
    free(s->state0);
}

/* Runs the scan over tokens [t0, t1) into y (a view of all T rows) from/to state. */
static int ssm_run(cn_backend *b, ssm_case *s, view *y, float *state, int t0, int t1, int step) {
    cn_tensor st = cn_tensor_2d(CN_F32, s->H, (int64_t)s->P * s->N, state);
    cn_tensor x = cn_tensor_rows(&s->x.t, t0, t1 - t0), dt = cn_tensor_rows(&s->dt.t, t0, t1 - t0);
    cn_tensor B = cn_tensor_rows(&s->B.t, t0, t1 - t0), C = cn_tensor_rows(&s->C.t, t0, t1 - t0);
    cn_tensor yy = cn_tensor_rows(&y->t, t0, t1 - t0);
    return step ? cn_op_ssm_step(b, &yy, &x, &dt, &B, &C, &s->a, &st)
                : cn_op_ssm_scan(b, &yy, &x, &dt, &B, &C, &s->a, &st);
}

static void test_ssm_scan_reference(void **state) {
    (void)state;
    cn_backend *b = backend(3, ISA_BEST);
    rng r = {10};
    ssm_case s;
    ssm_case_init(&s, &r, 4, 3, 2, 21, 9);
    const int H = s.H, P = s.P, N = s.N, T = s.T, hpg = s.H / s.G;
    double *S = malloc((size_t)H * P * N * sizeof(double));
    double *ref = malloc((size_t)T * H * P * sizeof(double));
    for (int i = 0; i < H * P * N; i++) S[i] = s.state0[i];
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            double v = (double)*at(&s.dt, t, h) + s.dt_bias[h];
            double dt = v > 20 ? v : log1p(exp(v));
            dt = fmin(fmax(dt, s.a.dt_min), s.a.dt_max);
            double dA = exp(dt * -exp((double)s.A_log[h]));
            int g = h / hpg;
            for (int p = 0; p < P; p++) {
                double xv = *at(&s.x, t, h * P + p), acc = 0;
                for (int n = 0; n < N; n++) {
                    double *sv = &S[(h * P + p) * N + n];
                    *sv = *sv * dA + dt * xv * *at(&s.B, t, g * N + n);
                    acc += *sv * *at(&s.C, t, g * N + n);
                }
                ref[t * H * P + h * P + p] = acc + s.D[h] * xv;
            }
        }
    float *st = malloc((size_t)H * P * N * sizeof(float));
    memcpy(st, s.state0, (size_t)H * P * N * sizeof(float));
    view y = view_make(T, (int64_t)H * P, 2);
    assert_int_equal(ssm_run(b, &s, &y, st, 0, T, 0), CN_OK);
    expect_view_close("ssm_scan y", &y, ref, 2e-5);
    expect_close("ssm_scan state", st, S, (int64_t)H * P * N, 2e-5);

    /* token by token with ssm_step, and two segments: bit-identical */
    float *st2 = malloc((size_t)H * P * N * sizeof(float));
    for (int mode = 0; mode < 2; mode++) {
        memcpy(st2, s.state0, (size_t)H * P * N * sizeof(float));
        view y2 = view_make(T, (int64_t)H * P, 2);
        if (mode == 0)
            for (int t = 0; t < T; t++) assert_int_equal(ssm_run(b, &s, &y2, st2, t, t + 1, 1), 0);
        else {
            assert_int_equal(ssm_run(b, &s, &y2, st2, 0, 4, 0), CN_OK);
            assert_int_equal(ssm_run(b, &s, &y2, st2, 4, T, 0), CN_OK);
        }
        assert_true(views_equal(&y, &y2));
        assert_memory_equal(st, st2, (size_t)H * P * N * sizeof(float));
        view_free(&y2);
    }
    /* ssm_step refuses T > 1 */
    assert_int_equal(ssm_run(b, &s, &y, st2, 0, 2, 1), CN_EINVAL);
    free(st2);
    free(st);
    free(S);
    free(ref);
    view_free(&y);
    ssm_case_free(&s);
    cn_backend_free(b);
}

static void check_scan_caps(cn_backend *b, ssm_case *sc, const int *rows, int n);

/* A scan's later tokens step 8 state rows side by side, or 4 rows through 4 tokens at a time,
 * where the ISA has those kernels (N a multiple of 16), its first token row by row: the same
 * bits as token-by-token calls, which go row by row only, on every ISA. 5 tokens: one block of
 * 4 after the first; 14: three blocks and a single token. Then, at 14 tokens, captures inside
 * and at the ends of blocks against the scan cut there. */
static void test_ssm_scan_rows8_equal_steps(void **state) {
    (void)state;
    for (int isa = 0; isa < 2 * N_ISA; isa++) {
        cn_backend *b = backend(3, isa % N_ISA);
        rng r = {15};
        ssm_case s;
        ssm_case_init(&s, &r, 4, 20, 2, 32, isa < N_ISA ? 5 : 14); /* 20 rows a head */
        const size_t n = (size_t)s.H * s.P * s.N;
        float *st = malloc(n * sizeof(float)), *st2 = malloc(n * sizeof(float));
        memcpy(st, s.state0, n * sizeof(float));
        memcpy(st2, s.state0, n * sizeof(float));
        view y = view_make(s.T, (int64_t)s.H * s.P, 2), y2 = view_make(s.T, (int64_t)s.H * s.P, 2);
        assert_int_equal(ssm_run(b, &s, &y, st, 0, s.T, 0), CN_OK);
        for (int t = 0; t < s.T; t++) assert_int_equal(ssm_run(b, &s, &y2, st2, t, t + 1, 0), CN_OK);
        assert_true(views_equal(&y, &y2));
        assert_memory_equal(st, st2, n * sizeof(float));
        if (s.T == 14) {
            const int sets[3][3] = {{3, 5, 9}, {6, 0, 0}, {2, 7, 13}};
            const int n_sets[3] = {3, 1, 3};
            for (int si = 0; si < 3; si++) check_scan_caps(b, &s, sets[si], n_sets[si]);
        }
        free(st);
        free(st2);
        view_free(&y);
        view_free(&y2);
        ssm_case_free(&s);
        cn_backend_free(b);
    }
}

static void test_ssm_scan_threads_and_scalar(void **state) {
    (void)state;
    enum { NB = 4 };
    cn_backend *bs[NB] = {backend(1, ISA_BEST), backend(3, ISA_BEST), backend(1, ISA_SCALAR),
                          backend(3, ISA_AVX2)};
    rng r = {11};
    ssm_case s;
    ssm_case_init(&s, &r, 8, 16, 2, 37, 8);
    const size_t n = (size_t)8 * 16 * 37;
    float *st[NB];
    view y[NB];
    for (int i = 0; i < NB; i++) {
        st[i] = malloc(n * sizeof(float));
        memcpy(st[i], s.state0, n * sizeof(float));
        y[i] = view_make(s.T, (int64_t)s.H * s.P, 1);
        assert_int_equal(ssm_run(bs[i], &s, &y[i], st[i], 0, s.T, 0), CN_OK);
    }
    assert_true(views_equal(&y[0], &y[1]));
    assert_memory_equal(st[0], st[1], n * sizeof(float));
    float *ys = view_get(&y[2]);
    double *yd = malloc((size_t)(y[2].T * y[2].C) * sizeof(double));
    for (int64_t i = 0; i < y[2].T * y[2].C; i++) yd[i] = ys[i];
    expect_view_close("ssm best vs scalar", &y[0], yd, 2e-5);
    expect_view_close("ssm avx2 vs scalar", &y[3], yd, 2e-5);
    free(ys);
    free(yd);
    for (int i = 0; i < NB; i++) {
        free(st[i]);
        view_free(&y[i]);
        cn_backend_free(bs[i]);
    }
    ssm_case_free(&s);
}

/* A scan from another state: the bits of copying it in and scanning in place, for one token, a
 * verify's few (state rows 8 at a time) and a prefill's many, on every ISA; the state it starts
 * from is left as it was; the same buffer twice or another shape is refused, writing nothing. */
static void test_ssm_scan_from_equal_copy(void **state) {
    (void)state;
    const int lens[3] = {1, 5, 12};
    for (int isa = 0; isa < N_ISA; isa++) {
        cn_backend *b = backend(3, isa);
        for (int li = 0; li < 3; li++) {
            rng r = {16};
            ssm_case s;
            ssm_case_init(&s, &r, 4, 20, 2, 32, lens[li]);
            const size_t n = (size_t)s.H * s.P * s.N;
            float *from = malloc(n * sizeof(float)), *st = malloc(n * sizeof(float));
            float *ref = malloc(n * sizeof(float));
            memcpy(from, s.state0, n * sizeof(float));
            memcpy(ref, s.state0, n * sizeof(float));
            for (size_t i = 0; i < n; i++) st[i] = SENTINEL;
            view y = view_make(s.T, (int64_t)s.H * s.P, 2), y2 = view_make(s.T, (int64_t)s.H * s.P, 2);
            assert_int_equal(ssm_run(b, &s, &y2, ref, 0, s.T, 0), CN_OK);
            cn_tensor tf = cn_tensor_2d(CN_F32, s.H, (int64_t)s.P * s.N, from);
            cn_tensor ts = cn_tensor_2d(CN_F32, s.H, (int64_t)s.P * s.N, st);
            assert_int_equal(cn_op_ssm_scan_from(b, &y.t, &s.x.t, &s.dt.t, &s.B.t, &s.C.t, &s.a, &ts, &tf),
                             CN_OK);
            assert_true(views_equal(&y, &y2));
            assert_memory_equal(st, ref, n * sizeof(float));
            assert_memory_equal(from, s.state0, n * sizeof(float));
            if (li == 0) {
                cn_tensor wide = cn_tensor_2d(CN_F32, s.H - 1, (int64_t)s.P * s.N, from);
                view y3 = view_make(s.T, (int64_t)s.H * s.P, 2);
                assert_int_equal(cn_op_ssm_scan_from(b, &y3.t, &s.x.t, &s.dt.t, &s.B.t, &s.C.t, &s.a,
                                                     &ts, &ts), CN_EINVAL);
                assert_int_equal(cn_op_ssm_scan_from(b, &y3.t, &s.x.t, &s.dt.t, &s.B.t, &s.C.t, &s.a,
                                                     &ts, &wide), CN_EINVAL);
                assert_memory_equal(st, ref, n * sizeof(float));
                assert_true(*at(&y3, 0, 0) == SENTINEL);
                view_free(&y3);
            }
            free(from);
            free(st);
            free(ref);
            view_free(&y);
            view_free(&y2);
            ssm_case_free(&s);
        }
        cn_backend_free(b);
    }
}

/* The scan of sc with captures after rows[0..n) (one cn_op_ssm_scan_caps) against the same scan
 * cut into calls that end at the captures, the state copied after each: outputs, final state and
 * every capture equal bit for bit. */
static void check_scan_caps(cn_backend *b, ssm_case *sc, const int *rows, int n) {
    const size_t sn = (size_t)sc->H * sc->P * sc->N;
    float *S = malloc(sn * sizeof(float)), *Scut = malloc(sn * sizeof(float));
    float *Sc[3], *Sccut[3];
    cn_tensor stt[3], *sct[3];
    assert_true(n <= 3);
    memcpy(S, sc->state0, sn * sizeof(float));
    memcpy(Scut, sc->state0, sn * sizeof(float));
    for (int i = 0; i < n; i++) {
        Sc[i] = malloc(sn * sizeof(float));
        Sccut[i] = malloc(sn * sizeof(float));
        stt[i] = cn_tensor_2d(CN_F32, sc->H, (int64_t)sc->P * sc->N, Sc[i]);
        sct[i] = &stt[i];
    }
    view ys = view_make(sc->T, (int64_t)sc->H * sc->P, 2), yscut = view_make(sc->T, (int64_t)sc->H * sc->P, 2);
    cn_tensor Sst = cn_tensor_2d(CN_F32, sc->H, (int64_t)sc->P * sc->N, S);
    const cn_state_caps scc = {.n = n, .rows = rows, .states = sct};
    assert_int_equal(cn_op_ssm_scan_caps(b, &ys.t, &sc->x.t, &sc->dt.t, &sc->B.t, &sc->C.t,
                                         &sc->a, &Sst, &scc), CN_OK);
    for (int i = 0, t0 = 0; i <= n; i++) {
        int t1 = i < n ? rows[i] : sc->T;
        if (t1 > t0) assert_int_equal(ssm_run(b, sc, &yscut, Scut, t0, t1, 0), CN_OK);
        if (i < n) memcpy(Sccut[i], Scut, sn * sizeof(float));
        t0 = t1;
    }
    assert_true(views_equal(&ys, &yscut));
    assert_memory_equal(S, Scut, sn * sizeof(float));
    for (int i = 0; i < n; i++) {
        assert_memory_equal(Sc[i], Sccut[i], sn * sizeof(float));
        free(Sc[i]);
        free(Sccut[i]);
    }
    free(S);
    free(Scut);
    view_free(&ys);
    view_free(&yscut);
}

/* A verify's few tokens (the scan walks blocks of 8 state rows through every token) with
 * captures: the same bits as the scan cut at the captures, the state copied after each. */
static void test_state_caps_short_scan(void **state) {
    (void)state;
    const int sets[3][3] = {{1, 4, 8}, {3, 0, 0}, {1, 2, 0}};
    const int n_sets[3] = {3, 1, 2};
    for (int isa = 0; isa < N_ISA; isa++) {
        cn_backend *b = backend(3, isa);
        for (int si = 0; si < 3; si++) {
            rng r = {17};
            ssm_case sc;
            ssm_case_init(&sc, &r, 4, 20, 2, 32, 8); /* 20 rows a head: two blocks of 8, then 4 */
            check_scan_caps(b, &sc, sets[si], n_sets[si]);
            ssm_case_free(&sc);
        }
        cn_backend_free(b);
    }
}

/* ---------------------------------------------------------------- captures inside one call */

/* conv1d and the scan with captures (cn_state_caps) against the same op cut into calls that end
 * at the captures, the states copied after each: outputs, final state and every capture equal
 * bit for bit, for 1 and 3 threads and the scalar kernels; bad captures write nothing. */
static void test_state_caps_equal_segments(void **state) {
    (void)state;
    enum { NB = 3 };
    cn_backend *bs[NB] = {backend(1, ISA_BEST), backend(3, ISA_BEST), backend(3, ISA_SCALAR)};
    rng r = {12};
    const int64_t T = 9, C = 70, K = 4;
    view x = view_rand(&r, T, C, 3, -1, 1);
    view w = view_rand(&r, C, K, 0, -1, 1);
    view s0 = view_rand(&r, K - 1, C, 0, -1, 1);
    ssm_case sc;
    ssm_case_init(&sc, &r, 4, 3, 2, 21, (int)T);
    const size_t sn = (size_t)sc.H * sc.P * sc.N;
    const int sets[3][3] = {{1, 4, 9}, {2, 3, 0}, {9, 0, 0}};
    const int n_sets[3] = {3, 2, 1};
    for (int bi = 0; bi < NB; bi++) {
        cn_backend *b = bs[bi];
        for (int si = 0; si < 3; si++) {
            const int n = n_sets[si], *rows = sets[si];
            /* conv1d: one call with captures */
            view y = view_make(T, C, 2), st = view_clone(&s0), cap[3], ycut = view_make(T, C, 2),
                 stcut = view_clone(&s0), capcut[3];
            cn_tensor *capt[3];
            for (int i = 0; i < n; i++) {
                cap[i] = view_make(K - 1, C, 0);
                capcut[i] = view_make(K - 1, C, 0);
                capt[i] = &cap[i].t;
            }
            const cn_state_caps cc = {.n = n, .rows = rows, .states = capt};
            const int silu = si == 1; /* one of the sets through the fused activation */
            assert_int_equal(cn_op_conv1d_caps(b, &y.t, &x.t, &w.t, NULL, silu, &st.t, &cc), CN_OK);
            for (int i = 0, t0 = 0; i <= n; i++) { /* the same cut at the captures */
                int t1 = i < n ? rows[i] : (int)T;
                if (t1 > t0) {
                    cn_tensor xa = cn_tensor_rows(&x.t, t0, t1 - t0);
                    cn_tensor ya = cn_tensor_rows(&ycut.t, t0, t1 - t0);
                    assert_int_equal(cn_op_conv1d(b, &ya, &xa, &w.t, NULL, silu, &stcut.t), CN_OK);
                }
                if (i < n) assert_int_equal(cn_backend_copy(b, &capcut[i].t, &stcut.t), CN_OK);
                t0 = t1;
            }
            assert_true(views_equal(&y, &ycut));
            assert_true(views_equal(&st, &stcut));
            for (int i = 0; i < n; i++) assert_true(views_equal(&cap[i], &capcut[i]));

            /* the scan: one call with captures */
            check_scan_caps(b, &sc, rows, n);

            for (int i = 0; i < n; i++) {
                view_free(&cap[i]);
                view_free(&capcut[i]);
            }
            view_free(&y);
            view_free(&ycut);
            view_free(&st);
            view_free(&stcut);
        }
    }

    /* bad captures: CN_EINVAL, and neither the output nor the state nor a capture changes */
    cn_backend *b = bs[1];
    view y = view_make(T, C, 2), st = view_clone(&s0), cap0 = view_make(K - 1, C, 0),
         cap1 = view_make(K - 1, C, 0), wide = view_make(K, C, 0);
    cn_tensor *two[2] = {&cap0.t, &cap1.t}, *bad_shape[1] = {&wide.t};
    const int dup[2] = {3, 3}, zero[1] = {0}, past[1] = {10}, ok[1] = {4};
    const cn_state_caps bad[4] = {{.n = 2, .rows = dup, .states = two},
                                  {.n = 1, .rows = zero, .states = two},
                                  {.n = 1, .rows = past, .states = two},
                                  {.n = 1, .rows = ok, .states = bad_shape}};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(cn_op_conv1d_caps(b, &y.t, &x.t, &w.t, NULL, 0, &st.t, &bad[i]),
                         CN_EINVAL);
        assert_true(views_equal(&st, &s0));
        view_check_pad(&y);
        for (int64_t t = 0; t < T; t++) assert_true(*at(&y, t, 0) == SENTINEL);
        for (int64_t t = 0; t < K - 1; t++) assert_true(*at(&cap0, t, 0) == SENTINEL);
    }
    float *S = malloc(sn * sizeof(float));
    memcpy(S, sc.state0, sn * sizeof(float));
    cn_tensor Sst = cn_tensor_2d(CN_F32, sc.H, (int64_t)sc.P * sc.N, S);
    view ys = view_make(T, (int64_t)sc.H * sc.P, 2);
    float *Sc = malloc(sn * sizeof(float));
    cn_tensor sct = cn_tensor_2d(CN_F32, sc.H, (int64_t)sc.P * sc.N + 1, Sc); /* one too wide */
    cn_tensor *sctp[1] = {&sct};
    const cn_state_caps badss = {.n = 1, .rows = ok, .states = sctp};
    assert_int_equal(cn_op_ssm_scan_caps(b, &ys.t, &sc.x.t, &sc.dt.t, &sc.B.t, &sc.C.t, &sc.a,
                                         &Sst, &badss), CN_EINVAL);
    assert_memory_equal(S, sc.state0, sn * sizeof(float));
    for (int64_t t = 0; t < T; t++) assert_true(*at(&ys, t, 0) == SENTINEL);
    free(S);
    free(Sc);
    view_free(&ys);
    view_free(&y);
    view_free(&st);
    view_free(&cap0);
    view_free(&cap1);
    view_free(&wide);
    ssm_case_free(&sc);
    view_free(&x);
    view_free(&w);
    view_free(&s0);
    for (int i = 0; i < NB; i++) cn_backend_free(bs[i]);
}

/* ---------------------------------------------------------------- attention */

/* A cache [S, Hkv*Dh] of dtype dt (F32 or BF16) with decoded values in val. */
typedef struct cache {
    cn_tensor t;
    void *buf;
    double *val;
} cache;

static cache cache_rand(rng *r, cn_dtype dt, int64_t S, int64_t W, int64_t valid) {
    cache c;
    size_t es = cn_dtype_size(dt);
    c.buf = malloc((size_t)(S * W) * es);
    c.val = malloc((size_t)(S * W) * sizeof(double));
    for (int64_t i = 0; i < S * W; i++) {
        /* rows past the causal limit hold huge values: reading them would show */
        float f = i / W < valid ? rng_unif(r, -1, 1) : 1e30f;
        if (dt == CN_BF16) {
            uint16_t h = cn_f32_to_bf16(f);
            ((uint16_t *)c.buf)[i] = h;
            c.val[i] = cn_bf16_to_f32(h);
        } else {
            ((float *)c.buf)[i] = f;
            c.val[i] = f;
        }
    }
    c.t = cn_tensor_2d(dt, S, W, c.buf);
    return c;
}

static void cache_free(cache *c) {
    free(c->buf);
    free(c->val);
}

static void attention_ref(double *ref, const view *q, const cache *kc, const cache *vc, int n_past,
                          int Hq, int Hkv, int64_t Dh, float scale) {
    const int64_t T = q->T, W = Hkv * Dh;
    for (int64_t t = 0; t < T; t++)
        for (int h = 0; h < Hq; h++) {
            int kvh = h / (Hq / Hkv);
            int64_t n_keys = n_past + t + 1;
            double *sc = malloc((size_t)n_keys * sizeof(double)), m = -INFINITY, l = 0;
            for (int64_t s = 0; s < n_keys; s++) {
                double d = 0;
                for (int64_t i = 0; i < Dh; i++)
                    d += (double)*at(q, t, h * Dh + i) * kc->val[s * W + kvh * Dh + i];
                sc[s] = d * scale;
                if (sc[s] > m) m = sc[s];
            }
            for (int64_t s = 0; s < n_keys; s++) l += (sc[s] = exp(sc[s] - m));
            for (int64_t i = 0; i < Dh; i++) {
                double o = 0;
                for (int64_t s = 0; s < n_keys; s++) o += sc[s] * vc->val[s * W + kvh * Dh + i];
                ref[t * Hq * Dh + h * Dh + i] = o / l;
            }
            free(sc);
        }
}

static void check_attention(cn_backend *b, rng *r, cn_dtype dt, int T, int n_past, int Hq, int Hkv,
                            int64_t Dh, float qscale, view *y_out) {
    const int64_t S = n_past + T + 2; /* two rows past the last position */
    float scale = 1.0f / sqrtf((float)Dh);
    cache kc = cache_rand(r, dt, S, Hkv * Dh, n_past + T), vc = cache_rand(r, dt, S, Hkv * Dh, n_past + T);
    view q = view_rand(r, T, Hq * Dh, 5, -qscale, qscale);
    view out = view_make(T, Hq * Dh, 2);
    assert_int_equal(cn_op_attention(b, &out.t, &q.t, &kc.t, &vc.t, n_past, Hq, Hkv, scale), CN_OK);
    double *ref = malloc((size_t)(T * Hq * Dh) * sizeof(double));
    attention_ref(ref, &q, &kc, &vc, n_past, Hq, Hkv, Dh, scale);
    char what[80];
    snprintf(what, sizeof what, "attention %s T=%d past=%d Hq=%d Hkv=%d Dh=%lld", cn_dtype_name(dt),
             T, n_past, Hq, Hkv, (long long)Dh);
    expect_view_close(what, &out, ref, 2e-5);
    free(ref);
    if (y_out) *y_out = out;
    else view_free(&out);
    view_free(&q);
    cache_free(&kc);
    cache_free(&vc);
}

static void test_attention(void **state) {
    (void)state;
    for (int isa = 0; isa < N_ISA; isa++) {
        cn_backend *b = backend(2, isa);
        rng r = {12};
        check_attention(b, &r, CN_F32, 5, 7, 4, 2, 19, 1, NULL);    /* GQA, prefill after a past */
        check_attention(b, &r, CN_F32, 1, 11, 4, 2, 19, 1, NULL);   /* decode */
        check_attention(b, &r, CN_F32, 6, 0, 3, 3, 8, 1, NULL);     /* MHA from empty */
        check_attention(b, &r, CN_F32, 3, 2, 12, 2, 16, 1, NULL);   /* group of 6: blocks 4 + 2 */
        check_attention(b, &r, CN_BF16, 4, 5, 4, 1, 33, 1, NULL);   /* bf16 cache, MQA */
        check_attention(b, &r, CN_F32, 4, 9, 2, 1, 24, 400, NULL);  /* scores ~1e3: needs max-sub */
        check_attention(b, &r, CN_F32, 3, 300, 2, 1, 8, 30, NULL);  /* several key chunks */
        cn_backend_free(b);
    }
}

/* Past ATT_RANGE (1024) keys the vectorised path folds key ranges; decode splits them over threads.
 * Each query's output must match the reference and be the same bits whether it comes from a
 * prefill of several queries or a decode of that one query, on 1 or 3 threads. */
static void check_long_decode(int isa, int T, int n_past, int Hq, int Hkv, int64_t Dh,
                              cn_dtype kdt, cn_dtype vdt) {
    const int64_t S = n_past + T + 2;
    const float scale = 1.0f / sqrtf((float)Dh);
    rng r = {14};
    cn_backend *b1 = backend(1, isa), *b3 = backend(3, isa);
    cache kc = cache_rand(&r, kdt, S, Hkv * Dh, n_past + T);
    cache vc = cache_rand(&r, vdt, S, Hkv * Dh, n_past + T);
    view q = view_rand(&r, T, Hq * Dh, 3, -2, 2);
    view out = view_make(T, Hq * Dh, 2);
    assert_int_equal(cn_op_attention(b3, &out.t, &q.t, &kc.t, &vc.t, n_past, Hq, Hkv, scale),
                     CN_OK);
    double *ref = malloc((size_t)(T * Hq * Dh) * sizeof(double));
    attention_ref(ref, &q, &kc, &vc, n_past, Hq, Hkv, Dh, scale);
    char what[96];
    snprintf(what, sizeof what, "attention long context past=%d Hq=%d Hkv=%d Dh=%lld", n_past, Hq,
             Hkv, (long long)Dh);
    expect_view_close(what, &out, ref, 2e-5);
    for (int t = 0; t < T; t++)
        for (int nt = 0; nt < 2; nt++) {
            view o1 = view_make(1, Hq * Dh, 1);
            cn_tensor q1 = cn_tensor_rows(&q.t, t, 1);
            assert_int_equal(cn_op_attention(nt ? b3 : b1, &o1.t, &q1, &kc.t, &vc.t, n_past + t,
                                             Hq, Hkv, scale),
                             CN_OK);
            assert_memory_equal(at(&o1, 0, 0), at(&out, t, 0), (size_t)(Hq * Dh) * sizeof(float));
            view_free(&o1);
        }
    free(ref);
    view_free(&out);
    view_free(&q);
    cache_free(&kc);
    cache_free(&vc);
    cn_backend_free(b1);
    cn_backend_free(b3);
}

static void test_attention_long_context_decode_equals_prefill(void **state) {
    (void)state;
    for (int isa = 0; isa < N_ISA; isa++) {
        check_long_decode(isa, 3, 2100, 16, 2, 64, CN_BF16, CN_F32);
        /* decode steps up to CPU_ATT_NB (4) kv-head groups over one key range together: 5 kv
         * heads make a group of 4 and one of 1; 20 query heads per kv head make sub-blocks of
         * 16 and 4 heads side by side; Dh = 24 pads the rows; the last range is ragged */
        check_long_decode(isa, 2, 1100, 100, 5, 24, CN_F32, CN_BF16);
        /* a verify's few queries, each to its own last key: here the second query's last key
         * opens a range the first lacks */
        check_long_decode(isa, 2, 1023, 8, 2, 64, CN_F32, CN_F32);
        check_long_decode(isa, 4, 1022, 8, 2, 64, CN_BF16, CN_BF16);
        check_long_decode(isa, 5, 1021, 8, 2, 64, CN_F32, CN_F32);
    }
}

/* The tiled prefill (cpu_att_block.c) against the reference on every ISA: blocks of as many
 * queries as the lanes take (8 of 4 heads, 10 of 3, one of 16 + 4 heads), chunks that end inside
 * a block and inside a 16-key step, causal edges off the steps, blocks that straddle the 1024-key
 * ranges, heads padded to the vectors (Dh 24, 33) and a few thousand keys. */
static void test_attention_tiled_prefill(void **state) {
    (void)state;
    for (int isa = 0; isa < N_ISA; isa++) {
        cn_backend *b = backend(3, isa);
        rng r = {15};
        check_attention(b, &r, CN_F32, 37, 0, 8, 2, 64, 1, NULL);    /* from empty */
        check_attention(b, &r, CN_F32, 21, 1013, 8, 2, 64, 1, NULL); /* across key 1024 */
        check_attention(b, &r, CN_BF16, 19, 2043, 20, 1, 24, 1, NULL); /* 16 + 4 heads */
        check_attention(b, &r, CN_F32, 23, 1100, 3, 1, 33, 1, NULL); /* 10 queries of 3 heads */
        check_attention(b, &r, CN_F32, 2, 700, 2, 2, 16, 1, NULL);   /* MHA, a verify's two */
        check_attention(b, &r, CN_F32, 40, 3500, 8, 2, 64, 2, NULL); /* long */
        cn_backend_free(b);
    }
}

/* The bits of one call of T queries, out [T, Hq*Dh]; with cut (0 < cut[0] < cut[1] < T) the same
 * queries in three calls, each after the positions before it. */
static void attention_calls(cn_backend *b, view *out, const view *q, const cache *kc,
                            const cache *vc, int n_past, int Hq, int Hkv, float scale,
                            const int *cut) {
    const int T = (int)q->T;
    int at[4] = {0, cut ? cut[0] : T, cut ? cut[1] : T, T};
    for (int i = 0; i < 3; i++) {
        if (at[i + 1] == at[i]) continue;
        cn_tensor qi = cn_tensor_rows(&q->t, at[i], at[i + 1] - at[i]);
        cn_tensor oi = cn_tensor_rows(&out->t, at[i], at[i + 1] - at[i]);
        assert_int_equal(cn_op_attention(b, &oi, &qi, &kc->t, &vc->t, n_past + at[i], Hq, Hkv,
                                         scale),
                         CN_OK);
    }
}

/* A query's bits do not depend on which queries share its call: one call of T queries equals
 * three calls of its pieces (the blocks then start at other queries), on 1 and on 3 threads;
 * and AVX2 gives AVX-512's bits (the same IEEE operations on each lane; where the CPU lacks
 * AVX-512 the two are one table). */
static void test_attention_tiled_bits(void **state) {
    (void)state;
    const struct { int T, past, Hq, Hkv; int64_t Dh; cn_dtype dt; int cut[2]; } cs[] = {
        {45, 1500, 8, 2, 64, CN_F32, {5, 29}},
        {33, 1030, 12, 2, 24, CN_BF16, {1, 17}},
    };
    for (size_t c = 0; c < sizeof cs / sizeof *cs; c++) {
        const int T = cs[c].T, past = cs[c].past, Hq = cs[c].Hq, Hkv = cs[c].Hkv;
        const int64_t Dh = cs[c].Dh, S = past + T + 2;
        const float scale = 1.0f / sqrtf((float)Dh);
        rng r = {16};
        cache kc = cache_rand(&r, cs[c].dt, S, Hkv * Dh, past + T);
        cache vc = cache_rand(&r, cs[c].dt, S, Hkv * Dh, past + T);
        view q = view_rand(&r, T, Hq * Dh, 3, -2, 2);
        float *first[N_ISA];
        for (int isa = 0; isa < N_ISA; isa++) {
            cn_backend *b1 = backend(1, isa), *b3 = backend(3, isa);
            view whole = view_make(T, Hq * Dh, 2), parts = view_make(T, Hq * Dh, 2);
            attention_calls(b3, &whole, &q, &kc, &vc, past, Hq, Hkv, scale, NULL);
            attention_calls(b1, &parts, &q, &kc, &vc, past, Hq, Hkv, scale, cs[c].cut);
            assert_true(views_equal(&whole, &parts));
            attention_calls(b3, &parts, &q, &kc, &vc, past, Hq, Hkv, scale, cs[c].cut);
            assert_true(views_equal(&whole, &parts));
            view_check_pad(&whole);
            first[isa] = view_get(&whole);
            view_free(&whole);
            view_free(&parts);
            cn_backend_free(b1);
            cn_backend_free(b3);
        }
        assert_memory_equal(first[ISA_BEST], first[ISA_AVX2], (size_t)(T * Hq * Dh) * sizeof(float));
        for (int isa = 0; isa < N_ISA; isa++) free(first[isa]);
        view_free(&q);
        cache_free(&kc);
        cache_free(&vc);
    }
}

static void test_attention_threads_agree(void **state) {
    (void)state;
    cn_backend *b1 = backend(1, ISA_BEST), *b3 = backend(3, ISA_BEST);
    rng r1 = {13}, r3 = {13};
    view y1, y3;
    check_attention(b1, &r1, CN_F32, 16, 32, 8, 2, 64, 1, &y1);
    check_attention(b3, &r3, CN_F32, 16, 32, 8, 2, 64, 1, &y3);
    assert_true(views_equal(&y1, &y3));
    view_free(&y1);
    view_free(&y3);
    cn_backend_free(b1);
    cn_backend_free(b3);
}

/* Sliding-window attention: positions 0..n_past-1 in a ring of W rows (p at row p % W, rows no
 * position owns hold 1e30), the T new ones in a strided view; against a naive windowed attention
 * over the whole sequence, each query attending its last W positions. */
static void check_attention_window(cn_backend *b, rng *r, cn_dtype dt, int T, int n_past, int Wn,
                                   int Hq, int Hkv, int64_t Dh, view *y_out) {
    const int64_t C = Hkv * Dh;
    float scale = 1.0f / sqrtf((float)Dh);
    /* the past, whole; then its last W positions copied into the ring */
    cache pk = cache_rand(r, dt, n_past + 1, C, n_past), pv = cache_rand(r, dt, n_past + 1, C, n_past);
    cache rk = cache_rand(r, dt, Wn, C, 0), rv = cache_rand(r, dt, Wn, C, 0); /* all 1e30 */
    size_t es = cn_dtype_size(dt);
    for (int p = n_past - Wn > 0 ? n_past - Wn : 0; p < n_past; p++) {
        memcpy((char *)rk.buf + (size_t)(p % Wn) * C * es, (char *)pk.buf + (size_t)p * C * es, (size_t)C * es);
        memcpy((char *)rv.buf + (size_t)(p % Wn) * C * es, (char *)pv.buf + (size_t)p * C * es, (size_t)C * es);
    }
    view kn = view_rand(r, T, C, 3, -1, 1), vn = view_rand(r, T, C, 3, -1, 1);
    view q = view_rand(r, T, Hq * Dh, 5, -1, 1);
    view out = view_make(T, Hq * Dh, 2);
    assert_int_equal(cn_op_attention_window(b, &out.t, &q.t, &kn.t, &vn.t, &rk.t, &rv.t, n_past, Wn,
                                            Hq, Hkv, scale), CN_OK);
    double *ref = malloc((size_t)(T * Hq * Dh) * sizeof(double));
    for (int64_t t = 0; t < T; t++)
        for (int h = 0; h < Hq; h++) {
            int kvh = h / (Hq / Hkv);
            int64_t pos = n_past + t, lo = pos - Wn + 1 > 0 ? pos - Wn + 1 : 0, n = pos - lo + 1;
            double *sc = malloc((size_t)n * sizeof(double)), m = -INFINITY, l = 0;
            for (int64_t s = 0; s < n; s++) {
                int64_t p = lo + s;
                double d = 0;
                for (int64_t i = 0; i < Dh; i++) {
                    double k = p < n_past ? pk.val[p * C + kvh * Dh + i] : *at(&kn, p - n_past, kvh * Dh + i);
                    d += (double)*at(&q, t, h * Dh + i) * k;
                }
                sc[s] = d * scale;
                if (sc[s] > m) m = sc[s];
            }
            for (int64_t s = 0; s < n; s++) l += (sc[s] = exp(sc[s] - m));
            for (int64_t i = 0; i < Dh; i++) {
                double o = 0;
                for (int64_t s = 0; s < n; s++) {
                    int64_t p = lo + s;
                    o += sc[s] * (p < n_past ? pv.val[p * C + kvh * Dh + i] : *at(&vn, p - n_past, kvh * Dh + i));
                }
                ref[t * Hq * Dh + h * Dh + i] = o / l;
            }
            free(sc);
        }
    char what[96];
    snprintf(what, sizeof what, "attention_window %s T=%d past=%d W=%d Hq=%d Hkv=%d Dh=%lld",
             cn_dtype_name(dt), T, n_past, Wn, Hq, Hkv, (long long)Dh);
    expect_view_close(what, &out, ref, 2e-5);
    free(ref);
    if (y_out) *y_out = out;
    else view_free(&out);
    view_free(&q);
    view_free(&kn);
    view_free(&vn);
    cache_free(&pk);
    cache_free(&pv);
    cache_free(&rk);
    cache_free(&rv);
}

static void test_attention_window(void **state) {
    (void)state;
    for (int isa = 0; isa < N_ISA; isa++) {
        cn_backend *b = backend(2, isa);
        rng r = {14};
        check_attention_window(b, &r, CN_F32, 5, 0, 8, 4, 2, 19, NULL);    /* from empty, T < W */
        check_attention_window(b, &r, CN_F32, 13, 0, 8, 4, 2, 19, NULL);   /* T > W: the window slides in the batch */
        check_attention_window(b, &r, CN_F32, 3, 5, 8, 4, 2, 16, NULL);    /* ring not yet wrapped */
        check_attention_window(b, &r, CN_F32, 4, 21, 8, 3, 3, 8, NULL);    /* wrapped ring, MHA */
        check_attention_window(b, &r, CN_F32, 1, 37, 8, 12, 2, 16, NULL);  /* decode; group of 6 */
        check_attention_window(b, &r, CN_F32, 20, 9, 6, 2, 1, 8, NULL);    /* T > W after a wrap */
        check_attention_window(b, &r, CN_BF16, 4, 11, 8, 4, 1, 33, NULL);  /* bf16 ring, MQA */
        check_attention_window(b, &r, CN_F32, 3, 300, 200, 2, 1, 8, NULL); /* several key chunks */
        check_attention_window(b, &r, CN_F32, 150, 50, 140, 2, 1, 8, NULL); /* ...of new rows too */
        /* a window wider than everything: plain causal attention */
        check_attention_window(b, &r, CN_F32, 5, 7, 64, 4, 2, 19, NULL);
        /* shapes that do not fit are refused */
        view q = view_make(2, 8, 0), o = view_make(2, 8, 0), k = view_make(2, 8, 0);
        cache ring = cache_rand(&r, CN_F32, 4, 8, 0);
        assert_int_equal(cn_op_attention_window(b, &o.t, &q.t, &k.t, &k.t, &ring.t, &ring.t, 0, 5, 1,
                                                1, 1.0f), CN_EINVAL); /* ring rows != W */
        assert_int_equal(cn_op_attention_window(b, &o.t, &q.t, &k.t, &k.t, &ring.t, &ring.t, -1, 4, 1,
                                                1, 1.0f), CN_EINVAL);
        view_free(&q);
        view_free(&o);
        view_free(&k);
        cache_free(&ring);
        cn_backend_free(b);
    }
}

static void test_attention_window_threads_agree(void **state) {
    (void)state;
    cn_backend *b1 = backend(1, ISA_BEST), *b3 = backend(3, ISA_BEST);
    rng r1 = {15}, r3 = {15};
    view y1, y3;
    check_attention_window(b1, &r1, CN_F32, 16, 40, 24, 8, 2, 64, &y1);
    check_attention_window(b3, &r3, CN_F32, 16, 40, 24, 8, 2, 64, &y3);
    assert_true(views_equal(&y1, &y3));
    view_free(&y1);
    view_free(&y3);
    cn_backend_free(b1);
    cn_backend_free(b3);
}

/* ---------------------------------------------------------------- moe */

/* Reference router: rank (kept group first, biased score desc, index asc) by selection sort. */
static void route_ref(const float *logits, const float *bias, int E, const cn_route_args *a,
                      int32_t *ids, double *w) {
    float sel[64];
    double s[64];
    int excluded[64] = {0}, used[64] = {0};
    for (int e = 0; e < E; e++) {
        float sf = 1.0f / (1.0f + expf(-logits[e])); /* same fp32 values the backend ranks */
        s[e] = sf;
        sel[e] = bias ? sf + bias[e] : sf;
    }
    if (a->n_group > 1) {
        int gs = E / a->n_group, kept[16] = {0};
        double gscore[16];
        for (int g = 0; g < a->n_group; g++) {
            float v[64];
            for (int i = 0; i < gs; i++) v[i] = sel[g * gs + i];
            for (int i = 0; i < gs; i++) /* sort descending */
                for (int j2 = i + 1; j2 < gs; j2++)
                    if (v[j2] > v[i]) {
                        float tmp = v[i];
                        v[i] = v[j2];
                        v[j2] = tmp;
                    }
            gscore[g] = gs > 1 ? (double)(v[0] + v[1]) : v[0];
        }
        for (int k = 0; k < a->topk_group; k++) {
            int best = -1;
            for (int g = 0; g < a->n_group; g++)
                if (!kept[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
            kept[best] = 1;
        }
        for (int e = 0; e < E; e++) excluded[e] = !kept[e / gs];
    }
    for (int j = 0; j < a->top_k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            if (used[e]) continue;
            if (best < 0 || excluded[e] < excluded[best] ||
                (excluded[e] == excluded[best] && sel[e] > sel[best]))
                best = e;
        }
        used[best] = 1;
        ids[j] = best;
        w[j] = s[best];
    }
    double sum = 0;
    for (int j = 0; j < a->top_k; j++) sum += w[j];
    for (int j = 0; j < a->top_k; j++) w[j] = (a->norm_topk ? w[j] / (sum + 1e-20) : w[j]) * a->scaling;
}

static void check_route(cn_backend *b, const float *logits, const float *bias, int T, int E,
                        const cn_route_args *a) {
    const int k = a->top_k;
    cn_tensor lg = cn_tensor_2d(CN_F32, T, E, (void *)logits);
    cn_tensor bs = cn_tensor_1d(CN_F32, E, (void *)bias);
    int32_t *ids = malloc((size_t)(T * k) * sizeof(int32_t));
    float *wts = malloc((size_t)(T * k) * sizeof(float));
    cn_tensor ti = cn_tensor_2d(CN_I32, T, k, ids), tw = cn_tensor_2d(CN_F32, T, k, wts);
    assert_int_equal(cn_op_moe_route(b, &ti, &tw, &lg, bias ? &bs : NULL, a), CN_OK);
    for (int t = 0; t < T; t++) {
        int32_t rid[16];
        double rw[16];
        route_ref(logits + t * E, bias, E, a, rid, rw);
        for (int j = 0; j < k; j++) assert_int_equal(ids[t * k + j], rid[j]);
        expect_close("moe_route weights", wts + t * k, rw, k, 1e-6);
    }
    free(ids);
    free(wts);
}

static void test_moe_route(void **state) {
    (void)state;
    cn_backend *b = backend(2, ISA_BEST);
    rng r = {14};
    float logits[16 * 12], bias[12];
    for (int i = 0; i < 16 * 12; i++) logits[i] = rng_unif(&r, -4, 4);
    for (int i = 0; i < 12; i++) bias[i] = rng_unif(&r, -0.5f, 0.5f);

    cn_route_args a = {.top_k = 3, .n_group = 1, .topk_group = 1, .norm_topk = 1, .scaling = 2.5f};
    check_route(b, logits, bias, 16, 8, &a);  /* biased, normalised, scaled */
    check_route(b, logits, NULL, 16, 8, &a);  /* no bias */
    a.norm_topk = 0;
    a.scaling = 1;
    check_route(b, logits, bias, 16, 8, &a);  /* raw sigmoid weights */

    /* group limiting: 4 groups of 3, keep 2 */
    cn_route_args g = {.top_k = 3, .n_group = 4, .topk_group = 2, .norm_topk = 1, .scaling = 2.5f};
    check_route(b, logits, bias, 16, 12, &g);
    /* kept groups hold fewer than top_k: the rest come from the excluded, by score */
    cn_route_args g2 = {.top_k = 3, .n_group = 4, .topk_group = 1, .norm_topk = 1, .scaling = 1};
    check_route(b, logits, bias, 16, 8, &g2);

    /* a group with the single best expert but a weak second loses to two strong ones */
    float lg[12] = {5, -5, -5, 2, 2, -5, 1.9f, 1.9f, -5, -5, -5, -5};
    int32_t ids[3];
    float wts[3];
    cn_tensor tl = cn_tensor_2d(CN_F32, 1, 12, lg), ti = cn_tensor_2d(CN_I32, 1, 3, ids),
              tw = cn_tensor_2d(CN_F32, 1, 3, wts);
    cn_route_args g3 = {.top_k = 3, .n_group = 4, .topk_group = 2, .norm_topk = 0, .scaling = 1};
    assert_int_equal(cn_op_moe_route(b, &ti, &tw, &tl, NULL, &g3), CN_OK);
    assert_int_equal(ids[0], 3); /* groups 1 {3,4} and 2 {6,7} kept; expert 0 excluded */
    assert_int_equal(ids[1], 4);
    assert_int_equal(ids[2], 6);
    check_route(b, lg, NULL, 1, 12, &g3);

    /* ties go to the lower index */
    float tie[8] = {0, 1, 3, 3, -1, 3, 3, 2};
    cn_tensor tt = cn_tensor_2d(CN_F32, 1, 8, tie);
    assert_int_equal(cn_op_moe_route(b, &ti, &tw, &tt, NULL, &a), CN_OK);
    assert_int_equal(ids[0], 2);
    assert_int_equal(ids[1], 3);
    assert_int_equal(ids[2], 5);
    assert_true(wts[0] == wts[1] && wts[1] == wts[2]);
    /* the bias decides the choice but not the weight */
    float tb[8] = {0, 0, 0, 0, 0, 0, 0.5f, 0};
    cn_tensor tbias = cn_tensor_1d(CN_F32, 8, tb);
    assert_int_equal(cn_op_moe_route(b, &ti, &tw, &tt, &tbias, &a), CN_OK);
    assert_int_equal(ids[0], 6);
    assert_int_equal(ids[1], 2);
    assert_true(wts[0] == wts[1]);

    /* the fused router: the CPU runs the product and the routing apart, so valid arguments are
     * CN_EUNSUPPORTED with nothing written, and bad ones CN_EINVAL */
    float gw[8 * 4] = {0}, xv[4] = {1, 2, 3, 4}, lo[8];
    cn_tensor tg = cn_tensor_2d(CN_F32, 8, 4, gw), tx = cn_tensor_2d(CN_F32, 1, 4, xv),
              tlo = cn_tensor_2d(CN_F32, 1, 8, lo);
    const cn_mm_ep f = {.eps = 1e-5f};
    ids[0] = -7;
    assert_int_equal(cn_op_moe_route_ep(b, &ti, &tw, &tlo, &tg, &tx, &f, NULL, &a), CN_EUNSUPPORTED);
    assert_int_equal(ids[0], -7);
    const cn_mm_ep relu = {.ep = CN_EP_RELU2, .eps = 1e-5f};
    assert_int_equal(cn_op_moe_route_ep(b, &ti, &tw, &tlo, &tg, &tx, &relu, NULL, &a), CN_EINVAL);
    cn_tensor tx3 = cn_tensor_2d(CN_F32, 1, 3, xv); /* K differs from the gate's */
    assert_int_equal(cn_op_moe_route_ep(b, &ti, &tw, &tlo, &tg, &tx3, &f, NULL, &a), CN_EINVAL);
    cn_tensor tl12 = cn_tensor_2d(CN_F32, 1, 12, lg); /* E differs from the gate's */
    assert_int_equal(cn_op_moe_route_ep(b, &ti, &tw, &tl12, &tg, &tx, &f, NULL, &a), CN_EINVAL);
    cn_backend_free(b);
}

static void test_moe_combine(void **state) {
    (void)state;
    cn_backend *b = backend(3, ISA_BEST);
    rng r = {15};
    const int64_t T = 3, k = 4, H = 37;
    view rows = view_rand(&r, T * k, H, 3, -1, 1), w = view_rand(&r, T, k, 1, 0, 1);
    view y = view_make(T, H, 2);
    assert_int_equal(cn_op_moe_combine(b, &y.t, &rows.t, &w.t), CN_OK);
    double ref[3 * 37];
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            double s = 0;
            for (int64_t j = 0; j < k; j++) s += (double)*at(&w, t, j) * *at(&rows, t * k + j, h);
            ref[t * H + h] = s;
        }
    expect_view_close("moe_combine", &y, ref, 2e-6);
    view_free(&rows);
    view_free(&w);
    view_free(&y);
    cn_backend_free(b);
}

/* ---------------------------------------------------------------- elementwise */

static void test_elementwise(void **state) {
    (void)state;
    cn_backend *b = backend(3, ISA_BEST);
    rng r = {16};
    const int64_t T = 4, C = 33;
    view a = view_rand(&r, T, C, 2, -10, 10), c = view_rand(&r, T, C, 3, -2, 2);
    double ref[4 * 33];
    for (int op = 0; op < 5; op++) {
        view y = view_make(T, C, 1);
        int rc;
        switch (op) {
        case 0: rc = cn_op_add(b, &y.t, &a.t, &c.t); break;
        case 1: rc = cn_op_mul(b, &y.t, &a.t, &c.t); break;
        case 2: rc = cn_op_silu(b, &y.t, &a.t); break;
        case 3: rc = cn_op_relu2(b, &y.t, &a.t); break;
        default: rc = cn_op_scale(b, &y.t, &a.t, -0.75f); break;
        }
        assert_int_equal(rc, CN_OK);
        for (int64_t t = 0; t < T; t++)
            for (int64_t i = 0; i < C; i++) {
                double x = *at(&a, t, i), z = *at(&c, t, i), v;
                switch (op) {
                case 0: v = x + z; break;
                case 1: v = x * z; break;
                case 2: v = x / (1 + exp(-x)); break;
                case 3: v = x > 0 ? x * x : 0; break;
                default: v = x * -0.75; break;
                }
                ref[t * C + i] = v;
            }
        expect_view_close("elementwise", &y, ref, 2e-6);
        /* in place (y aliases a) gives the same values */
        view ai = view_clone(&a);
        switch (op) {
        case 0: rc = cn_op_add(b, &ai.t, &ai.t, &c.t); break;
        case 1: rc = cn_op_mul(b, &ai.t, &ai.t, &c.t); break;
        case 2: rc = cn_op_silu(b, &ai.t, &ai.t); break;
        case 3: rc = cn_op_relu2(b, &ai.t, &ai.t); break;
        default: rc = cn_op_scale(b, &ai.t, &ai.t, -0.75f); break;
        }
        assert_int_equal(rc, CN_OK);
        float *g1 = view_get(&ai), *g2 = view_get(&y);
        assert_memory_equal(g1, g2, (size_t)(T * C) * sizeof(float));
        free(g1);
        free(g2);
        view_free(&ai);
        view_free(&y);
    }
    view_free(&a);
    view_free(&c);
    /* relu^2 of a NaN, -0, -inf or a negative is +0 and of +inf +inf, in place, past a block */
    view s = view_make(1, 70, 1);
    for (int64_t i = 0; i < 70; i++) *at(&s, 0, i) = (float)(i % 7) - 3.5f;
    *at(&s, 0, 0) = NAN;
    *at(&s, 0, 1) = -0.0f;
    *at(&s, 0, 2) = -INFINITY;
    *at(&s, 0, 69) = INFINITY;
    float *v = view_get(&s);
    assert_int_equal(cn_op_relu2(b, &s.t, &s.t), CN_OK);
    for (int64_t i = 0; i < 70; i++) {
        float want = v[i] > 0 ? v[i] * v[i] : 0.0f;
        assert_memory_equal(at(&s, 0, i), &want, sizeof(float));
    }
    free(v);
    view_free(&s);
    cn_backend_free(b);
}

/* silu gives the same bits on every ISA (cpu_exp.h's scalar twin), near the reference over
 * magnitudes from subnormal to past exp's range, and at the edges: -0 stays -0, below -104 and
 * -inf give -0, +inf gives +inf, NaN stays NaN. 1000 values: 62 whole vectors and a tail. */
static void test_silu_isas(void **state) {
    (void)state;
    enum { N = 1000 };
    view x = view_make(1, N, 1);
    rng r = {41};
    for (int64_t i = 0; i < N; i++) {
        const float m = rng_unif(&r, -1, 1) * ldexpf(1.0f, (int)(i % 40) - 30); /* 2^-30..2^9 */
        *at(&x, 0, i) = m;
    }
    const float edge[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -103.9f, -104.0f, -104.5f,
                          -88.8f, 88.8f, 1e-40f, -1e-40f, FLT_MAX, -FLT_MAX, 20.0f, -20.0f};
    for (size_t i = 0; i < sizeof edge / sizeof *edge; i++) *at(&x, 0, (int64_t)i) = edge[i];
    float *got[N_ISA];
    for (int isa = 0; isa < N_ISA; isa++) {
        cn_backend *b = backend(2, isa);
        view y = view_make(1, N, 2);
        assert_int_equal(cn_op_silu(b, &y.t, &x.t), CN_OK);
        view_check_pad(&y);
        got[isa] = view_get(&y);
        view_free(&y);
        cn_backend_free(b);
    }
    for (int isa = 1; isa < N_ISA; isa++)
        for (int64_t i = 0; i < N; i++)
            if (!isnan(got[0][i])) assert_memory_equal(&got[isa][i], &got[0][i], sizeof(float));
    const float *g = got[0];
    for (int64_t i = 0; i < N; i++) {
        const double v = *at(&x, 0, i);
        if (isnan(v)) {
            assert_true(isnan(g[i]));
        } else if (v < -104.0) {
            assert_true(g[i] == 0.0f && signbit(g[i]));
        } else if (isinf(v)) {
            assert_true(g[i] == INFINITY);
        } else {
            const double ref = v / (1.0 + exp(-v));
            assert_true(fabs(g[i] - ref) <= 2e-6 * fabs(ref) + 1e-43);
            if (v == 0.0) assert_true(!signbit(g[i]) == !signbit(v));
        }
    }
    for (int isa = 0; isa < N_ISA; isa++) free(got[isa]);
    view_free(&x);
}

/* cpu_exp.h's three forms give the same bits: the AVX2 lanes (2^n applied in two halves) and the
 * AVX-512 lanes (scalef) against the scalar twin, over x from 0 to past -104, through the range
 * whose results are subnormal (-87.3 .. -103.3), and at 0, -0, -inf and NaN. */
#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2,fma"))) static void exp8(const float *x, float *y) {
    _mm256_storeu_ps(y, cpu_exp_le0_8(_mm256_loadu_ps(x)));
}
__attribute__((target("avx512f"))) static void exp16(const float *x, float *y) {
    _mm512_storeu_ps(y, cpu_exp_le0_16(_mm512_loadu_ps(x)));
}
#endif

static void test_exp_le0_lanes(void **state) {
    (void)state;
#if defined(__x86_64__) || defined(__i386__)
    enum { N = 4096 };
    float *x = malloc(N * sizeof *x), *y8 = malloc(N * sizeof *y8), *y16 = malloc(N * sizeof *y16);
    assert_true(x && y8 && y16);
    rng r = {42};
    for (int i = 0; i < N; i++) x[i] = i < N / 2 ? rng_unif(&r, -110, 0) : rng_unif(&r, -104, -86);
    const float edge[] = {0.0f, -0.0f, -INFINITY, NAN, -104.0f, -103.97f, -87.33f, -1e-30f};
    memcpy(x, edge, sizeof edge);
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const int avx512 = __builtin_cpu_supports("avx512f");
    for (int i = 0; i < N; i += 16) {
        if (avx2) exp8(x + i, y8 + i), exp8(x + i + 8, y8 + i + 8);
        if (avx512) exp16(x + i, y16 + i);
    }
    int subnormal = 0;
    for (int i = 0; i < N; i++) {
        const float want = cpu_exp_le0(x[i]);
        subnormal += want != 0 && fabsf(want) < FLT_MIN;
        if (isnan(want)) {
            assert_true((!avx2 || isnan(y8[i])) && (!avx512 || isnan(y16[i])));
            continue;
        }
        if (avx2) assert_memory_equal(&y8[i], &want, sizeof want);
        if (avx512) assert_memory_equal(&y16[i], &want, sizeof want);
    }
    assert_true(subnormal > 100); /* the inputs did reach the subnormal results */
    free(x);
    free(y8);
    free(y16);
#endif
}

/* ---------------------------------------------------------------- argmax */

/* The greedy pick per row by the sampler's rules (NaN never, +inf as FLT_MAX with ties to the
 * lowest column, a row of -inf/NaN gives 0), on strided rows; no fused epilogues on the CPU. */
static void test_argmax(void **state) {
    (void)state;
    cn_backend *b = backend(2, ISA_BEST);
    rng r = {77};
    const int64_t T = 7, C = 301;
    view x = view_rand(&r, T, C, 3, -5, 5);
    *at(&x, 0, 0) = 9.0f; /* row 0: a tie, the lower column wins */
    *at(&x, 0, 200) = 9.0f;
    *at(&x, 1, 3) = NAN; /* row 1: NaN is never chosen, +inf ties FLT_MAX to the lower column */
    *at(&x, 1, 50) = INFINITY;
    *at(&x, 1, 40) = FLT_MAX;
    for (int64_t c = 0; c < C; c++) *at(&x, 2, c) = c % 2 ? -INFINITY : NAN; /* row 2: none */
    for (int64_t c = 0; c < C; c++) *at(&x, 3, c) = c < 5 ? NAN : -INFINITY;
    *at(&x, 3, 9) = -1e30f; /* row 3: the only finite value */
    *at(&x, 4, C - 1) = 6.0f; /* row 4: the last column */
    int32_t want[7];
    for (int64_t t = 0; t < T; t++) {
        int32_t best = 0;
        float bx = -INFINITY;
        for (int64_t c = 0; c < C; c++) {
            float v = *at(&x, t, c);
            if (isnan(v)) continue;
            if (v > FLT_MAX) v = FLT_MAX;
            if (v > bx) {
                bx = v;
                best = (int32_t)c;
            }
        }
        want[t] = best;
    }
    assert_int_equal(want[0], 0);
    assert_int_equal(want[1], 40);
    assert_int_equal(want[2], 0);
    assert_int_equal(want[3], 9);
    assert_int_equal(want[4], C - 1);
    int32_t got[7] = {-1, -1, -1, -1, -1, -1, -1};
    cn_tensor ids = cn_tensor_1d(CN_I32, T, got);
    assert_int_equal(cn_op_argmax(b, &ids, &x.t), CN_OK);
    assert_memory_equal(got, want, sizeof want);
    assert_true(cn_backend_has_argmax(b));
    /* shapes that do not fit, and no epilogues on the CPU */
    cn_tensor short_ids = cn_tensor_1d(CN_I32, T - 1, got);
    assert_int_equal(cn_op_argmax(b, &short_ids, &x.t), CN_EINVAL);
    cn_tensor f_ids = cn_tensor_1d(CN_F32, T, got);
    assert_int_equal(cn_op_argmax(b, &f_ids, &x.t), CN_EINVAL);
    assert_false(cn_backend_has_matmul_ep(b));
    view_free(&x);
    cn_backend_free(b);
}

/* ---------------------------------------------------------------- memory */

static void test_memory_alloc_transfer_copy(void **state) {
    (void)state;
    cn_backend *b = backend(2, ISA_BEST);
    cn_tensor t = cn_tensor_2d(CN_F32, 5, 7, NULL);
    t.stride[0] = 99; /* alloc makes the descriptor contiguous */
    assert_int_equal(cn_backend_alloc(b, &t), CN_OK);
    assert_non_null(t.data);
    assert_int_equal((uintptr_t)t.data % 64, 0);
    assert_int_equal(t.where, CN_HOST);
    assert_int_equal(t.stride[0], 28);
    float host[35], back[35];
    for (int i = 0; i < 35; i++) host[i] = (float)i * 0.5f - 3;
    assert_int_equal(cn_backend_upload(b, &t, 0, host, sizeof host), CN_OK);
    assert_int_equal(cn_backend_upload(b, &t, 8, host, sizeof host), CN_EINVAL);
    assert_int_equal(cn_backend_upload(b, &t, 4 * 7, host + 7, 4 * 7), CN_OK);
    assert_int_equal(cn_backend_download(b, back, &t), CN_OK);
    assert_memory_equal(back, host, sizeof host);

    /* download of a column view packs its rows */
    cn_tensor v = cn_tensor_cols(&t, 2, 3);
    float packed[15];
    assert_int_equal(cn_backend_download(b, packed, &v), CN_OK);
    for (int r = 0; r < 5; r++)
        for (int c = 0; c < 3; c++) assert_true(packed[r * 3 + c] == host[r * 7 + 2 + c]);

    /* F32 view -> BF16 / F16 -> F32, with the conversions of fp.h */
    for (int k = 0; k < 2; k++) {
        cn_dtype dt = k ? CN_F16 : CN_BF16;
        cn_tensor h = cn_tensor_2d(dt, 5, 3, NULL), f = cn_tensor_2d(CN_F32, 5, 3, NULL);
        assert_int_equal(cn_backend_alloc(b, &h), CN_OK);
        assert_int_equal(cn_backend_alloc(b, &f), CN_OK);
        assert_int_equal(cn_backend_copy(b, &h, &v), CN_OK);
        assert_int_equal(cn_backend_copy(b, &f, &h), CN_OK);
        for (int r = 0; r < 5; r++)
            for (int c = 0; c < 3; c++) {
                float x = host[r * 7 + 2 + c];
                float want = dt == CN_BF16 ? cn_bf16_to_f32(cn_f32_to_bf16(x))
                                           : cn_f16_to_f32(cn_f32_to_f16(x));
                assert_true(((float *)f.data)[r * 3 + c] == want);
            }
        cn_backend_release(b, &h);
        cn_backend_release(b, &f);
        assert_null(h.data);
    }
    /* F32 -> F32 into a strided view leaves the rest alone */
    view dst = view_make(5, 3, 4);
    assert_int_equal(cn_backend_copy(b, &dst.t, &v), CN_OK);
    for (int r = 0; r < 5; r++)
        for (int c = 0; c < 3; c++) assert_true(*at(&dst, r, c) == host[r * 7 + 2 + c]);
    view_check_pad(&dst);
    view_free(&dst);

    int32_t ib[15] = {0};
    cn_tensor it = cn_tensor_2d(CN_I32, 5, 3, ib);
    cn_tensor f2 = cn_tensor_2d(CN_F32, 5, 3, packed);
    assert_int_equal(cn_backend_copy(b, &f2, &it), CN_EUNSUPPORTED);
    assert_int_equal(cn_backend_weight(b, &t), CN_OK);
    assert_int_equal(cn_backend_sync(b), CN_OK);
    cn_backend_release(b, &t);
    assert_null(t.data);
    cn_backend_release(b, &t); /* safe twice */
    cn_backend_free(b);
}

/* set_rows writes exactly its rows (strided views on both sides) and refuses a range past the
 * end or another dtype; a positioned step on the CPU always asks for its ops (nothing replays). */
static void test_set_rows_and_positioned_step(void **state) {
    (void)state;
    cn_backend *b = backend(1, ISA_BEST);
    view dst = view_make(6, 3, 2), src = view_make(2, 3, 1);
    for (int r = 0; r < 6; r++)
        for (int c = 0; c < 3; c++) *at(&dst, r, c) = (float)(10 * r + c);
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 3; c++) *at(&src, r, c) = (float)(-1 - 10 * r - c);
    assert_int_equal(cn_backend_step_begin_at(b, 3, 42, 4), 0);
    assert_int_equal(cn_op_set_rows(b, &dst.t, 4, &src.t), CN_OK);
    assert_int_equal(cn_backend_step_end(b, 1), CN_OK);
    for (int r = 0; r < 6; r++)
        for (int c = 0; c < 3; c++)
            assert_true(*at(&dst, r, c) == (r >= 4 ? (float)(-1 - 10 * (r - 4) - c) : (float)(10 * r + c)));
    view_check_pad(&dst);
    assert_int_equal(cn_op_set_rows(b, &dst.t, 5, &src.t), CN_EINVAL);  /* past the end */
    assert_int_equal(cn_op_set_rows(b, &dst.t, -1, &src.t), CN_EINVAL);
    int32_t ib[6] = {0};
    cn_tensor it = cn_tensor_2d(CN_I32, 2, 3, ib);
    assert_int_equal(cn_op_set_rows(b, &dst.t, 0, &it), CN_EINVAL);     /* another dtype */
    assert_int_equal(cn_backend_step_begin_at(b, 3, 42, -1), CN_EINVAL);
    view_free(&dst);
    view_free(&src);
    cn_backend_free(b);
}

/* The CPU has no lanes (backend.h): fork, back and join answer CN_OK and the ops run as called,
 * each seeing what the one before wrote. */
static void test_lanes_run_in_order(void **state) {
    (void)state;
    cn_backend *b = backend(1, ISA_BEST);
    view dst = view_make(2, 3, 1), src = view_make(1, 3, 0);
    for (int c = 0; c < 3; c++) *at(&src, 0, c) = (float)(7 + c);
    cn_tensor r0 = cn_tensor_rows(&dst.t, 0, 1), r1 = cn_tensor_rows(&dst.t, 1, 1);
    assert_int_equal(cn_backend_join(b), CN_OK); /* nothing open */
    assert_int_equal(cn_backend_fork(b), CN_OK);
    assert_int_equal(cn_op_scale(b, &r0, &src.t, 2.0f), CN_OK);
    assert_int_equal(cn_backend_back(b), CN_OK);
    assert_int_equal(cn_op_add(b, &r1, &r0, &src.t), CN_OK); /* reads the side lane's row */
    assert_int_equal(cn_backend_join(b), CN_OK);
    for (int c = 0; c < 3; c++) {
        assert_true(*at(&dst, 0, c) == 2.0f * (float)(7 + c));
        assert_true(*at(&dst, 1, c) == 3.0f * (float)(7 + c));
    }
    view_check_pad(&dst);
    view_free(&dst);
    view_free(&src);
    cn_backend_free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lanes_run_in_order),
        cmocka_unit_test(test_matmul_all_dtypes_and_odd_sizes),
        cmocka_unit_test(test_matmul_simd_matches_scalar_and_threads_agree),
        cmocka_unit_test(test_matmul_decode_streams_match_rows),
        cmocka_unit_test(test_matmul_bf16_prefill_rows_match_decode),
        cmocka_unit_test(test_matmul_f8_every_code),
        cmocka_unit_test(test_matmul_unsupported_weight),
        cmocka_unit_test(test_matmul_gather),
        cmocka_unit_test(test_matmul_gather_threads_agree_and_bad_ids),
        cmocka_unit_test(test_get_rows),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_gated_rmsnorm),
        cmocka_unit_test(test_conv1d_reference_and_split),
        cmocka_unit_test(test_ssm_scan_reference),
        cmocka_unit_test(test_ssm_scan_threads_and_scalar),
        cmocka_unit_test(test_ssm_scan_rows8_equal_steps),
        cmocka_unit_test(test_ssm_scan_from_equal_copy),
        cmocka_unit_test(test_state_caps_short_scan),
        cmocka_unit_test(test_state_caps_equal_segments),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_threads_agree),
        cmocka_unit_test(test_attention_tiled_prefill),
        cmocka_unit_test(test_attention_tiled_bits),
        cmocka_unit_test(test_exp_le0_lanes),
        cmocka_unit_test(test_attention_long_context_decode_equals_prefill),
        cmocka_unit_test(test_attention_window),
        cmocka_unit_test(test_attention_window_threads_agree),
        cmocka_unit_test(test_moe_route),
        cmocka_unit_test(test_moe_combine),
        cmocka_unit_test(test_elementwise), cmocka_unit_test(test_silu_isas),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_memory_alloc_transfer_copy),
        cmocka_unit_test(test_set_rows_and_positioned_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
