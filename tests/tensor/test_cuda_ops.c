/* test_cuda_ops.c - every CUDA backend op against the CPU backend on the same random inputs.
 *
 * Needs a GPU: built only with CAIRN_CUDA, labelled `gpu`, run by `make test-cuda` and never by
 * `make test`. Activations are column views of wider buffers (rows strided, first column
 * misaligned) and the padding around every CUDA output is checked to be untouched. Tolerances are
 * max |cuda - cpu| relative to max |cpu|, per op:
 *   matmul / matmul_gather, every weight dtype and path,    2e-5  (fp32 sums in another order;
 *     NVFP4 against a double reference 6e-5: the decode GEMV's x in two int8 terms;
 *     and the fused ones (norm in, relu^2 / combine / add out) against the plain CPU ops
 *     the tensor-core paths split x in two bf16 terms, within 2^-18 per product, cuda_impl.h (4))
 *   ssm_scan, attention (online softmax)                    2e-5
 *   rmsnorm, gated_rmsnorm, conv1d, moe_combine, elementwise 2e-6
 *   get_rows, copy conversions, routing ids, argmax         exact
 * Bad ids give CN_EINVAL with the output untouched (checked on the device, see cuda_impl.h (1)).
 * Steps (backend.h) give the eager results bit for bit and report bad ids at their end; run with
 * CAIRN_CUDA_GRAPHS=0 as well, the same test covers eager steps.
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
#include "tensor/backends.h"
#include "tensor/cuda/cuda_backend.h"
#include "test_util.h"

#define SENTINEL 12345.0f
#define TOL_MM 2e-5
/* NVFP4 products against the double reference: the decode GEMV (cuda_gemv_fp4.cu) holds x as two
 * int8 terms, each value within 2^-16 of its block's largest magnitude (1.55e-5); its largest
 * error seen on the H200 was 2.1e-5 */
#define TOL_FP4 6e-5
#define TOL_EW 2e-6

static cn_backend *g_cpu, *g_cu;
static uint64_t g_rng = 0x243f6a8885a308d3ull;

static float unif(float lo, float hi) {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return lo + (hi - lo) * (float)((z >> 40) * (1.0 / 16777216.0));
}

/* ---------------------------------------------------------------- tensors on both backends */

/* An F32 activation [T, C] inside a buffer [T, C + pad] from column `off`, on both backends. */
typedef struct pv {
    cn_tensor cp, gp; /* parents */
    cn_tensor c, g;   /* views */
    int64_t T, C, W, off;
} pv;

static pv pv_make(int64_t T, int64_t C, int64_t pad, float lo, float hi) {
    pv v = {.T = T, .C = C, .W = C + pad, .off = pad > 0 ? 1 : 0};
    float *buf = malloc((size_t)(T * v.W + 1) * sizeof(float));
    assert_non_null(buf);
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < v.W; c++)
            buf[t * v.W + c] = (c >= v.off && c < v.off + C) ? unif(lo, hi) : SENTINEL;
    v.cp = cn_tensor_2d(CN_F32, T, v.W, NULL);
    v.gp = v.cp;
    assert_int_equal(cn_backend_alloc(g_cpu, &v.cp), 0);
    assert_int_equal(cn_backend_alloc(g_cu, &v.gp), 0);
    uint64_t n = (uint64_t)(T * v.W) * sizeof(float);
    assert_int_equal(cn_backend_upload(g_cpu, &v.cp, 0, buf, n), 0);
    assert_int_equal(cn_backend_upload(g_cu, &v.gp, 0, buf, n), 0);
    free(buf);
    v.c = cn_tensor_cols(&v.cp, v.off, C);
    v.g = cn_tensor_cols(&v.gp, v.off, C);
    return v;
}

static void pv_free(pv *v) {
    cn_backend_release(g_cpu, &v->cp);
    cn_backend_release(g_cu, &v->gp);
}

static float *get(cn_backend *b, const cn_tensor *t) {
    float *o = malloc((size_t)(t->shape[0] * t->shape[1] + 1) * sizeof(float));
    assert_non_null(o);
    assert_int_equal(cn_backend_download(b, o, t), 0);
    return o;
}

/* Compares the CUDA view with the CPU view and checks the CUDA padding. */
static void pv_expect(const char *what, const pv *v, double tol) {
    float *a = get(g_cu, &v->g), *b = get(g_cpu, &v->c);
    double e = tu_rel_err(a, b, (size_t)(v->T * v->C));
    if (!(e <= tol)) {
        print_error("%s: rel err %.3g > %.1g\n", what, e, tol);
        fail();
    }
    free(a);
    free(b);
    float *full = get(g_cu, &v->gp);
    for (int64_t t = 0; t < v->T; t++)
        for (int64_t c = 0; c < v->W; c++)
            if (c < v->off || c >= v->off + v->C) assert_true(full[t * v->W + c] == SENTINEL);
    free(full);
}

/* I32 ids [R, K] on both backends, contiguous. */
typedef struct pid {
    cn_tensor c, g;
} pid;

static pid pid_make(int64_t R, int64_t K, const int32_t *ids) {
    pid p;
    p.c = cn_tensor_2d(CN_I32, R, K, NULL);
    p.g = p.c;
    assert_int_equal(cn_backend_alloc(g_cpu, &p.c), 0);
    assert_int_equal(cn_backend_alloc(g_cu, &p.g), 0);
    assert_int_equal(cn_backend_upload(g_cpu, &p.c, 0, ids, (uint64_t)(R * K) * 4), 0);
    assert_int_equal(cn_backend_upload(g_cu, &p.g, 0, ids, (uint64_t)(R * K) * 4), 0);
    return p;
}

static void pid_free(pid *p) {
    cn_backend_release(g_cpu, &p->c);
    cn_backend_release(g_cu, &p->g);
}

/* A weight [N, K] of dtype dt: host bytes used in place by the CPU, uploaded for CUDA. */
typedef struct pw {
    cn_tensor c, g;
    void *host;
} pw;

static pw pw_make(cn_dtype dt, int64_t N, int64_t K, float amp) {
    pw w;
    size_t esz = cn_dtype_size(dt);
    w.host = malloc((size_t)(N * K) * esz + 1);
    assert_non_null(w.host);
    for (int64_t i = 0; i < N * K; i++) {
        float v = unif(-amp, amp);
        switch (dt) {
        case CN_BF16: ((uint16_t *)w.host)[i] = cn_f32_to_bf16(v); break;
        case CN_F16: ((uint16_t *)w.host)[i] = cn_f32_to_f16(v); break;
        case CN_F8_E4M3: ((uint8_t *)w.host)[i] = cn_f32_to_e4m3(v * 100.0f); break;
        default: ((float *)w.host)[i] = v; break;
        }
    }
    w.c = cn_tensor_2d(dt, N, K, w.host);
    if (dt == CN_F8_E4M3) w.c.scale = 0.0123f;
    w.g = w.c;
    assert_int_equal(cn_backend_weight(g_cu, &w.g), 0);
    assert_int_equal(w.g.where, CN_DEVICE);
    return w;
}

static void pw_free(pw *w) { free(w->host); } /* the CUDA copy is the backend's until it is freed */

/* An F32 vector [n] on both backends. */
static pv vec_make(int64_t n, float lo, float hi) {
    pv v = pv_make(1, n, 0, lo, hi);
    v.c = cn_tensor_1d(CN_F32, n, v.cp.data);
    v.g = cn_tensor_1d(CN_F32, n, v.gp.data);
    return v;
}

/* ---------------------------------------------------------------- tests */

static const cn_dtype k_wdt[] = {CN_F32, CN_BF16, CN_F16, CN_F8_E4M3};

static void test_matmul(void **st) {
    (void)st;
    const int64_t Ts[] = {1, 5, 8, 13, 40, 77, 150}; /* 150: F8's tensor-core tiles of 128 rows */
    for (int64_t K = 200; K <= 256; K += 56) /* 256: every dtype's rows load 16 bytes at a time */
    for (size_t d = 0; d < sizeof k_wdt / sizeof k_wdt[0]; d++)
        for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
            const int64_t T = Ts[i], N = 150;
            pw w = pw_make(k_wdt[d], N, K, 0.5f);
            pv x = pv_make(T, K, 3, -1, 1), y = pv_make(T, N, 2, 0, 0);
            assert_int_equal(cn_op_matmul(g_cpu, &y.c, &w.c, &x.c), 0);
            assert_int_equal(cn_op_matmul(g_cu, &y.g, &w.g, &x.g), 0);
            char what[64];
            snprintf(what, sizeof what, "matmul %s T=%lld K=%lld", cn_dtype_name(k_wdt[d]), (long long)T,
                     (long long)K);
            pv_expect(what, &y, TOL_MM);
            pv_free(&x);
            pv_free(&y);
            pw_free(&w);
        }
    /* one x row over many weight rows: the decode GEMV splits K over 8, 4, 2 or 1 warps per row
     * group as N grows (on a GPU of about 132 SMs, N = 150, 5000, 9000, 17000 take each once) */
    const int64_t Ns[] = {5000, 9000, 17000};
    for (size_t d = 0; d < sizeof k_wdt / sizeof k_wdt[0]; d++)
        for (size_t i = 0; i < sizeof Ns / sizeof Ns[0]; i++) {
            pw w1 = pw_make(k_wdt[d], Ns[i], 256, 0.5f);
            pv x1 = pv_make(1, 256, 3, -1, 1), y1 = pv_make(1, Ns[i], 2, 0, 0);
            assert_int_equal(cn_op_matmul(g_cpu, &y1.c, &w1.c, &x1.c), 0);
            assert_int_equal(cn_op_matmul(g_cu, &y1.g, &w1.g, &x1.g), 0);
            char what[64];
            snprintf(what, sizeof what, "matmul %s T=1 N=%lld", cn_dtype_name(k_wdt[d]),
                     (long long)Ns[i]);
            pv_expect(what, &y1, TOL_MM);
            pv_free(&x1);
            pv_free(&y1);
            pw_free(&w1);
        }
    /* a larger bf16 product through cuBLAS (tensor cores, three-term split) */
    pw w = pw_make(CN_BF16, 384, 512, 0.1f);
    pv x = pv_make(96, 512, 0, -2, 2), y = pv_make(96, 384, 0, 0, 0);
    assert_int_equal(cn_op_matmul(g_cpu, &y.c, &w.c, &x.c), 0);
    assert_int_equal(cn_op_matmul(g_cu, &y.g, &w.g, &x.g), 0);
    pv_expect("matmul bf16 96x512x384", &y, TOL_MM);
    pv_free(&x);
    pv_free(&y);
    pw_free(&w);
}

