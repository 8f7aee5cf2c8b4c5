/* fp8_mma_error.c - would an NVFP4 decode GEMV on FP8 or int8 tensor cores be exact enough? An
 * emulation on the CPU, to decide before spending device time (for k_gemv_fp4: an f16 form
 * spends ~6 instructions a weight turning nibbles into scaled f16).
 *
 * The design it models: the weights' E2M1 nibbles become E4M3 bytes as they are (exact); x is
 * scaled by 2^-p so that max |x| sits in [128, 256) and split into T E4M3 terms (term t the
 * rounding of what the terms before it left, times 16^t); one m16n8k32 product per 32 columns
 * takes (term, block) pairs as B's columns, with C = 0, and each column's sum of 16 products is
 * scaled by its block's E4M3 scale into an fp32 accumulator (an FFMA outside the tensor core).
 * The tensor core's FP8 sum is modelled as reported for Hopper: products exact, aligned to the
 * largest one with A fractional bits, the bits below truncated, the sum truncated to 13 mantissa
 * bits (e8m13). The error is reported as test_cuda_ops measures it: max |y - ref| / max |ref|
 * over a row of outputs, against its TOL_MM of 2e-5.
 *
 * Build and run: cc -O2 -o /tmp/fp8err tools/fp8_mma_error.c -lm && /tmp/fp8err
 * A development tool: never linked into cairn.
 *
 * Its answer (rows: terms, alignment bits, output truncated to 13 bits; K = 1024 to 4096): 4
 * terms with the sums exact reach 4.1e-7 to 4.5e-7; any 13-bit truncation (alignment or output)
 * gives 2.2e-5 to 4.1e-5, and 3 terms 1.0e-5 to 3.6e-5. So the FP8 form meets 2e-5
 * only if the tensor core's FP8 sums are exact to about 24 bits, which the reports for Hopper
 * (e8m13) say they are not. The int8 form (trial_int8) sums exactly in int32: with 3 x terms it
 * reaches 7.9e-7 to 9.9e-7 (2 terms: 1.2e-4 to 1.4e-4). Its weights come from nibbles by byte
 * permutes (a 16-entry table: two PRMTs for the magnitudes, two for the negated ones, one PRMT
 * in sign-replicate mode for the byte masks, one LOP3 to pick), no conversion or scale multiply
 * per weight; the columns are (term, block) pairs, 6 of the 8, so each product's sums take their
 * block scales by I2F and FFMA after it. So the int8 form is the one to build: k_gemv_fp4
 * (cuda_gemv_fp4.cu) does, with byte permutes into 128 + 2 e2m1 and dp4a.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t rng = 88172645463325252ull;
static double urand(void) { /* [0, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* Round to E4M3 (3 mantissa bits, normals from 2^-6, subnormal step 2^-9, max 448), nearest
 * even. */
static double e4m3(double v) {
    if (v == 0) return 0;
    double a = fabs(v);
    int e = (int)floor(log2(a));
    if (e < -6) e = -6;
    double step = ldexp(1.0, e - 3);
    double q = nearbyint(a / step) * step;
    if (q > 448) q = 448;
    return v < 0 ? -q : q;
}

/* Truncation toward zero to a multiple of `step`. */
static double trunc_to(double v, double step) { return trunc(v / step) * step; }

/* Truncation to 13 mantissa bits. */
static double trunc13(double v) {
    if (v == 0) return 0;
    int e = (int)floor(log2(fabs(v)));
    return trunc_to(v, ldexp(1.0, e - 13));
}

/* The tensor core's sum of n products (C = 0): aligned to the largest with A fractional bits,
 * the sum truncated to 13 mantissa bits when out13. */
static double tc_sum(const double *p, int n, int A, int out13) {
    double m = 0;
    for (int i = 0; i < n; i++) m = fmax(m, fabs(p[i]));
    if (m == 0) return 0;
    int e = (int)floor(log2(m));
    double s = 0, step = ldexp(1.0, e - A);
    for (int i = 0; i < n; i++) s += trunc_to(p[i], step);
    return out13 ? trunc13(s) : s;
}

