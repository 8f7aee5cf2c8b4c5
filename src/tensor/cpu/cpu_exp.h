/* cpu_exp.h - e^x for x <= 0 in fp32, as 16 AVX-512 lanes, as 8 AVX2 lanes and as a scalar twin,
 * all three giving the same bits.
 *
 * Promises: 2^n * p(r), r = x - n ln 2 in [-ln2/2, ln2/2] (ln 2 in two parts), p the degree-6
 * Taylor polynomial (relative error below 2e-7); x at or below -104 gives 0 (2^-150 p rounds
 * to 0); NaN stays NaN. Each step is one IEEE operation, fused where
 * the vector form fuses (fmaf), so the scalar twin rounds exactly as each lane does. Written by
 * hand: libm's expf is neither vectorised here nor the same bits as a vector exp.
 * Never: x > 0 (the polynomial's range reduction assumes it; callers pass -|v| or v - max).
 */
#ifndef CN_CPU_EXP_H
#define CN_CPU_EXP_H

#include <math.h>

#define CPU_EXP_MIN (-104.0f)
#define CPU_EXP_L2E 1.44269504088896341f
#define CPU_EXP_LN2_HI 0.693145751953125f
#define CPU_EXP_LN2_LO 1.42860682030941723212e-6f

static inline float cpu_exp_le0(float x) {
    if (x < CPU_EXP_MIN) x = CPU_EXP_MIN; /* NaN fails the test and stays */
    const float n = nearbyintf(x * CPU_EXP_L2E);
    float r = fmaf(-n, CPU_EXP_LN2_HI, x);
    r = fmaf(-n, CPU_EXP_LN2_LO, r);
    float p = 1.0f / 720;
    p = fmaf(p, r, 1.0f / 120);
    p = fmaf(p, r, 1.0f / 24);
    p = fmaf(p, r, 1.0f / 6);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    return x == x ? ldexpf(p, (int)n) : x;
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

static inline __attribute__((always_inline, target("avx512f"))) __m512 cpu_exp_le0_16(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(CPU_EXP_MIN), x); /* maxps returns x when x is NaN */
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(CPU_EXP_L2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(CPU_EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(CPU_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* The same operations on 8 lanes (AVX2 + FMA). AVX2 has no scalef: 2^n (n in [-150, 0]) is
 * applied as 2^a then 2^b, a = floor(n / 2), b = n - a, both at least -75: p * 2^a is normal and
 * exact, so the one rounding is that of p * 2^n, scalef's and ldexpf's. */
static inline __attribute__((always_inline, target("avx2,fma"))) __m256 cpu_exp_le0_8(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(CPU_EXP_MIN), x); /* maxps returns x when x is NaN */
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(CPU_EXP_L2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(CPU_EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(CPU_EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i ni = _mm256_cvtps_epi32(n), bias = _mm256_set1_epi32(127);
    const __m256i a = _mm256_srai_epi32(ni, 1), b = _mm256_sub_epi32(ni, a);
    const __m256 fa = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(a, bias), 23));
    const __m256 fb = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(b, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, fa), fb); /* NaN: p is NaN */
}
#endif

#endif