static void test_matmul_gather(void **st) {
    (void)st;
    enum { NW = 8 };
    /* T, k: T*k <= 32 takes the gather GEMV (8x4 its edge), more the sorted tiles: SIMT at
     * K = 72, on tensor cores at K = 256 for BF16 and F8 (32-row tiles up to 32 rows per expert
     * on average, then 64: 80x4, then 128 above 64: 150x4) */
    const int64_t cases[][2] = {{1, 3}, {3, 2}, {8, 4}, {11, 3}, {40, 4}, {80, 4}, {150, 4}};
    for (int64_t K = 72; K <= 256; K += 184)
    for (size_t d = 0; d < sizeof k_wdt / sizeof k_wdt[0]; d++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
            for (int per_row = 0; per_row < 2; per_row++) {
                const int64_t T = cases[ci][0], k = cases[ci][1], N = 90;
                pw ws[NW];
                const cn_tensor *wc[NW], *wg[NW];
                for (int e = 0; e < NW; e++) {
                    ws[e] = pw_make(k_wdt[d], N, K, 0.5f);
                    wc[e] = &ws[e].c;
                    wg[e] = &ws[e].g;
                }
                int32_t *ids = malloc((size_t)(T * k) * sizeof *ids);
                for (int64_t i = 0; i < T * k; i++) ids[i] = (int32_t)(unif(0, NW - 0.001f));
                pid id = pid_make(T, k, ids);
                pv x = pv_make(per_row ? T * k : T, K, 3, -1, 1), y = pv_make(T * k, N, 1, 0, 0);
                assert_int_equal(cn_op_matmul_gather(g_cpu, &y.c, wc, NW, &x.c, &id.c), 0);
                assert_int_equal(cn_op_matmul_gather(g_cu, &y.g, wg, NW, &x.g, &id.g), 0);
                char what[80];
                snprintf(what, sizeof what, "matmul_gather %s T=%lld k=%lld K=%lld per_row=%d",
                         cn_dtype_name(k_wdt[d]), (long long)T, (long long)k, (long long)K, per_row);
                pv_expect(what, &y, TOL_MM);
                /* an id out of range: CN_EINVAL and nothing written */
                ids[T * k - 1] = NW;
                pid bad = pid_make(T, k, ids);
                pv y2 = pv_make(T * k, N, 1, 7, 7);
                float *before = get(g_cu, &y2.gp);
                assert_int_equal(cn_op_matmul_gather(g_cu, &y2.g, wg, NW, &x.g, &bad.g), CN_EINVAL);
                float *after = get(g_cu, &y2.gp);
                assert_memory_equal(before, after, (size_t)(y2.T * y2.W) * sizeof(float));
                free(before);
                free(after);
                pv_free(&y2);
                pid_free(&bad);
                pid_free(&id);
                free(ids);
                pv_free(&x);
                pv_free(&y);
                for (int e = 0; e < NW; e++) pw_free(&ws[e]);
            }
}

/* The tensor-core GEMMs split x in bf16 terms (cuda_grouped_gemm.cu): at the model's widths
 * (K = 2688, 1856) the result still agrees with the CPU's fp32 within TOL_MM; the error is
 * printed to show the margin. */
static void test_matmul_gather_wide(void **st) {
    (void)st;
    enum { NW = 4 };
    for (int64_t K = 1856; K <= 2688; K += 832) {
        const int64_t T = 48, k = 2, N = 160;
        pw ws[NW];
        const cn_tensor *wc[NW], *wg[NW];
        for (int e = 0; e < NW; e++) {
            ws[e] = pw_make(CN_BF16, N, K, 0.05f);
            wc[e] = &ws[e].c;
            wg[e] = &ws[e].g;
        }
        int32_t ids[96]; /* T * k */
        for (int64_t i = 0; i < T * k; i++) ids[i] = (int32_t)(unif(0, NW - 0.001f));
        pid id = pid_make(T, k, ids);
        pv x = pv_make(T, K, 0, -3, 3), y = pv_make(T * k, N, 0, 0, 0);
        assert_int_equal(cn_op_matmul_gather(g_cpu, &y.c, wc, NW, &x.c, &id.c), 0);
        assert_int_equal(cn_op_matmul_gather(g_cu, &y.g, wg, NW, &x.g, &id.g), 0);
        float *a = get(g_cu, &y.g), *b = get(g_cpu, &y.c);
        print_message("matmul_gather bf16 K=%lld: rel err %.3g (tolerance %.1g)\n", (long long)K,
                      tu_rel_err(a, b, (size_t)(T * k * N)), TOL_MM);
        free(a);
        free(b);
        pv_expect("matmul_gather bf16 wide", &y, TOL_MM);
        pid_free(&id);
        pv_free(&x);
        pv_free(&y);
        for (int e = 0; e < NW; e++) pw_free(&ws[e]);
    }
}

static void test_get_rows(void **st) {
    (void)st;
    for (size_t d = 0; d < sizeof k_wdt / sizeof k_wdt[0]; d++) {
        const int64_t V = 50, H = 70, T = 9;
        pw tab = pw_make(k_wdt[d], V, H, 1.0f);
        int32_t ids[9];
        for (int i = 0; i < T; i++) ids[i] = (int32_t)unif(0, V - 0.001f);
        pid id = pid_make(T, 1, ids);
        id.c.ndim = id.g.ndim = 1;
        id.c.shape[0] = id.g.shape[0] = T;
        pv y = pv_make(T, H, 2, 0, 0);
        assert_int_equal(cn_op_get_rows(g_cpu, &y.c, &tab.c, &id.c), 0);
        assert_int_equal(cn_op_get_rows(g_cu, &y.g, &tab.g, &id.g), 0);
        pv_expect("get_rows", &y, 0.0);
        ids[4] = -1;
        pid bad = pid_make(T, 1, ids);
        bad.g.ndim = 1;
        pv y2 = pv_make(T, H, 2, 3, 3);
        float *before = get(g_cu, &y2.gp);
        assert_int_equal(cn_op_get_rows(g_cu, &y2.g, &tab.g, &bad.g), CN_EINVAL);
        float *after = get(g_cu, &y2.gp);
        assert_memory_equal(before, after, (size_t)(y2.T * y2.W) * sizeof(float));
        free(before);
        free(after);
        pv_free(&y2);
        pid_free(&bad);
        pv_free(&y);
        pid_free(&id);
        pw_free(&tab);
    }
}

static void test_norms(void **st) {
    (void)st;
    const int64_t T = 7, C = 96;
    pv w = vec_make(C, 0.5f, 1.5f);
    pv x = pv_make(T, C, 3, -3, 3), y = pv_make(T, C, 2, 0, 0), z = pv_make(T, C, 1, -4, 4);
    assert_int_equal(cn_op_rmsnorm(g_cpu, &y.c, &x.c, &w.c, 1e-5f), 0);
    assert_int_equal(cn_op_rmsnorm(g_cu, &y.g, &x.g, &w.g, 1e-5f), 0);
    pv_expect("rmsnorm", &y, TOL_EW);
    assert_int_equal(cn_op_gated_rmsnorm(g_cpu, &y.c, &x.c, &z.c, &w.c, 24, 1e-5f), 0);
    assert_int_equal(cn_op_gated_rmsnorm(g_cu, &y.g, &x.g, &z.g, &w.g, 24, 1e-5f), 0);
    pv_expect("gated_rmsnorm", &y, TOL_EW);
    /* in place */
    assert_int_equal(cn_op_gated_rmsnorm(g_cpu, &x.c, &x.c, &z.c, &w.c, 32, 1e-5f), 0);
    assert_int_equal(cn_op_gated_rmsnorm(g_cu, &x.g, &x.g, &z.g, &w.g, 32, 1e-5f), 0);
    pv_expect("gated_rmsnorm in place", &x, TOL_EW);
    assert_int_equal(cn_op_rmsnorm(g_cpu, &x.c, &x.c, &w.c, 1e-6f), 0);
    assert_int_equal(cn_op_rmsnorm(g_cu, &x.g, &x.g, &w.g, 1e-6f), 0);
    pv_expect("rmsnorm in place", &x, TOL_EW);
    pv_free(&w);
    pv_free(&x);
    pv_free(&y);
    pv_free(&z);
}

static void test_elementwise(void **st) {
    (void)st;
    const int64_t T = 9, C = 77;
    pv a = pv_make(T, C, 2, -5, 5), c = pv_make(T, C, 1, -5, 5), y = pv_make(T, C, 3, 0, 0);
    for (int op = 0; op < 5; op++) {
        cn_backend *bs[2] = {g_cpu, g_cu};
        for (int i = 0; i < 2; i++) {
            cn_tensor *yy = i ? &y.g : &y.c;
            const cn_tensor *aa = i ? &a.g : &a.c, *cc = i ? &c.g : &c.c;
            int rc = op == 0   ? cn_op_add(bs[i], yy, aa, cc)
                     : op == 1 ? cn_op_mul(bs[i], yy, aa, cc)
                     : op == 2 ? cn_op_silu(bs[i], yy, aa)
                     : op == 3 ? cn_op_relu2(bs[i], yy, aa)
                               : cn_op_scale(bs[i], yy, aa, -0.75f);
            assert_int_equal(rc, 0);
        }
        char what[32];
        snprintf(what, sizeof what, "elementwise op %d", op);
        pv_expect(what, &y, TOL_EW);
    }
    /* in place add, as the residual does */
    assert_int_equal(cn_op_add(g_cpu, &a.c, &a.c, &c.c), 0);
    assert_int_equal(cn_op_add(g_cu, &a.g, &a.g, &c.g), 0);
    pv_expect("add in place", &a, TOL_EW);
    pv_free(&a);
    pv_free(&c);
    pv_free(&y);
}

static void test_copy(void **st) {
    (void)st;
    const int64_t T = 6, C = 33;
    pv x = pv_make(T, C, 2, -100, 100), y = pv_make(T, C, 1, 0, 0);
    const cn_dtype mids[] = {CN_BF16, CN_F16};
    for (int i = 0; i < 2; i++) {
        cn_tensor mc = cn_tensor_2d(mids[i], T, C, NULL), mg = mc;
        assert_int_equal(cn_backend_alloc(g_cpu, &mc), 0);
        assert_int_equal(cn_backend_alloc(g_cu, &mg), 0);
        assert_int_equal(cn_backend_copy(g_cpu, &mc, &x.c), 0);
        assert_int_equal(cn_backend_copy(g_cu, &mg, &x.g), 0);
        assert_int_equal(cn_backend_copy(g_cpu, &y.c, &mc), 0);
        assert_int_equal(cn_backend_copy(g_cu, &y.g, &mg), 0);
        pv_expect("copy through 16-bit", &y, 0.0);
        cn_backend_release(g_cpu, &mc);
        cn_backend_release(g_cu, &mg);
    }
    assert_int_equal(cn_backend_copy(g_cpu, &y.c, &x.c), 0);
    assert_int_equal(cn_backend_copy(g_cu, &y.g, &x.g), 0);
    pv_expect("copy f32", &y, 0.0);
    pv_free(&x);
    pv_free(&y);
}

static void test_conv1d(void **st) {
    (void)st;
    const int64_t T = 21, C = 70, K = 4; /* > 8 tokens: one thread per output (cuda_ssm.cu) */
    pv x = pv_make(T, C, 2, -1, 1), y = pv_make(T, C, 1, 0, 0);
    pv w = pv_make(C, K, 0, -0.5f, 0.5f), bias = vec_make(C, -0.2f, 0.2f);
    pv s = pv_make(K - 1, C, 0, -1, 1);
    assert_int_equal(cn_op_conv1d(g_cpu, &y.c, &x.c, &w.c, &bias.c, 0, &s.c), 0);
    assert_int_equal(cn_op_conv1d(g_cu, &y.g, &x.g, &w.g, &bias.g, 0, &s.g), 0);
    pv_expect("conv1d y", &y, TOL_EW);
    pv_expect("conv1d state", &s, 0.0);
    /* again from the new state, in two pieces on CUDA (2 tokens walked in time, then 19 in
     * parallel) and one on the CPU, no bias, silu fused (both kernels' activation) */
    assert_int_equal(cn_op_conv1d(g_cpu, &y.c, &x.c, &w.c, NULL, 1, &s.c), 0);
    cn_tensor y0 = cn_tensor_rows(&y.g, 0, 2), y1 = cn_tensor_rows(&y.g, 2, T - 2);
    cn_tensor x0 = cn_tensor_rows(&x.g, 0, 2), x1 = cn_tensor_rows(&x.g, 2, T - 2);
    assert_int_equal(cn_op_conv1d(g_cu, &y0, &x0, &w.g, NULL, 1, &s.g), 0);
    assert_int_equal(cn_op_conv1d(g_cu, &y1, &x1, &w.g, NULL, 1, &s.g), 0);
    pv_expect("conv1d split y", &y, TOL_EW);
    pv_expect("conv1d split state", &s, 0.0);
    /* decode-like tokens in a row on two states: the second launch's state is settled (the one
     * before wrote only y and the other state: cuda_impl.h invariant 7) and read before its
     * enter; the third's is the one the launch just before wrote, so it waits */
    pv s2 = pv_make(K - 1, C, 0, -1, 1);
    pv *st_of[3] = {&s, &s2, &s2};
    for (int i = 0; i < 3; i++) {
        cn_tensor yc = cn_tensor_rows(&y.c, i, 1), xc = cn_tensor_rows(&x.c, i, 1);
        cn_tensor yg = cn_tensor_rows(&y.g, i, 1), xg = cn_tensor_rows(&x.g, i, 1);
        assert_int_equal(cn_op_conv1d(g_cpu, &yc, &xc, &w.c, &bias.c, 1, &st_of[i]->c), 0);
        assert_int_equal(cn_op_conv1d(g_cu, &yg, &xg, &w.g, &bias.g, 1, &st_of[i]->g), 0);
    }
    pv_expect("conv1d steps y", &y, TOL_EW);
    pv_expect("conv1d steps state", &s, 0.0);
    pv_expect("conv1d steps other state", &s2, 0.0);
    pv_free(&s2);
    pv_free(&x);
    pv_free(&y);
    pv_free(&w);
    pv_free(&bias);
    pv_free(&s);
}

static void check_scan(int H, int P, int G, int N, int T) {
    pv x = pv_make(T, H * P, 2, -1, 1), dt = pv_make(T, H, 1, -3, 1);
    pv B = pv_make(T, G * N, 3, -1, 1), C = pv_make(T, G * N, 1, -1, 1);
    pv y = pv_make(T, H * P, 1, 0, 0), s = pv_make(H, P * N, 0, -0.5f, 0.5f);
    pv A = vec_make(H, -1, 1), D = vec_make(H, 0, 1), dtb = vec_make(H, -0.5f, 0.5f);
    cn_ssm_args ac = {.A_log = &A.c, .D = &D.c, .dt_bias = &dtb.c, .n_heads = H, .head_dim = P,
                      .n_groups = G, .d_state = N, .chunk = 4, .dt_min = 0.001f, .dt_max = 10.0f};
    cn_ssm_args ag = ac;
    ag.A_log = &A.g;
    ag.D = &D.g;
    ag.dt_bias = &dtb.g;
    assert_int_equal(cn_op_ssm_scan(g_cpu, &y.c, &x.c, &dt.c, &B.c, &C.c, &ac, &s.c), 0);
    assert_int_equal(cn_op_ssm_scan(g_cu, &y.g, &x.g, &dt.g, &B.g, &C.g, &ag, &s.g), 0);
    char what[64];
    snprintf(what, sizeof what, "ssm_scan N=%d y", N);
    pv_expect(what, &y, 2e-5);
    snprintf(what, sizeof what, "ssm_scan N=%d state", N);
    pv_expect(what, &s, 2e-5);
    /* steps on CUDA continue from the state like a scan on the CPU */
    assert_int_equal(cn_op_ssm_scan(g_cpu, &y.c, &x.c, &dt.c, &B.c, &C.c, &ac, &s.c), 0);
    for (int t = 0; t < T; t++) {
        cn_tensor yt = cn_tensor_rows(&y.g, t, 1), xt = cn_tensor_rows(&x.g, t, 1);
        cn_tensor dtt = cn_tensor_rows(&dt.g, t, 1), Bt = cn_tensor_rows(&B.g, t, 1);
        cn_tensor Ct = cn_tensor_rows(&C.g, t, 1);
        assert_int_equal(cn_op_ssm_step(g_cu, &yt, &xt, &dtt, &Bt, &Ct, &ag, &s.g), 0);
    }
    pv_expect("ssm steps y", &y, 2e-5);
    pv_expect("ssm steps state", &s, 2e-5);
    pv_free(&x);
    pv_free(&dt);
    pv_free(&B);
    pv_free(&C);
    pv_free(&y);
    pv_free(&s);
    pv_free(&A);
    pv_free(&D);
    pv_free(&dtb);
}

static void test_ssm_scan(void **st) {
    (void)st;
    check_scan(4, 8, 2, 16, 9);
    check_scan(6, 5, 3, 48, 11);  /* lanes partly idle */
    /* from 32 tokens the chunked kernel (cuda_ssm.cu): chunks of 32 with tails, p rows in blocks
     * of 16 and pairs per warp (partly live), 1, 2 and 4 state values per lane, B and C copied
     * 4 floats at once (N % 4 == 0) or one at a time */
    check_scan(2, 4, 1, 128, 33); /* nano's d_state */
    check_scan(3, 20, 1, 128, 75);
    check_scan(4, 8, 2, 16, 70);
    check_scan(6, 5, 3, 48, 40);
    check_scan(3, 7, 1, 30, 37);
}

static void check_attention(cn_dtype kvdt, int Hq, int Hkv, int Dh, int n_past, int T) {
    const int64_t S = n_past + T + 3;
    pv q = pv_make(T, (int64_t)Hq * Dh, 2, -1, 1), out = pv_make(T, (int64_t)Hq * Dh, 1, 0, 0);
    pv kf = pv_make(S, (int64_t)Hkv * Dh, 0, -1, 1), vf = pv_make(S, (int64_t)Hkv * Dh, 0, -2, 2);
    cn_tensor kc = kf.c, kg = kf.g, vc = vf.c, vg = vf.g;
    cn_tensor k16c, k16g, v16c, v16g;
    if (kvdt != CN_F32) { /* a compact cache: the same values rounded to 16 bits on both */
        k16c = cn_tensor_2d(kvdt, S, (int64_t)Hkv * Dh, NULL);
        k16g = k16c;
        v16c = k16c;
        v16g = k16c;
        assert_int_equal(cn_backend_alloc(g_cpu, &k16c), 0);
        assert_int_equal(cn_backend_alloc(g_cu, &k16g), 0);
        assert_int_equal(cn_backend_alloc(g_cpu, &v16c), 0);
        assert_int_equal(cn_backend_alloc(g_cu, &v16g), 0);
        assert_int_equal(cn_backend_copy(g_cpu, &k16c, &kf.c), 0);
        assert_int_equal(cn_backend_copy(g_cu, &k16g, &kf.g), 0);
        assert_int_equal(cn_backend_copy(g_cpu, &v16c, &vf.c), 0);
        assert_int_equal(cn_backend_copy(g_cu, &v16g, &vf.g), 0);
        kc = k16c;
        kg = k16g;
        vc = v16c;
        vg = v16g;
    }
    float scale = 1.0f / sqrtf((float)Dh);
    assert_int_equal(cn_op_attention(g_cpu, &out.c, &q.c, &kc, &vc, n_past, Hq, Hkv, scale), 0);
    assert_int_equal(cn_op_attention(g_cu, &out.g, &q.g, &kg, &vg, n_past, Hq, Hkv, scale), 0);
    char what[80];
    snprintf(what, sizeof what, "attention %s Hq=%d Hkv=%d Dh=%d past=%d T=%d", cn_dtype_name(kvdt),
             Hq, Hkv, Dh, n_past, T);
    pv_expect(what, &out, 2e-5);
    if (kvdt != CN_F32) {
        cn_backend_release(g_cpu, &k16c);
        cn_backend_release(g_cu, &k16g);
        cn_backend_release(g_cpu, &v16c);
        cn_backend_release(g_cu, &v16g);
    }
    pv_free(&q);
    pv_free(&out);
    pv_free(&kf);
    pv_free(&vf);
}

static void test_attention(void **st) {
    (void)st;
    check_attention(CN_F32, 4, 2, 24, 5, 7);
    check_attention(CN_F32, 8, 8, 64, 0, 40);
    check_attention(CN_F32, 6, 2, 128, 300, 1); /* decode against a longer cache */
    check_attention(CN_BF16, 4, 1, 40, 70, 3);
    check_attention(CN_F16, 2, 2, 16, 33, 2);
    /* split-K: many spans of 256 keys, a last span partly or wholly past some queries' keys */
    check_attention(CN_F32, 8, 2, 128, 3000, 1);
    check_attention(CN_BF16, 4, 2, 64, 1023, 5);
    check_attention(CN_F32, 4, 1, 32, 511, 2);
    check_attention(CN_F32, 16, 4, 16, 200, 130); /* T * Hq past the split limit: one pass */
    /* the split kernel's head batches: nano's group of 16, a group of 20 (a batch of 16 and one
     * of 4), head_dim 256 and one not a multiple of 4 */
    check_attention(CN_F32, 32, 2, 128, 8191, 1);
    check_attention(CN_BF16, 40, 2, 64, 700, 3);
    check_attention(CN_F32, 4, 2, 256, 100, 2);
    check_attention(CN_F32, 6, 3, 42, 90, 1);
    /* blocks of more chunks than key groups (few spans: many queries share the device), so a
     * group refills its tiles: 8 chunks a block of four groups, 7-8 a block of two (head_dim
     * 256) */
    check_attention(CN_F32, 8, 2, 128, 1000, 16);
    check_attention(CN_F32, 4, 2, 256, 2000, 8);
    check_attention(CN_BF16, 8, 2, 64, 1500, 12);
    /* prefill on tensor cores (head_dim 64 / 128): several query tiles, a last one partly past T,
     * key tiles partly past a tile's last query, GQA groups */
    check_attention(CN_F32, 32, 2, 128, 300, 100);
    check_attention(CN_F32, 16, 16, 64, 0, 150);
    check_attention(CN_BF16, 16, 4, 64, 37, 130);
    check_attention(CN_F16, 32, 8, 128, 5, 70);
}

/* tie: every logit equal, so without a bias the ranking is by index alone. */
static void check_route(int T, int E, int K, int n_group, int topk_group, int use_bias, int tie) {
    pv lg = pv_make(T, E, 2, tie ? 0.75f : -4, tie ? 0.75f : 4), wt = pv_make(T, K, 1, 0, 0), bias = vec_make(E, -0.5f, 0.5f);
    int32_t *zero = calloc((size_t)(T * K), sizeof *zero);
    pid ids = pid_make(T, K, zero);
    cn_route_args a = {.top_k = K, .n_group = n_group, .topk_group = topk_group, .norm_topk = 1,
                       .scaling = 2.5f};
    assert_int_equal(cn_op_moe_route(g_cpu, &ids.c, &wt.c, &lg.c, use_bias ? &bias.c : NULL, &a), 0);
    assert_int_equal(cn_op_moe_route(g_cu, &ids.g, &wt.g, &lg.g, use_bias ? &bias.g : NULL, &a), 0);
    int32_t *ic = malloc((size_t)(T * K) * sizeof *ic), *ig = malloc((size_t)(T * K) * sizeof *ig);
    assert_int_equal(cn_backend_download(g_cpu, ic, &ids.c), 0);
    assert_int_equal(cn_backend_download(g_cu, ig, &ids.g), 0);
    assert_memory_equal(ic, ig, (size_t)(T * K) * sizeof *ic);
    pv_expect("moe_route weights", &wt, TOL_EW);
    free(ic);
    free(ig);
    free(zero);
    pid_free(&ids);
    pv_free(&lg);
    pv_free(&wt);
    pv_free(&bias);
}

static void test_moe(void **st) {
    (void)st;
    check_route(13, 16, 4, 1, 1, 1, 0);
    check_route(13, 16, 4, 4, 2, 1, 0);
    check_route(5, 128, 6, 1, 1, 0, 0);
    check_route(7, 200, 8, 1, 1, 1, 0); /* more experts than the block's threads */
    check_route(3, 200, 8, 1, 1, 0, 1);
    check_route(3, 16, 4, 4, 2, 0, 1);
    const int64_t T = 11, k = 3, H = 50;
    pv rows = pv_make(T * k, H, 2, -2, 2), w = pv_make(T, k, 1, 0, 1), y = pv_make(T, H, 3, 0, 0);
    assert_int_equal(cn_op_moe_combine(g_cpu, &y.c, &rows.c, &w.c), 0);
    assert_int_equal(cn_op_moe_combine(g_cu, &y.g, &rows.g, &w.g), 0);
    pv_expect("moe_combine", &y, TOL_EW);
    pv_free(&rows);
    pv_free(&w);
    pv_free(&y);
}

/* ---------------------------------------------------------------- block-scaled weights */

/* An NVFP4 or MXFP8 weight [N, K]: host bytes and scales, the CUDA copy, and the dequantized
 * values in double for the reference (the CPU backend quantizes activations for NVFP4, so it is
 * not the reference here). */
typedef struct pq {
    cn_tensor g, gs;   /* CUDA weight and its block scales */
    double *deq;       /* [N, K] dequantized, global scale included */
    void *host, *hs;
} pq;

/* Fills *out in place: out->g.block_scale points at out->gs, so a pq never moves once made. */
static void pq_make(pq *out, cn_dtype dt, int64_t N, int64_t K) {
    pq q;
    const int64_t blk = dt == CN_NVFP4 ? 16 : 32;
    const size_t wbytes = (size_t)(dt == CN_NVFP4 ? N * K / 2 : N * K), sbytes = (size_t)(N * K / blk);
    uint8_t *w = malloc(wbytes), *sc = malloc(sbytes);
    q.deq = malloc((size_t)(N * K) * sizeof *q.deq);
    assert_true(w && sc && q.deq);
    for (size_t i = 0; i < wbytes; i++)
        w[i] = dt == CN_NVFP4 ? (uint8_t)unif(0, 255.999f) : cn_f32_to_e4m3(unif(-8, 8));
    for (size_t i = 0; i < sbytes; i++)
        sc[i] = dt == CN_NVFP4 ? cn_f32_to_e4m3(unif(0.25f, 4.0f)) : (uint8_t)unif(120, 131.999f);
    const float g = dt == CN_NVFP4 ? 0.05f : 1.0f;
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            double v, s = sc[n * (K / blk) + k / blk];
            if (dt == CN_NVFP4) {
                uint8_t p = w[n * (K / 2) + k / 2];
                v = cn_e2m1_to_f32(k % 2 ? p >> 4 : p & 15) * (double)cn_e4m3_to_f32((uint8_t)s) * g;
            } else {
                v = (double)cn_e4m3_to_f32(w[n * K + k]) * (double)cn_e8m0_to_f32((uint8_t)s);
            }
            q.deq[n * K + k] = v;
        }
    q.host = w;
    q.hs = sc;
    *out = q;
    out->gs = cn_tensor_2d(dt == CN_NVFP4 ? CN_F8_E4M3 : CN_U8, N, K / blk, sc);
    assert_int_equal(cn_backend_weight(g_cu, &out->gs), 0);
    out->g = cn_tensor_2d(dt, N, K, w);
    out->g.scale = g;
    out->g.block_scale = &out->gs;
    assert_int_equal(cn_backend_weight(g_cu, &out->g), 0);
}