static const double fp4[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

/* K activations in (-xrange, xrange), one in 20 ten times larger, rounded to float; returns the
 * largest magnitude. */
static double make_x(double *x, int K, double xrange) {
    double mx = 0;
    for (int k = 0; k < K; k++) {
        const double u = 2 * urand() - 1, big = urand() < 0.05 ? 10 : 1;
        x[k] = (double)(float)(u * xrange * big);
        mx = fmax(mx, fabs(x[k]));
    }
    return mx;
}

/* One weight row of K: E2M1 values w and their E4M3 block scales sc (K / 16). */
static void make_row(double *w, double *sc, int K) {
    for (int k = 0; k < K; k++) {
        double c = fp4[(int)(urand() * 8)];
        w[k] = urand() < 0.5 ? -c : c;
    }
    for (int b = 0; b < K / 16; b++) sc[b] = e4m3(exp(2 * urand() - 1) * 0.02);
}

/* max |y - ref| / max |ref| for N rows of K, T terms, alignment A. */
static double trial(int N, int K, int T, int A, int out13, double xrange) {
    double *x = malloc(sizeof(double) * K), *X[4], *w = malloc(sizeof(double) * K);
    double *sc = malloc(sizeof(double) * (K / 16)), *y = malloc(sizeof(double) * N),
           *ref = malloc(sizeof(double) * N);
    for (int t = 0; t < T; t++) X[t] = malloc(sizeof(double) * K);
    const double mx = make_x(x, K, xrange);
    int p = (int)floor(log2(mx)) - 7; /* max |x 2^-p| in [128, 256) */
    for (int k = 0; k < K; k++) {
        double r = ldexp(x[k], -p);
        for (int t = 0; t < T; t++) {
            X[t][k] = e4m3(r);
            r = (r - X[t][k]) * 16;
        }
    }
    double mref = 0, merr = 0;
    for (int n = 0; n < N; n++) {
        make_row(w, sc, K);
        double r = 0;
        for (int k = 0; k < K; k++) r += w[k] * sc[k / 16] * x[k];
        ref[n] = r;
        float acc[4] = {0, 0, 0, 0};
        for (int k0 = 0; k0 < K; k0 += 32)
            for (int t = 0; t < T; t++)
                for (int b = 0; b < 2; b++) { /* one column: 16 products of block b, 16 zeros */
                    double prod[32] = {0};
                    for (int i = 0; i < 16; i++) {
                        int k = k0 + 16 * b + i;
                        prod[i] = w[k] * X[t][k];
                    }
                    double s = tc_sum(prod, 32, A, out13);
                    acc[t] = fmaf((float)sc[(k0 + 16 * b) / 16], (float)s, acc[t]);
                }
        double v = 0;
        for (int t = T - 1; t >= 0; t--) v += ldexp((double)acc[t], -4 * t);
        y[n] = (double)(float)ldexp(v, p);
        mref = fmax(mref, fabs(ref[n]));
    }
    for (int n = 0; n < N; n++) merr = fmax(merr, fabs(y[n] - ref[n]));
    for (int t = 0; t < T; t++) free(X[t]);
    free(x), free(w), free(sc), free(y), free(ref);
    return merr / mref;
}

/* The int8 form: weights as 2 x E2M1 in int8 (exact), x as T int8 terms of a fixed-point split
 * (term 0 = round(x S), S = 127 / max |x|, then each term the rounding of what is left times
 * 127), one m16n8k32 s8 product per 32 columns summing exactly in int32, each (term, block)
 * column scaled by its block's E4M3 scale / 2 into an fp32 accumulator per term. */
static double trial_int8(int N, int K, int T, double xrange) {
    double *x = malloc(sizeof(double) * K), *w = malloc(sizeof(double) * K);
    int *X[4];
    double *sc = malloc(sizeof(double) * (K / 16));
    for (int t = 0; t < T; t++) X[t] = malloc(sizeof(int) * K);
    const double mx = make_x(x, K, xrange);
    const double S = 127.0 / mx;
    for (int k = 0; k < K; k++) {
        double r = x[k] * S;
        for (int t = 0; t < T; t++) {
            X[t][k] = (int)nearbyint(r);
            r = (r - X[t][k]) * 127;
        }
    }
    double mref = 0, merr = 0;
    for (int n = 0; n < N; n++) {
        make_row(w, sc, K);
        double ref = 0;
        for (int k = 0; k < K; k++) ref += w[k] * sc[k / 16] * x[k];
        float acc[4] = {0, 0, 0, 0};
        for (int b = 0; b < K / 16; b++)
            for (int t = 0; t < T; t++) {
                int32_t s = 0;
                for (int i = 0; i < 16; i++) s += (int32_t)(2 * w[16 * b + i]) * X[t][16 * b + i];
                acc[t] = fmaf((float)(sc[b] * 0.5), (float)s, acc[t]);
            }
        double v = 0, f = 1.0 / S;
        for (int t = 0; t < T; t++, f /= 127) v += (double)acc[t] * f;
        merr = fmax(merr, fabs((double)(float)v - ref));
        mref = fmax(mref, fabs(ref));
    }
    for (int t = 0; t < T; t++) free(X[t]);
    free(x), free(w), free(sc);
    return merr / mref;
}

int main(void) {
    const int Ks[] = {1024, 1856, 2688, 4096};
    printf("terms align out13   K=1024    K=1856    K=2688    K=4096   (max |err| / max |ref|, "
           "2000 rows; TOL_MM 2e-5)\n");
    for (int T = 2; T <= 4; T++)
        for (int A = 13; A <= 24; A += 11)
            for (int o = 1; o >= 0; o--) {
                printf("%5d %5d %5d", T, A, o);
                for (int i = 0; i < 4; i++) printf("  %8.2e", trial(2000, Ks[i], T, A, o, 2.0));
                printf("\n");
            }
    printf("int8 terms        K=1024    K=1856    K=2688    K=4096\n");
    for (int T = 2; T <= 3; T++) {
        printf("%10d      ", T);
        for (int i = 0; i < 4; i++) printf("  %8.2e", trial_int8(2000, Ks[i], T, 2.0));
        printf("\n");
    }
    return 0;
}