static void pq_free(pq *q) {
    free(q->deq);
    free(q->host);
    free(q->hs);
}

/* max |y - x deq^T| / max |x deq^T| over the view y:[R, N] for x rows xr(r). */
static double pq_err(const pq *q, const pv *x, const pv *y, const int32_t *ids, int k) {
    float *xh = get(g_cu, &x->g), *yh = get(g_cu, &y->g);
    const int64_t N = y->C, K = x->C;
    double maxd = 0, maxr = 0;
    for (int64_t r = 0; r < y->T; r++) {
        const int64_t xr = ids && x->T != y->T ? r / k : r;
        const double *wb = ids ? q[ids[r]].deq : q->deq;
        for (int64_t n = 0; n < N; n++) {
            double ref = 0;
            for (int64_t kk = 0; kk < K; kk++) ref += wb[n * K + kk] * xh[xr * K + kk];
            maxd = fmax(maxd, fabs(ref - yh[r * N + n]));
            maxr = fmax(maxr, fabs(ref));
        }
    }
    free(xh);
    free(yh);
    return maxr > 0 ? maxd / maxr : maxd;
}

static void test_block_scaled(void **st) {
    (void)st;
    const cn_dtype dts[] = {CN_NVFP4, CN_MXFP8};
    const int64_t Ts[] = {1, 3, 8, 13, 40, 150}; /* 150: tiles of 128 rows and a tail */
    for (size_t d = 0; d < 2; d++)
        for (int64_t K = 256; K <= 288; K += 16) { /* NVFP4 272: rows not 16-byte vectors */
            if (dts[d] == CN_MXFP8 && K % 32) continue;
            for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
                const int64_t T = Ts[i], N = 70;
                pq w;
                pq_make(&w, dts[d], N, K);
                pv x = pv_make(T, K, 3, -1, 1), y = pv_make(T, N, 2, 0, 0);
                assert_int_equal(cn_op_matmul(g_cu, &y.g, &w.g, &x.g), 0);
                double e = pq_err(&w, &x, &y, NULL, 1);
                if (!(e <= (dts[d] == CN_NVFP4 ? TOL_FP4 : TOL_MM))) {
                    print_error("matmul %s T=%lld K=%lld: rel err %.3g\n", cn_dtype_name(dts[d]),
                                (long long)T, (long long)K, e);
                    fail();
                }
                pv_free(&x);
                pv_free(&y);
                pq_free(&w);
            }
        }
    /* one x row over many weight rows (the decode GEMV's K split over 4, 2 and 1 warps) */
    const int64_t Ns[] = {5000, 9000, 17000};
    for (size_t d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof Ns / sizeof Ns[0]; i++) {
            pq w;
            pq_make(&w, dts[d], Ns[i], 256);
            pv x = pv_make(1, 256, 3, -1, 1), y = pv_make(1, Ns[i], 2, 0, 0);
            assert_int_equal(cn_op_matmul(g_cu, &y.g, &w.g, &x.g), 0);
            double e = pq_err(&w, &x, &y, NULL, 1);
            if (!(e <= (dts[d] == CN_NVFP4 ? TOL_FP4 : TOL_MM))) {
                print_error("matmul %s T=1 N=%lld: rel err %.3g\n", cn_dtype_name(dts[d]),
                            (long long)Ns[i], e);
                fail();
            }
            pv_free(&x);
            pv_free(&y);
            pq_free(&w);
        }
    /* gathered experts: the gather GEMV (T*k <= 32) and the sorted tiles */
    enum { NW = 5 };
    const int64_t cases[][2] = {{1, 3}, {11, 3}, {60, 3}, {130, 3}}; /* 130x3: 78 rows per expert */
    for (size_t d = 0; d < 2; d++)
        for (size_t ci = 0; ci < 4; ci++) {
            const int64_t T = cases[ci][0], k = cases[ci][1], K = 256, N = 48;
            pq ws[NW];
            const cn_tensor *wg[NW];
            for (int e = 0; e < NW; e++) {
                pq_make(&ws[e], dts[d], N, K);
                wg[e] = &ws[e].g;
            }
            int32_t ids[512];
            for (int64_t i = 0; i < T * k; i++) ids[i] = (int32_t)unif(0, NW - 0.001f);
            pid id = pid_make(T, k, ids);
            pv x = pv_make(T, K, 3, -1, 1), y = pv_make(T * k, N, 1, 0, 0);
            assert_int_equal(cn_op_matmul_gather(g_cu, &y.g, wg, NW, &x.g, &id.g), 0);
            double e = pq_err(ws, &x, &y, ids, (int)k);
            if (!(e <= (dts[d] == CN_NVFP4 ? TOL_FP4 : TOL_MM))) {
                print_error("matmul_gather %s T=%lld: rel err %.3g\n", cn_dtype_name(dts[d]), (long long)T, e);
                fail();
            }
            pid_free(&id);
            pv_free(&x);
            pv_free(&y);
            for (int e2 = 0; e2 < NW; e2++) pq_free(&ws[e2]);
        }
}

/* ---------------------------------------------------------------- fused decode ops */

/* argmax against the CPU's exactly: random rows of a vocabulary's width, ties, NaN and inf. */
static void test_argmax(void **st) {
    (void)st;
    const int64_t T = 5, N = 131072;
    pv x = pv_make(T, N, 3, -8, 8);
    float *h = malloc((size_t)(T * x.W) * sizeof(float));
    assert_non_null(h);
    assert_int_equal(cn_backend_download(g_cpu, h, &x.cp), 0);
    float *r1 = h + x.W + x.off, *r2 = h + 2 * x.W + x.off, *r3 = h + 3 * x.W + x.off;
    r1[100] = 20.0f; /* row 1: a tie across the row, and NaN/inf */
    r1[N - 7] = 20.0f;
    r1[5] = NAN;
    r1[900] = INFINITY;
    r1[800] = FLT_MAX;
    for (int64_t c = 0; c < N; c++) r2[c] = c % 3 ? -INFINITY : NAN; /* row 2: nothing */
    for (int64_t c = 0; c < N; c++) r3[c] = -INFINITY;
    r3[N - 1] = -3.0f; /* row 3: only the last column */
    const uint64_t n = (uint64_t)(T * x.W) * sizeof(float);
    assert_int_equal(cn_backend_upload(g_cpu, &x.cp, 0, h, n), 0);
    assert_int_equal(cn_backend_upload(g_cu, &x.gp, 0, h, n), 0);
    free(h);
    int32_t zero[5] = {0};
    pid ids = pid_make(T, 1, zero);
    assert_int_equal(cn_op_argmax(g_cpu, &ids.c, &x.c), 0);
    assert_int_equal(cn_op_argmax(g_cu, &ids.g, &x.g), 0);
    int32_t a[5], b[5];
    memcpy(a, ids.c.data, sizeof a);
    assert_int_equal(cn_backend_download(g_cu, b, &ids.g), 0);
    assert_memory_equal(a, b, sizeof a);
    assert_int_equal(b[1], 800);
    assert_int_equal(b[2], 0);
    assert_int_equal(b[3], N - 1);
    pid_free(&ids);
    pv_free(&x);
    /* many short rows (several launches of 256 rows), and one row longer than 256 spans of 2048;
     * twice each, so the per-row counters are seen to reset */
    const int64_t shapes[][2] = {{300, 37}, {1, 600001}};
    for (int i = 0; i < 2; i++) {
        const int64_t R = shapes[i][0], C = shapes[i][1];
        pv y = pv_make(R, C, 2, -1, 1);
        int32_t *want = calloc((size_t)R, sizeof *want), *got = calloc((size_t)R, sizeof *got);
        assert_true(want && got);
        pid yi = pid_make(R, 1, want);
        assert_int_equal(cn_op_argmax(g_cpu, &yi.c, &y.c), 0);
        memcpy(want, yi.c.data, (size_t)R * sizeof *want);
        for (int rep = 0; rep < 2; rep++) {
            assert_int_equal(cn_op_argmax(g_cu, &yi.g, &y.g), 0);
            assert_int_equal(cn_backend_download(g_cu, got, &yi.g), 0);
            assert_memory_equal(want, got, (size_t)R * sizeof *want);
        }
        free(want);
        free(got);
        pid_free(&yi);
        pv_free(&y);
    }
}

/* moe_route_ep against the CPU's rmsnorm, router matmul and moe_route: the same experts, logits
 * and weights within the GEMV's and the router's tolerances. Gate rows past a block's 8 (E = 100),
 * a K that leaves the staged x smaller than the routing's scratch, with and without the norm and
 * the bias. Shapes it does not fuse are refused untouched. */
static void check_route_ep(int64_t E, int64_t K, int k, int use_bias, int norm) {
    pw gate = pw_make(CN_F32, E, K, 1.0f / sqrtf((float)K));
    pv nw = vec_make(K, 0.5f, 1.5f), bias = vec_make(E, -0.5f, 0.5f);
    pv x = pv_make(1, K, 3, -2, 2), xn = pv_make(1, K, 0, 0, 0);
    pv lg = pv_make(1, E, 2, 0, 0), wt = pv_make(1, k, 1, 0, 0);
    int32_t zero[16] = {0};
    pid ids = pid_make(1, k, zero);
    const cn_route_args a = {.top_k = k, .n_group = 1, .topk_group = 1, .norm_topk = 1,
                             .scaling = 2.5f};
    const cn_tensor *xin = &x.c;
    if (norm) {
        assert_int_equal(cn_op_rmsnorm(g_cpu, &xn.c, &x.c, &nw.c, 1e-5f), 0);
        xin = &xn.c;
    }
    assert_int_equal(cn_op_matmul(g_cpu, &lg.c, &gate.c, xin), 0);
    assert_int_equal(cn_op_moe_route(g_cpu, &ids.c, &wt.c, &lg.c, use_bias ? &bias.c : NULL, &a), 0);
    const cn_mm_ep f = {.norm = norm ? &nw.g : NULL, .eps = 1e-5f};
    assert_int_equal(cn_op_moe_route_ep(g_cu, &ids.g, &wt.g, &lg.g, &gate.g, &x.g, &f,
                                        use_bias ? &bias.g : NULL, &a),
                     0);
    int32_t ic[16], ig[16];
    assert_int_equal(cn_backend_download(g_cpu, ic, &ids.c), 0);
    assert_int_equal(cn_backend_download(g_cu, ig, &ids.g), 0);
    assert_memory_equal(ic, ig, (size_t)k * sizeof *ic);
    char what[80];
    snprintf(what, sizeof what, "moe_route_ep logits E=%lld K=%lld norm=%d", (long long)E,
             (long long)K, norm);
    pv_expect(what, &lg, TOL_MM);
    pv_expect("moe_route_ep weights", &wt, TOL_MM);
    pid_free(&ids);
    pv_free(&x);
    pv_free(&xn);
    pv_free(&lg);
    pv_free(&wt);
    pv_free(&nw);
    pv_free(&bias);
    pw_free(&gate);
}

static void test_route_ep(void **st) {
    (void)st;
    check_route_ep(128, 2688, 6, 1, 1); /* nano's router */
    check_route_ep(100, 256, 8, 0, 1);
    check_route_ep(16, 64, 4, 1, 0);
    check_route_ep(40, 4096, 4, 1, 1); /* the largest K fused: every register of x and gate used */
    {                                  /* refused: K past that (the unfused path serves it) */
        pw wide = pw_make(CN_F32, 16, 4160, 0.01f);
        pv xw = pv_make(1, 4160, 0, -1, 1), lw = pv_make(1, 16, 0, 0, 0), ww = pv_make(1, 4, 0, 0, 0);
        int32_t z4[4] = {0};
        pid iw = pid_make(1, 4, z4);
        const cn_mm_ep fw = {.eps = 1e-5f};
        const cn_route_args aw = {.top_k = 4, .n_group = 1, .topk_group = 1, .norm_topk = 1,
                                  .scaling = 1};
        assert_int_equal(cn_op_moe_route_ep(g_cu, &iw.g, &ww.g, &lw.g, &wide.g, &xw.g, &fw, NULL, &aw),
                         CN_EUNSUPPORTED);
        pid_free(&iw);
        pv_free(&xw);
        pv_free(&lw);
        pv_free(&ww);
        pw_free(&wide);
    }
    /* refused: two tokens, group limiting */
    pw gate = pw_make(CN_F32, 16, 64, 0.1f);
    pv x = pv_make(2, 64, 0, -1, 1), lg = pv_make(2, 16, 0, 0, 0), wt = pv_make(2, 4, 0, 0, 0);
    int32_t zero[8] = {0};
    pid ids = pid_make(2, 4, zero);
    const cn_mm_ep f = {.eps = 1e-5f};
    cn_route_args a = {.top_k = 4, .n_group = 1, .topk_group = 1, .norm_topk = 1, .scaling = 1};
    assert_int_equal(cn_op_moe_route_ep(g_cu, &ids.g, &wt.g, &lg.g, &gate.g, &x.g, &f, NULL, &a),
                     CN_EUNSUPPORTED);
    cn_tensor x1 = cn_tensor_rows(&x.g, 0, 1), l1 = cn_tensor_rows(&lg.g, 0, 1);
    cn_tensor i1 = cn_tensor_rows(&ids.g, 0, 1), w1 = cn_tensor_rows(&wt.g, 0, 1);
    a.n_group = 4;
    a.topk_group = 2;
    assert_int_equal(cn_op_moe_route_ep(g_cu, &i1, &w1, &l1, &gate.g, &x1, &f, NULL, &a),
                     CN_EUNSUPPORTED);
    a.top_k = 17; /* more than E */
    assert_int_equal(cn_op_moe_route_ep(g_cu, &i1, &w1, &l1, &gate.g, &x1, &f, NULL, &a), CN_EINVAL);
    pid_free(&ids);
    pv_free(&x);
    pv_free(&lg);
    pv_free(&wt);
    pw_free(&gate);
}

/* matmul_ep against the CPU's rmsnorm, matmul, then relu2 / add, on the decode GEMV's shapes (one
 * row; N small and large, so K is split over 8 warps and over 1), with and without the norm.
 * Other shapes are refused untouched. */
static void test_matmul_ep(void **st) {
    (void)st;
    assert_true(cn_backend_has_matmul_ep(g_cu));
    const int64_t K = 256, Ns[] = {150, 17000};
    pv nw = vec_make(K, 0.5f, 1.5f);
    for (size_t d = 0; d < sizeof k_wdt / sizeof k_wdt[0]; d++)
        for (size_t i = 0; i < 2; i++)
            for (int ep = 0; ep <= CN_EP_ACC; ep++)
                for (int norm = 0; norm < 2; norm++) {
                    if (!ep && !norm) continue;
                    const int64_t N = Ns[i];
                    pw w = pw_make(k_wdt[d], N, K, 0.5f);
                    pv x = pv_make(1, K, 3, -2, 2), y = pv_make(1, N, 2, -3, 3);
                    pv t = pv_make(1, N, 0, 0, 0), xn = pv_make(1, K, 0, 0, 0);
                    const cn_tensor *xin = &x.c;
                    if (norm) {
                        assert_int_equal(cn_op_rmsnorm(g_cpu, &xn.c, &x.c, &nw.c, 1e-5f), 0);
                        xin = &xn.c;
                    }
                    assert_int_equal(cn_op_matmul(g_cpu, ep ? &t.c : &y.c, &w.c, xin), 0);
                    if (ep == CN_EP_RELU2) assert_int_equal(cn_op_relu2(g_cpu, &y.c, &t.c), 0);
                    if (ep == CN_EP_ACC) assert_int_equal(cn_op_add(g_cpu, &y.c, &y.c, &t.c), 0);
                    const cn_mm_ep f = {.ep = ep, .norm = norm ? &nw.g : NULL, .eps = 1e-5f};
                    assert_int_equal(cn_op_matmul_ep(g_cu, &y.g, &w.g, &x.g, &f), 0);
                    char what[80];
                    snprintf(what, sizeof what, "matmul_ep ep=%d norm=%d %s N=%lld", ep, norm,
                             cn_dtype_name(k_wdt[d]), (long long)N);
                    pv_expect(what, &y, TOL_MM);
                    pv_free(&x);
                    pv_free(&y);
                    pv_free(&t);
                    pv_free(&xn);
                    pw_free(&w);
                }
    /* the gated grouped norm (Mamba's, before out_proj) with the residual add */
    const int64_t KG = 1024, groups[] = {512, 1024};
    pv gnw = vec_make(KG, 0.5f, 1.5f);
    for (size_t d = 0; d < sizeof k_wdt / sizeof k_wdt[0]; d++)
        for (size_t i = 0; i < 2; i++) {
            const int64_t N = i ? 5000 : 150, G = groups[i];
            pw w = pw_make(k_wdt[d], N, KG, 0.2f);
            pv x = pv_make(1, KG, 3, -2, 2), z = pv_make(1, KG, 1, -3, 3), y = pv_make(1, N, 2, -3, 3);
            pv t = pv_make(1, N, 0, 0, 0), g = pv_make(1, KG, 0, 0, 0);
            assert_int_equal(cn_op_gated_rmsnorm(g_cpu, &g.c, &x.c, &z.c, &gnw.c, (int)G, 1e-5f), 0);
            assert_int_equal(cn_op_matmul(g_cpu, &t.c, &w.c, &g.c), 0);
            assert_int_equal(cn_op_add(g_cpu, &y.c, &y.c, &t.c), 0);
            const cn_mm_ep f = {.ep = CN_EP_ACC, .norm = &gnw.g, .gate = &z.g, .group = (int)G,
                                .eps = 1e-5f};
            assert_int_equal(cn_op_matmul_ep(g_cu, &y.g, &w.g, &x.g, &f), 0);
            char what[80];
            snprintf(what, sizeof what, "matmul_ep gated %s N=%lld group=%lld", cn_dtype_name(k_wdt[d]),
                     (long long)N, (long long)G);
            pv_expect(what, &y, TOL_MM);
            /* groups the staging does not take: refused */
            const cn_mm_ep f128 = {.ep = CN_EP_ACC, .norm = &gnw.g, .gate = &z.g, .group = 128};
            assert_int_equal(cn_op_matmul_ep(g_cu, &y.g, &w.g, &x.g, &f128), CN_EUNSUPPORTED);
            pv_free(&x);
            pv_free(&z);
            pv_free(&y);
            pv_free(&t);
            pv_free(&g);
            pw_free(&w);
        }
    pv_free(&gnw);
    /* two rows: refused, nothing written; an unknown epilogue or a norm of the wrong width: EINVAL */
    pw w = pw_make(CN_BF16, 40, K, 0.5f);
    pv x = pv_make(2, K, 0, -1, 1), y = pv_make(2, 40, 1, 5, 5);
    pv nshort = vec_make(K - 1, 1, 1);
    float *before = get(g_cu, &y.gp);
    const cn_mm_ep acc = {.ep = CN_EP_ACC}, bad = {.ep = 3}, badn = {.norm = &nshort.g};
    assert_int_equal(cn_op_matmul_ep(g_cu, &y.g, &w.g, &x.g, &acc), CN_EUNSUPPORTED);
    assert_int_equal(cn_op_matmul_ep(g_cu, &y.g, &w.g, &x.g, &bad), CN_EINVAL);
    assert_int_equal(cn_op_matmul_ep(g_cu, &y.g, &w.g, &x.g, &badn), CN_EINVAL);
    float *after = get(g_cu, &y.gp);
    assert_memory_equal(before, after, (size_t)(y.T * y.W) * sizeof(float));
    free(before);
    free(after);
    pv_free(&x);
    pv_free(&y);
    pv_free(&nshort);
    pv_free(&nw);
    pw_free(&w);
}

/* matmul_gather_ep against the CPU's gather then relu2, or gather, moe_combine and add: one
 * token's k experts and a few tokens' (the combining counters per token), twice in a row and
 * inside a step (the counters reset themselves: the same bits every time); a bad id gives
 * CN_EINVAL with y untouched, and the next call is right again. */
static void test_matmul_gather_ep(void **st) {
    (void)st;
    enum { NW = 8 };
    const int64_t K = 256, cases[][3] = {{1, 6, 300}, {1, 6, 2688}, {3, 4, 90}}; /* T, k, N */
    for (size_t d = 0; d < sizeof k_wdt / sizeof k_wdt[0]; d++)
        for (size_t ci = 0; ci < 3; ci++) {
            const int64_t T = cases[ci][0], k = cases[ci][1], N = cases[ci][2];
            pw ws[NW];
            const cn_tensor *wc[NW], *wg[NW];
            for (int e = 0; e < NW; e++) {
                ws[e] = pw_make(k_wdt[d], N, K, 0.5f);
                wc[e] = &ws[e].c;
                wg[e] = &ws[e].g;
            }
            int32_t ids[32];
            for (int64_t i = 0; i < T * k; i++) ids[i] = (int32_t)((i * 5 + 3) % NW); /* distinct per token */
            pid id = pid_make(T, k, ids);
            char what[80];
            /* relu2 on every row, x per token (normalised on the way in or not) and per row */
            pv nw = vec_make(K, 0.5f, 1.5f);
            for (int per_row = 0; per_row < 3; per_row++) {
                const int norm = per_row == 2;
                pv x = pv_make(per_row == 1 ? T * k : T, K, 3, -1, 1), e = pv_make(T * k, N, 1, 0, 0);
                pv xn = pv_make(x.T, K, 0, 0, 0);
                if (norm) assert_int_equal(cn_op_rmsnorm(g_cpu, &xn.c, &x.c, &nw.c, 1e-6f), 0);
                assert_int_equal(cn_op_matmul_gather(g_cpu, &e.c, wc, NW, norm ? &xn.c : &x.c, &id.c), 0);
                assert_int_equal(cn_op_relu2(g_cpu, &e.c, &e.c), 0);
                const cn_mm_ep f = {.ep = CN_EP_RELU2, .norm = norm ? &nw.g : NULL, .eps = 1e-6f};
                assert_int_equal(cn_op_matmul_gather_ep(g_cu, &e.g, wg, NW, &x.g, &id.g, &f), 0);
                snprintf(what, sizeof what, "gather_ep relu2 %s T=%lld k=%lld N=%lld x=%d",
                         cn_dtype_name(k_wdt[d]), (long long)T, (long long)k, (long long)N, per_row);
                pv_expect(what, &e, TOL_MM);
                pv_free(&x);
                pv_free(&xn);
                pv_free(&e);
            }
            pv_free(&nw);
            /* combined into the residual */
            pv x = pv_make(T * k, K, 3, -1, 1), rw = pv_make(T, k, 1, 0, 1);
            pv y = pv_make(T, N, 2, -3, 3), y2 = pv_make(T, N, 2, -3, 3);
            pv eo = pv_make(T * k, N, 0, 0, 0), sum = pv_make(T, N, 0, 0, 0);
            assert_int_equal(cn_op_matmul_gather(g_cpu, &eo.c, wc, NW, &x.c, &id.c), 0);
            assert_int_equal(cn_op_moe_combine(g_cpu, &sum.c, &eo.c, &rw.c), 0);
            assert_int_equal(cn_op_add(g_cpu, &y.c, &y.c, &sum.c), 0);
            float *y_init = get(g_cu, &y.gp);
            const cn_mm_ep comb = {.ep = CN_EP_ACC, .weights = &rw.g};
            assert_int_equal(cn_op_matmul_gather_ep(g_cu, &y.g, wg, NW, &x.g, &id.g, &comb), 0);
            snprintf(what, sizeof what, "gather_ep acc %s T=%lld k=%lld N=%lld", cn_dtype_name(k_wdt[d]),
                     (long long)T, (long long)k, (long long)N);
            pv_expect(what, &y, TOL_MM);
            float *first = get(g_cu, &y.g);
            /* a bad id: refused, nothing written */
            int32_t bad_ids[32];
            memcpy(bad_ids, ids, sizeof bad_ids);
            bad_ids[T * k - 1] = NW;
            pid bad = pid_make(T, k, bad_ids);
            float *before = get(g_cu, &y2.gp);
            assert_int_equal(cn_op_matmul_gather_ep(g_cu, &y2.g, wg, NW, &x.g, &bad.g, &comb), CN_EINVAL);
            float *after = get(g_cu, &y2.gp);
            assert_memory_equal(before, after, (size_t)(y2.T * y2.W) * sizeof(float));
            /* again into y2 (same start as y), eagerly, then inside a step: the same bits */
            for (int in_step = 0; in_step < 2; in_step++) {
                assert_int_equal(cn_backend_upload(g_cu, &y2.gp, 0, y_init, (uint64_t)(y2.T * y2.W) * 4), 0);
                if (in_step) assert_int_equal(cn_backend_step_begin(g_cu, 9), 0);
                int rc = cn_op_matmul_gather_ep(g_cu, &y2.g, wg, NW, &x.g, &id.g, &comb);
                if (in_step) assert_int_equal(cn_backend_step_end(g_cu, rc == 0), 0);
                assert_int_equal(rc, 0);
                float *again = get(g_cu, &y2.g);
                assert_memory_equal(first, again, (size_t)(T * N) * sizeof(float));
                free(again);
            }
            free(y_init);
            free(before);
            free(after);
            free(first);
            pid_free(&bad);
            pv_free(&x);
            pv_free(&rw);
            pv_free(&y);
            pv_free(&y2);
            pv_free(&eo);
            pv_free(&sum);
            pid_free(&id);
            for (int e = 0; e < NW; e++) pw_free(&ws[e]);
        }
}

/* The NVFP4 decode GEMV's fused forms (norm in; relu2, add or combine out; the gated norm; x far
 * from 1, a NaN in x) against a double reference from the dequantized weights: the CPU backend
 * rounds NVFP4 activations to one int8 term, so it is no reference at this tolerance. */

/* ref[r][n] = dot(deq of expert ids[r] (or q), xin[r / k or r]) for R rows; returns max |ref|. */
static double fp4_ref(const pq *q, const int32_t *ids, int k, const double *xin, int x_per_token,
                      int64_t R, int64_t N, int64_t K, double *ref) {
    double m = 0;
    for (int64_t r = 0; r < R; r++) {
        const double *wb = ids ? q[ids[r]].deq : q->deq, *xr = xin + (x_per_token ? r / k : r) * K;
        for (int64_t n = 0; n < N; n++) {
            double a = 0;
            for (int64_t kk = 0; kk < K; kk++) a += wb[n * K + kk] * xr[kk];
            ref[r * N + n] = a;
            m = fmax(m, fabs(a));
        }
    }
    return m;
}

/* x rows [R, K] in double, RMS-normalised with weight nw (NULL: as they are), or gated:
 * x silu(z) normalised per group of G. */
static double *fp4_xin(const pv *x, const pv *nw, const pv *z, int64_t G, double eps) {
    float *xh = get(g_cu, &x->g), *nh = nw ? get(g_cu, &nw->g) : NULL, *zh = z ? get(g_cu, &z->g) : NULL;
    const int64_t R = x->T, K = x->C;
    double *o = malloc((size_t)(R * K) * sizeof *o);
    assert_non_null(o);
    for (int64_t r = 0; r < R; r++) {
        for (int64_t i = 0; i < K; i++)
            o[r * K + i] = zh ? xh[r * K + i] * (zh[i] / (1.0 + exp(-(double)zh[i]))) : xh[r * K + i];
        const int64_t g = zh ? G : K;
        for (int64_t b = 0; nh && b < K; b += g) {
            double ss = 0;
            for (int64_t i = b; i < b + g; i++) ss += o[r * K + i] * o[r * K + i];
            const double inv = 1.0 / sqrt(ss / (double)g + eps);
            for (int64_t i = b; i < b + g; i++) o[r * K + i] *= inv * nh[i];
        }
    }
    free(xh);
    free(nh);
    free(zh);
    return o;
}

/* max |y - want| / scale over y's view, where want = ep(ref) (+ y0 for acc). */
static void fp4_expect(const char *what, const pv *y, const float *y0, const double *ref, double scale,
                       int ep) {
    float *yh = get(g_cu, &y->g);
    double e = 0;
    for (int64_t i = 0; i < y->T * y->C; i++) {
        double want = ref[i];
        if (ep == CN_EP_RELU2) want = want > 0 ? want * want : 0;
        if (ep == CN_EP_ACC) want += y0[i];
        e = fmax(e, fabs(yh[i] - want) / scale);
    }
    if (!(e <= TOL_FP4)) {
        print_error("%s: rel err %.3g > %.1g\n", what, e, TOL_FP4);
        fail();
    }
    free(yh);
}

static void test_fp4_ep(void **st) {
    (void)st;
    const int64_t K = 1024;
    pv nw = vec_make(K, 0.5f, 1.5f);
    char what[96];
    /* dense: norm + relu2, norm + add, the gated norm + add, and x far past fp16's range */
    for (int64_t N = 150; N <= 5000; N += 4850)
        for (int c = 0; c < 4; c++) {
            pq w;
            pq_make(&w, CN_NVFP4, N, K);
            const float big = c == 3 ? 3e5f : 2.0f;
            pv x = pv_make(1, K, 3, -big, big), z = pv_make(1, K, 1, -3, 3), y = pv_make(1, N, 2, -3, 3);
            float *y0 = get(g_cu, &y.g);
            const int ep = c == 0 ? CN_EP_RELU2 : c == 3 ? 0 : CN_EP_ACC;
            double *xin = fp4_xin(&x, c == 3 ? NULL : &nw, c == 2 ? &z : NULL, 512, 1e-5);
            double *ref = malloc((size_t)N * sizeof *ref);
            assert_non_null(ref);
            double m = fp4_ref(&w, NULL, 1, xin, 0, 1, N, K, ref);
            const cn_mm_ep f = {.ep = ep, .norm = c == 3 ? NULL : &nw.g, .gate = c == 2 ? &z.g : NULL,
                                .group = c == 2 ? 512 : 0, .eps = 1e-5f};
            if (c == 3) assert_int_equal(cn_op_matmul(g_cu, &y.g, &w.g, &x.g), 0);
            else assert_int_equal(cn_op_matmul_ep(g_cu, &y.g, &w.g, &x.g, &f), 0);
            snprintf(what, sizeof what, "fp4 N=%lld case %d", (long long)N, c);
            fp4_expect(what, &y, y0, ref, ep == CN_EP_RELU2 ? m * m : m, ep);
            free(y0);
            free(xin);
            free(ref);
            pv_free(&x);
            pv_free(&z);
            pv_free(&y);
            pq_free(&w);
        }
    /* a NaN in x reaches every output, as in the fp32 product (its block's scale carries it) */
    {
        pq w;
        pq_make(&w, CN_NVFP4, 64, K);
        pv x = pv_make(1, K, 3, -1, 1), y = pv_make(1, 64, 2, -3, 3);
        float *xb = get(g_cu, &x.gp);
        xb[x.off + 37] = NAN;
        assert_int_equal(cn_backend_upload(g_cu, &x.gp, 0, xb, (uint64_t)x.W * sizeof(float)), 0);
        assert_int_equal(cn_op_matmul(g_cu, &y.g, &w.g, &x.g), 0);
        float *yh = get(g_cu, &y.g);
        for (int64_t n = 0; n < 64; n++) assert_true(isnan(yh[n]));
        free(yh);
        free(xb);
        pv_free(&x);
        pv_free(&y);
        pq_free(&w);
    }
    /* gathered: a token's 6 of 8 experts with relu2 (x normalised per token), then combined
     * into the residual from per-row x; K = 1856 ends in a partial super-step */
    const int64_t KE = 1856;
    pv nwe = vec_make(KE, 0.5f, 1.5f);
    enum { NW = 8 };
    const int64_t T = 1, k = 6, N = 300;
    pq ws[NW];
    const cn_tensor *wg[NW];
    for (int e = 0; e < NW; e++) {
        pq_make(&ws[e], CN_NVFP4, N, KE);
        wg[e] = &ws[e].g;
    }
    int32_t ids[6] = {3, 0, 7, 5, 1, 6};
    pid id = pid_make(T, k, ids);
    double *ref = malloc((size_t)(T * k * N) * sizeof *ref);
    assert_non_null(ref);
    pv x = pv_make(T, KE, 3, -1, 1), e = pv_make(T * k, N, 1, 0, 0);
    double *xin = fp4_xin(&x, &nwe, NULL, 0, 1e-6);
    double m = fp4_ref(ws, ids, (int)k, xin, 1, T * k, N, KE, ref);
    const cn_mm_ep f = {.ep = CN_EP_RELU2, .norm = &nwe.g, .eps = 1e-6f};
    assert_int_equal(cn_op_matmul_gather_ep(g_cu, &e.g, wg, NW, &x.g, &id.g, &f), 0);
    fp4_expect("fp4 gather relu2", &e, NULL, ref, m * m, CN_EP_RELU2);
    free(xin);
    pv xr = pv_make(T * k, KE, 3, -1, 1), rw = pv_make(T, k, 1, 0, 1), y = pv_make(T, N, 2, -3, 3);
    float *y0 = get(g_cu, &y.g), *rwh = get(g_cu, &rw.g);
    xin = fp4_xin(&xr, NULL, NULL, 0, 0);
    m = fp4_ref(ws, ids, (int)k, xin, 0, T * k, N, KE, ref);
    double *comb = calloc((size_t)(T * N), sizeof *comb);
    assert_non_null(comb);
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < k; j++) comb[n] += rwh[j] * ref[j * N + n];
    const cn_mm_ep acc = {.ep = CN_EP_ACC, .weights = &rw.g};
    assert_int_equal(cn_op_matmul_gather_ep(g_cu, &y.g, wg, NW, &xr.g, &id.g, &acc), 0);
    fp4_expect("fp4 gather combine", &y, y0, comb, m, CN_EP_ACC);
    free(comb);
    free(xin);
    /* the router's kernel rewrites the ids just before the next gathered product, which must wait
     * for them; the product after that one may read them before its enter (settled ids:
     * cu_gemv_fp4), as a MoE's down product does. The ids were 3 0 7 5 1 6; these logits rank
     * 7 6 5 4 3 2. Read early from a kernel still running, the old ids would give other rows. */
    {
        pv lg = pv_make(T, NW, 0, 0, 0), rw2 = pv_make(T, k, 0, 0, 0);
        pv e2 = pv_make(T * k, N, 0, 0, 0), y2 = pv_make(T, N, 0, -3, 3);
        float lv[NW];
        for (int j = 0; j < NW; j++) lv[j] = 0.5f * (float)j - 2.0f;
        assert_int_equal(cn_backend_upload(g_cu, &lg.gp, 0, lv, sizeof lv), 0);
        float *y20 = get(g_cu, &y2.g);
        const cn_route_args ra = {.top_k = (int)k, .norm_topk = 1, .scaling = 1.0f};
        const cn_mm_ep acc2 = {.ep = CN_EP_ACC, .weights = &rw2.g};
        assert_int_equal(cn_op_moe_route(g_cu, &id.g, &rw2.g, &lg.g, NULL, &ra), 0);
        assert_int_equal(cn_op_matmul_gather_ep(g_cu, &e2.g, wg, NW, &x.g, &id.g, &f), 0);
        assert_int_equal(cn_op_matmul_gather_ep(g_cu, &y2.g, wg, NW, &xr.g, &id.g, &acc2), 0);
        int32_t routed[6];
        const int32_t want[6] = {7, 6, 5, 4, 3, 2};
        assert_int_equal(cn_backend_download(g_cu, routed, &id.g), 0);
        assert_memory_equal(routed, want, sizeof want);
        xin = fp4_xin(&x, &nwe, NULL, 0, 1e-6);
        m = fp4_ref(ws, routed, (int)k, xin, 1, T * k, N, KE, ref);
        fp4_expect("fp4 gather relu2 after the router", &e2, NULL, ref, m * m, CN_EP_RELU2);
        free(xin);
        xin = fp4_xin(&xr, NULL, NULL, 0, 0);
        m = fp4_ref(ws, routed, (int)k, xin, 0, T * k, N, KE, ref);
        float *w2 = get(g_cu, &rw2.g);
        comb = calloc((size_t)(T * N), sizeof *comb);
        assert_non_null(comb);
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = 0; j < k; j++) comb[n] += w2[j] * ref[j * N + n];
        fp4_expect("fp4 gather combine, settled ids", &y2, y20, comb, m, CN_EP_ACC);
        free(comb);
        free(xin);
        free(w2);
        free(y20);
        pv_free(&lg);
        pv_free(&rw2);
        pv_free(&e2);
        pv_free(&y2);
    }
    free(ref);
    free(y0);
    free(rwh);
    pv_free(&x);
    pv_free(&e);
    pv_free(&xr);
    pv_free(&rw);
    pv_free(&y);
    pid_free(&id);
    pv_free(&nw);
    pv_free(&nwe);
    for (int i = 0; i < NW; i++) pq_free(&ws[i]);
}

/* The ops of a decode-like step: x = emb[tok]; eh = relu2(experts(x)). */
static int step_ops(cn_backend *b, cn_tensor *x, cn_tensor *eh, const cn_tensor *emb,
                    const cn_tensor *const *ws, int nw, const cn_tensor *tok, const cn_tensor *eids) {
    int rc = cn_op_get_rows(b, x, emb, tok);
    if (!rc) rc = cn_op_matmul_gather(b, eh, ws, nw, x, eids);
    if (!rc) rc = cn_op_relu2(b, eh, eh);
    return rc;
}

/* Steps (backend.h): the same ops inside a step give the eager result bit for bit, also when the
 * next step writes other rows (a recording backend updates its graph in place); a bad id makes
 * step_end return CN_EINVAL with that op's output untouched; host transfers, allocation and a
 * nested begin are refused inside; a discarded step runs nothing when steps are recorded. */
static void test_step(void **st) {
    (void)st;
    enum { NW = 6 };
    const int64_t V = 40, H = 64, k = 2, I = 48;
    const char *genv = getenv("CAIRN_CUDA_GRAPHS");
    const int graphs = !(genv && !strcmp(genv, "0"));
    pw emb = pw_make(CN_BF16, V, H, 1.0f);
    pw ws[NW];
    const cn_tensor *wg[NW];
    for (int e = 0; e < NW; e++) {
        ws[e] = pw_make(CN_BF16, I, H, 0.5f);
        wg[e] = &ws[e].g;
    }
    int32_t tok_id[1] = {17}, eid[2] = {4, 1}, bad_eid[2] = {4, NW};
    pid tok = pid_make(1, 1, tok_id), eids = pid_make(1, k, eid), bad = pid_make(1, k, bad_eid);
    tok.g.ndim = 1;
    pv x = pv_make(4, H, 0, 0, 0), eh = pv_make(4 * k, I, 1, 0, 0);
    /* eager reference in rows 0..k-1 */
    cn_tensor x0 = cn_tensor_rows(&x.g, 0, 1), e0 = cn_tensor_rows(&eh.g, 0, k);
    assert_int_equal(step_ops(g_cu, &x0, &e0, &emb.g, wg, NW, &tok.g, &eids.g), 0);
    float *ref = get(g_cu, &e0);
    cn_cuda_stats s0, s1;
    assert_int_equal(cn_cuda_backend_stats(g_cu, &s0), 0);
    for (int r = 1; r <= 2; r++) { /* two steps, other rows: the second updates the first's graph */
        cn_tensor xr = cn_tensor_rows(&x.g, r, 1), er = cn_tensor_rows(&eh.g, r * k, k);
        assert_int_equal(cn_backend_step_begin(g_cu, 7), 0);
        assert_int_equal(step_ops(g_cu, &xr, &er, &emb.g, wg, NW, &tok.g, &eids.g), 0);
        assert_int_equal(cn_backend_step_end(g_cu, 1), 0);
        float *got = get(g_cu, &er);
        assert_memory_equal(got, ref, (size_t)(k * I) * sizeof(float));
        free(got);
    }
    assert_int_equal(cn_cuda_backend_stats(g_cu, &s1), 0);
    assert_int_equal(s1.steps - s0.steps, 2);
    if (graphs) {
        assert_int_equal(s1.instantiated - s0.instantiated, 1);
        assert_int_equal(s1.updated - s0.updated, 1);
    }
    /* a bad expert id: the verdict comes from step_end; the gather wrote nothing */
    cn_tensor x3 = cn_tensor_rows(&x.g, 3, 1), e3 = cn_tensor_rows(&eh.g, 3 * k, k);
    float *before = get(g_cu, &eh.gp);
    assert_int_equal(cn_backend_step_begin(g_cu, 7), 0);
    assert_int_equal(cn_op_get_rows(g_cu, &x3, &emb.g, &tok.g), 0);
    assert_int_equal(cn_op_matmul_gather(g_cu, &e3, wg, NW, &x3, &bad.g), 0);
    assert_int_equal(cn_backend_step_end(g_cu, 1), CN_EINVAL);
    float *after = get(g_cu, &eh.gp);
    assert_memory_equal(before, after, (size_t)(eh.T * eh.W) * sizeof(float));
    free(after);
    /* refusals inside a step; then a discarded step */
    float host[4] = {0};
    cn_tensor extra = cn_tensor_2d(CN_F32, 1, 4, NULL);
    assert_int_equal(cn_backend_step_begin(g_cu, 8), 0);
    assert_int_equal(cn_backend_step_begin(g_cu, 8), CN_EBUSY);
    assert_int_equal(cn_backend_upload(g_cu, &x.gp, 0, host, sizeof host), CN_EBUSY);
    assert_int_equal(cn_backend_download(g_cu, host, &x0), CN_EBUSY);
    assert_int_equal(cn_backend_sync(g_cu), CN_EBUSY);
    assert_int_equal(cn_backend_alloc(g_cu, &extra), CN_EBUSY);
    assert_int_equal(step_ops(g_cu, &x3, &e3, &emb.g, wg, NW, &tok.g, &eids.g), 0);
    assert_int_equal(cn_backend_step_end(g_cu, 0), 0);
    assert_int_equal(cn_backend_step_end(g_cu, 1), CN_EINVAL); /* no step open */
    after = get(g_cu, &eh.gp);
    if (graphs) assert_memory_equal(before, after, (size_t)(eh.T * eh.W) * sizeof(float));
    free(after);
    free(before);
    free(ref);
    pv_free(&x);
    pv_free(&eh);
    pid_free(&tok);
    pid_free(&eids);
    pid_free(&bad);
    pw_free(&emb);
    for (int e = 0; e < NW; e++) pw_free(&ws[e]);
}

/* Steps of one key whose graphs differ in shape: as many nodes, of other types in another order
 * (a copy, then an activation; then the activation, then the copy), and a strided copy (a 2D
 * memcpy node, which no update may change). Each graph of another shape, and each holding a 2D
 * copy, is instantiated; the same 1D shape again is updated; no update is attempted that fails
 * (compute-sanitizer reports each failure as an API error); every step gives the eager results
 * bit for bit. */
static void shape_ops(cn_backend *b, cn_tensor *y, cn_tensor *z, const cn_tensor *a, int copy_first) {
    if (copy_first) assert_int_equal(cn_backend_copy(b, y, a), 0);
    assert_int_equal(cn_op_relu2(b, z, a), 0);
    if (!copy_first) assert_int_equal(cn_backend_copy(b, y, a), 0);
}

static void test_step_shape(void **st) {
    (void)st;
    const char *genv = getenv("CAIRN_CUDA_GRAPHS");
    const int graphs = !(genv && !strcmp(genv, "0"));
    pv a = pv_make(3, 64, 0, -2.0f, 2.0f), ap = pv_make(3, 64, 4, -2.0f, 2.0f); /* ap: strided */
    pv y = pv_make(3, 64, 0, 0, 0), z = pv_make(3, 64, 0, 0, 0);
    pv ye = pv_make(3, 64, 0, 0, 0), ze = pv_make(3, 64, 0, 0, 0);
    static const int cases[][2] = {{1, 0}, {0, 0}, {0, 0}, {0, 1}, {0, 1}}; /* copy_first, strided */
    cn_cuda_stats s0, s1;
    assert_int_equal(cn_cuda_backend_stats(g_cu, &s0), 0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const cn_tensor *src = cases[i][1] ? &ap.g : &a.g;
        shape_ops(g_cu, &ye.g, &ze.g, src, cases[i][0]);
        float *yref = get(g_cu, &ye.g), *zref = get(g_cu, &ze.g);
        assert_int_equal(cn_backend_step_begin(g_cu, 11), 0);
        shape_ops(g_cu, &y.g, &z.g, src, cases[i][0]);
        assert_int_equal(cn_backend_step_end(g_cu, 1), 0);
        float *yg = get(g_cu, &y.g), *zg = get(g_cu, &z.g);
        assert_memory_equal(yg, yref, 3 * 64 * sizeof(float));
        assert_memory_equal(zg, zref, 3 * 64 * sizeof(float));
        free(yg);
        free(zg);
        free(yref);
        free(zref);
    }
    assert_int_equal(cn_cuda_backend_stats(g_cu, &s1), 0);
    if (graphs) {
        assert_int_equal(s1.instantiated - s0.instantiated, 4);
        assert_int_equal(s1.updated - s0.updated, 1);
    }
    assert_int_equal(s1.update_failed - s0.update_failed, 0);
    pv_free(&a);
    pv_free(&ap);
    pv_free(&y);
    pv_free(&z);
    pv_free(&ye);
    pv_free(&ze);
}

/* y1 = W1 x on the side lane beside y2 = W2 x on the main one, then y3 = y1 + y2 after the join
 * (backend.h lanes): the CPU's in-order result, eagerly and inside a step (which ends joined even
 * when the fork is left open), bit for bit the same both ways; the refusals. */
static void lane_ops(cn_backend *b, const cn_tensor *w1, const cn_tensor *w2, const cn_tensor *x,
                     cn_tensor *y1, cn_tensor *y2, cn_tensor *y3, int join) {
    assert_int_equal(cn_backend_fork(b), 0);
    assert_int_equal(cn_op_matmul(b, y1, w1, x), 0);
    assert_int_equal(cn_backend_back(b), 0);
    assert_int_equal(cn_op_matmul(b, y2, w2, x), 0);
    if (!join) return;
    assert_int_equal(cn_backend_join(b), 0);
    assert_int_equal(cn_op_add(b, y3, y1, y2), 0);
}

static void test_lanes(void **st) {
    (void)st;
    const int64_t K = 1024, N = 3072;
    pw w1 = pw_make(CN_BF16, N, K, 0.5f), w2 = pw_make(CN_BF16, N, K, 0.5f);
    /* one x row; y rows 0 (eager) and 1 (in a step) on CUDA, both in order on the CPU */
    pv x = pv_make(1, K, 3, -1, 1), y1 = pv_make(2, N, 2, 0, 0), y2 = pv_make(2, N, 2, 0, 0);
    pv y3 = pv_make(2, N, 2, 0, 0);
    cn_tensor r1[2], r2[2], r3[2], c1[2], c2[2], c3[2];
    for (int r = 0; r < 2; r++) {
        r1[r] = cn_tensor_rows(&y1.g, r, 1);
        r2[r] = cn_tensor_rows(&y2.g, r, 1);
        r3[r] = cn_tensor_rows(&y3.g, r, 1);
        c1[r] = cn_tensor_rows(&y1.c, r, 1);
        c2[r] = cn_tensor_rows(&y2.c, r, 1);
        c3[r] = cn_tensor_rows(&y3.c, r, 1);
        lane_ops(g_cpu, &w1.c, &w2.c, &x.c, &c1[r], &c2[r], &c3[r], 1); /* no lanes: in order */
    }
    lane_ops(g_cu, &w1.g, &w2.g, &x.g, &r1[0], &r2[0], &r3[0], 1);
    assert_int_equal(cn_backend_step_begin(g_cu, 12), 0);
    lane_ops(g_cu, &w1.g, &w2.g, &x.g, &r1[1], &r2[1], &r3[1], 1);
    assert_int_equal(cn_backend_step_end(g_cu, 1), 0);
    float *a = get(g_cu, &y3.g);
    assert_memory_equal(a, a + N, (size_t)N * sizeof(float)); /* row 1 (step) == row 0 (eager) */
    free(a);
    pv_expect("lanes y3", &y3, TOL_MM);
    /* refusals; a step left forked ends joined */
    assert_int_equal(cn_backend_join(g_cu), 0); /* nothing open */
    assert_int_equal(cn_backend_back(g_cu), 0);
    assert_int_equal(cn_backend_fork(g_cu), 0);
    assert_int_equal(cn_backend_fork(g_cu), CN_EBUSY);
    assert_int_equal(cn_backend_step_begin(g_cu, 12), CN_EBUSY);
    assert_int_equal(cn_backend_join(g_cu), 0);
    assert_int_equal(cn_backend_step_begin(g_cu, 13), 0);
    lane_ops(g_cu, &w1.g, &w2.g, &x.g, &r1[1], &r2[1], &r3[1], 0);
    assert_int_equal(cn_backend_step_end(g_cu, 1), 0);
    assert_int_equal(cn_backend_sync(g_cu), 0);
    pv_expect("lanes y1", &y1, TOL_MM);
    pv_expect("lanes y2", &y2, TOL_MM);
    pv_free(&x);
    pv_free(&y1);
    pv_free(&y2);
    pv_free(&y3);
    pw_free(&w1);
    pw_free(&w2);
}

/* A decode step's attention replayed as the cache grows across span boundaries (the graph's
 * grid and scratch change, its kernels do not): each step equals the eager call bit for bit. */
static void test_step_attention(void **st) {
    (void)st;
    const int Hq = 8, Hkv = 2, Dh = 64, S = 1100;
    const int pasts[] = {250, 255, 256, 300, 511, 512, 1000, 20};
    pv q = pv_make(1, (int64_t)Hq * Dh, 0, -1, 1), out = pv_make(1, (int64_t)Hq * Dh, 0, 0, 0);
    pv kf = pv_make(S, (int64_t)Hkv * Dh, 0, -1, 1), vf = pv_make(S, (int64_t)Hkv * Dh, 0, -2, 2);
    const float scale = 0.125f;
    for (size_t i = 0; i < sizeof pasts / sizeof pasts[0]; i++) {
        assert_int_equal(cn_op_attention(g_cu, &out.g, &q.g, &kf.g, &vf.g, pasts[i], Hq, Hkv, scale), 0);
        float *ref = get(g_cu, &out.g);
        assert_int_equal(cn_backend_step_begin(g_cu, 9), 0);
        int rc = cn_op_scale(g_cu, &out.g, &out.g, 0.0f);
        if (!rc) rc = cn_op_attention(g_cu, &out.g, &q.g, &kf.g, &vf.g, pasts[i], Hq, Hkv, scale);
        assert_int_equal(rc, 0);
        assert_int_equal(cn_backend_step_end(g_cu, 1), 0);
        float *got = get(g_cu, &out.g);
        assert_memory_equal(got, ref, (size_t)(Hq * Dh) * sizeof(float));
        free(got);
        free(ref);
    }
    pv_free(&q);
    pv_free(&out);
    pv_free(&kf);
    pv_free(&vf);
}

static int graphs_on(void) {
    const char *g = getenv("CAIRN_CUDA_GRAPHS");
    return !(g && !strcmp(g, "0"));
}

/* One positioned decode step as forward.c issues it: the token's K/V rows into the cache
 * (set_rows) and attention over it, both at the step's position. */
static int replay_step(cn_tensor *out, const cn_tensor *q, cn_tensor *kc, cn_tensor *vc,
                       const cn_tensor *kn, const cn_tensor *vn, int pos, int Hq, int Hkv) {
    int rc = cn_backend_step_begin_at(g_cu, 11, 5, pos);
    if (rc < 0) return rc;
    const int replayed = rc == 1;
    rc = 0;
    if (!replayed) rc = cn_op_set_rows(g_cu, kc, pos, kn);
    if (!rc && !replayed) rc = cn_op_set_rows(g_cu, vc, pos, vn);
    if (!rc && !replayed) rc = cn_op_attention(g_cu, out, q, kc, vc, pos, Hq, Hkv, 0.125f);
    int end = cn_backend_step_end(g_cu, rc == 0);
    return rc ? rc : end;
}

/* Many decode tokens across attention buckets (spans 1, 2, 4, 8): with graphs the steps are
 * replayed, captured again only when the bucket (or the scratch) changes; each token's output
 * equals the eager positioned step's and the plain (unstepped, exact-span) call's bit for bit. */
static void test_step_replay(void **st) {
    (void)st;
    const int Hq = 8, Hkv = 2, Dh = 64, N = 1100;
    const int64_t C = (int64_t)Hkv * Dh, Q = (int64_t)Hq * Dh;
    float *kh = malloc((size_t)(N * C) * sizeof(float)), *vh = malloc((size_t)(N * C) * sizeof(float));
    float *qh = malloc((size_t)(N * Q) * sizeof(float));
    float *res[3];
    assert_non_null(kh);
    assert_non_null(vh);
    assert_non_null(qh);
    for (int64_t i = 0; i < N * C; i++) kh[i] = unif(-1, 1), vh[i] = unif(-2, 2);
    for (int64_t i = 0; i < N * Q; i++) qh[i] = unif(-1, 1);
    pv q = pv_make(1, Q, 0, 0, 0), out = pv_make(1, Q, 0, 0, 0);
    pv kn = pv_make(1, C, 0, 0, 0), vn = pv_make(1, C, 0, 0, 0);
    pv kc = pv_make(N, C, 0, 0, 0), vc = pv_make(N, C, 0, 0, 0);
    cn_cuda_stats s0, s1;
    for (int mode = 0; mode < 3; mode++) { /* 0: graphs, 1: eager steps, 2: no step */
        res[mode] = malloc((size_t)(N * Q) * sizeof(float));
        assert_non_null(res[mode]);
        assert_int_equal(cn_backend_set_record(g_cu, mode == 0), 0);
        assert_int_equal(cn_cuda_backend_stats(g_cu, &s0), 0);
        for (int p = 0; p < N; p++) {
            assert_int_equal(cn_backend_upload(g_cu, &kn.gp, 0, kh + p * C, (uint64_t)C * 4), 0);
            assert_int_equal(cn_backend_upload(g_cu, &vn.gp, 0, vh + p * C, (uint64_t)C * 4), 0);
            assert_int_equal(cn_backend_upload(g_cu, &q.gp, 0, qh + p * Q, (uint64_t)Q * 4), 0);
            if (mode < 2) {
                assert_int_equal(replay_step(&out.g, &q.g, &kc.g, &vc.g, &kn.g, &vn.g, p, Hq, Hkv), 0);
            } else {
                cn_tensor kr = cn_tensor_rows(&kc.g, p, 1), vr = cn_tensor_rows(&vc.g, p, 1);
                assert_int_equal(cn_backend_copy(g_cu, &kr, &kn.g), 0);
                assert_int_equal(cn_backend_copy(g_cu, &vr, &vn.g), 0);
                assert_int_equal(cn_op_attention(g_cu, &out.g, &q.g, &kc.g, &vc.g, p, Hq, Hkv, 0.125f), 0);
            }
            assert_int_equal(cn_backend_download(g_cu, res[mode] + p * Q, &out.g), 0);
        }
        assert_int_equal(cn_cuda_backend_stats(g_cu, &s1), 0);
        if (mode == 0) { /* recorded whatever the environment says (set_record 1) */
            /* captures: the first step, each new bucket, and each scratch growth it brings */
            assert_true(s1.replayed - s0.replayed >= (uint64_t)(N - 8));
            assert_true(s1.instantiated - s0.instantiated + s1.updated - s0.updated <= 8);
        } else {
            assert_int_equal(s1.replayed - s0.replayed, 0);
        }
    }
    assert_int_equal(cn_backend_set_record(g_cu, graphs_on()), 0);
    assert_memory_equal(res[0], res[1], (size_t)(N * Q) * sizeof(float));
    assert_memory_equal(res[1], res[2], (size_t)(N * Q) * sizeof(float));
    /* the cache holds every token's rows, written where each replay's position said */
    float *kback = get(g_cu, &kc.g);
    assert_memory_equal(kback, kh, (size_t)(N * C) * sizeof(float));
    free(kback);
    for (int mode = 0; mode < 3; mode++) free(res[mode]);
    free(kh);
    free(vh);
    free(qh);
    pv_free(&q);
    pv_free(&out);
    pv_free(&kn);
    pv_free(&vn);
    pv_free(&kc);
    pv_free(&vc);
}

static int setup(void **st) {
    (void)st;
    cn_err err;
    cn_err_clear(&err);
    g_cpu = cn_backend_open("cpu", 4, &err);
    g_cu = cn_backend_open("cuda", 0, &err);
    if (!g_cu) fprintf(stderr, "cuda backend: %s\n", err.msg);
    return g_cpu && g_cu ? 0 : -1;
}

static int teardown(void **st) {
    (void)st;
    cn_backend_free(g_cu);
    cn_backend_free(g_cpu);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),      cmocka_unit_test(test_matmul_gather),
        cmocka_unit_test(test_matmul_gather_wide),
        cmocka_unit_test(test_get_rows),    cmocka_unit_test(test_norms),
        cmocka_unit_test(test_elementwise), cmocka_unit_test(test_copy),
        cmocka_unit_test(test_conv1d),      cmocka_unit_test(test_ssm_scan),
        cmocka_unit_test(test_attention),   cmocka_unit_test(test_moe),
        cmocka_unit_test(test_block_scaled),
        cmocka_unit_test(test_argmax),      cmocka_unit_test(test_matmul_ep),
        cmocka_unit_test(test_matmul_gather_ep), cmocka_unit_test(test_fp4_ep),
        cmocka_unit_test(test_route_ep),
        cmocka_unit_test(test_lanes),
        cmocka_unit_test(test_step),        cmocka_unit_test(test_step_attention),
        cmocka_unit_test(test_step_replay), cmocka_unit_test(test_step_shape),
    };
    /* $CAIRN_TEST_FILTER (a cmocka pattern, e.g. "*attention*"): only the tests it names, so a
     * slow tool (compute-sanitizer) can take the suite a part at a time */
    const char *filter = getenv("CAIRN_TEST_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, setup, teardown);
}
