/* bench_probe.c - bandwidth and peak-arithmetic probes for `cairn bench`; see bench_probe.h.
 *
 * The SIMD level follows the CPU backend's rule (cpu_backend.c): the widest the CPU has, capped by
 * CAIRN_CPU_SCALAR=1 or CAIRN_CPU_ISA=scalar|avx2|avx512, so a capped run is measured against the
 * peak of the instructions it actually runs.
 */
#include "cli/bench_probe.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PROBE_X86 1
#endif

#define CHUNK ((size_t)1 << 20) /* bytes one work item of the bandwidth probe reads */
#define MAX_ITEMS 4096
#define NACC 12                 /* independent accumulators: latency 4 x 2 pipes, with margin */

enum { ISA_SCALAR = 0, ISA_AVX2, ISA_AVX512 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int isa_cap(void) {
    const char *env = getenv("CAIRN_CPU_SCALAR");
    if (env && env[0] && strcmp(env, "0") != 0) return ISA_SCALAR;
    env = getenv("CAIRN_CPU_ISA");
    if (env && !strcmp(env, "scalar")) return ISA_SCALAR;
    if (env && !strcmp(env, "avx2")) return ISA_AVX2;
    return ISA_AVX512;
}

#ifdef PROBE_X86
static int isa(void) {
    __builtin_cpu_init();
    int i = ISA_SCALAR;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        i = ISA_AVX2;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) i = ISA_AVX512;
    }
    int cap = isa_cap();
    return i < cap ? i : cap;
}
static int has_vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni");
}
/* The AVX-512 NVFP4 kernel's extra needs (cpu_backend.c picks it on the same test). */
static int has_vbmi(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi");
}
#else
static int isa(void) { return ISA_SCALAR; }
static int has_vnni(void) { return 0; }
static int has_vbmi(void) { return 0; }
#endif

/* ---- buffer ---------------------------------------------------------------------------------- */

void *cn_probe_buf_alloc(size_t bytes) {
    if (bytes == 0 || bytes % CHUNK) return NULL;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    /* distinct non-zero contents: no page may stay the shared zero page */
    uint64_t *q = p;
    for (size_t i = 0; i < bytes / 8; i++) q[i] = i * 0x9e3779b97f4a7c15ull;
    return p;
}

void cn_probe_buf_free(void *buf, size_t bytes) {
    if (buf) munmap(buf, bytes);
}

/* ---- bandwidth ------------------------------------------------------------------------------- */

typedef struct bw_ctx {
    const char *buf;
    int isa;
    uint64_t sink[MAX_ITEMS];
} bw_ctx;

/* Each reader walks its n bytes as STREAMS interleaved streams (the quarters), as decode's
 * kernels read several weight rows at once. Why: on a 2-core VM whose memory was in its slow
 * state, one stream a thread read 20-25 GB/s, less than decode itself read (28-31), which put
 * decode_roofline_ratio above 1; four streams read 31-35 GB/s. n is a multiple of
 * STREAMS * 256. */
#define STREAMS 4

static uint64_t read_scalar(const char *p, size_t n) {
    const size_t q = n / STREAMS / 8;
    const uint64_t *s0 = (const uint64_t *)p, *s1 = s0 + q, *s2 = s1 + q, *s3 = s2 + q;
    uint64_t a[8] = {0};
    for (size_t i = 0; i < q; i += 2) {
        a[0] += s0[i], a[1] += s0[i + 1];
        a[2] += s1[i], a[3] += s1[i + 1];
        a[4] += s2[i], a[5] += s2[i + 1];
        a[6] += s3[i], a[7] += s3[i + 1];
    }
    return a[0] ^ a[1] ^ a[2] ^ a[3] ^ a[4] ^ a[5] ^ a[6] ^ a[7];
}

#ifdef PROBE_X86
__attribute__((target("avx2"))) static uint64_t read_avx2(const char *p, size_t n) {
    const size_t q = n / STREAMS;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < q; i += 64) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(p + q + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(p + q + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(p + 2 * q + i)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(p + 2 * q + i + 32)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(p + 3 * q + i)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(p + 3 * q + i + 32)));
    }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t v[4];
    _mm256_storeu_si256((__m256i *)v, s);
    return v[0] ^ v[1] ^ v[2] ^ v[3];
}

__attribute__((target("avx512f"))) static uint64_t read_avx512(const char *p, size_t n) {
    const size_t q = n / STREAMS;
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < q; i += 128) {
        a0 = _mm512_add_epi64(a0, _mm512_load_si512((const void *)(p + i)));
        a0 = _mm512_add_epi64(a0, _mm512_load_si512((const void *)(p + i + 64)));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512((const void *)(p + q + i)));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512((const void *)(p + q + i + 64)));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512((const void *)(p + 2 * q + i)));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512((const void *)(p + 2 * q + i + 64)));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512((const void *)(p + 3 * q + i)));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512((const void *)(p + 3 * q + i + 64)));
    }
    __m512i s = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
    uint64_t v[8];
    _mm512_storeu_si512((void *)v, s);
    return v[0] ^ v[1] ^ v[2] ^ v[3] ^ v[4] ^ v[5] ^ v[6] ^ v[7];
}
#endif

static void bw_range(void *vctx, int begin, int end) {
    bw_ctx *c = vctx;
    for (int i = begin; i < end; i++) {
        const char *p = c->buf + (size_t)i * CHUNK;
        uint64_t s;
#ifdef PROBE_X86
        if (c->isa == ISA_AVX512) s = read_avx512(p, CHUNK);
        else if (c->isa == ISA_AVX2) s = read_avx2(p, CHUNK);
        else
#endif
            s = read_scalar(p, CHUNK);
        c->sink[i % MAX_ITEMS] ^= s;
    }
}

double cn_probe_bandwidth(cn_pool *pool, const void *buf, size_t bytes, int passes) {
    static bw_ctx c; /* large sink array; one probe at a time per process (the bench's) */
    memset(&c, 0, sizeof c);
    c.buf = buf;
    c.isa = isa();
    int n = (int)(bytes / CHUNK);
    double best = 0;
    for (int p = 0; p < (passes > 0 ? passes : 1); p++) {
        double t0 = now_s();
        cn_pool_for(pool, n, 1, bw_range, &c);
        double dt = now_s() - t0;
        if (dt > 0 && bytes / dt / 1e9 > best) best = (double)bytes / dt / 1e9;
    }
    return best;
}

/* ---- peak arithmetic ------------------------------------------------------------------------- */

typedef struct peak_ctx {
    int mode; /* see cn_probe_peak */
    long iters;
    float sinkf[MAX_ITEMS];
    int32_t sinki[MAX_ITEMS];
} peak_ctx;

enum {
    MODE_FMA_SCALAR = 0, MODE_FMA_AVX2, MODE_FMA_AVX512, MODE_I8_AVX2, MODE_I8_VNNI512,
    MODE_BF16_TILE512, MODE_NVFP4_TILE512
};
/* Ops (a multiply-add counts 2) one iteration of each mode does: NACC instructions of ..., or
 * one step of a CPU matmul tile (cpu_kernels.c: 4 x rows by 4 weight rows; cpu_quant.c: 4 by 2) */
static const double ops_per_iter[] = {
    NACC * 2.0,        /* scalar fmaf (the compiler may vectorize it: then it is a floor) */
    NACC * 8 * 2.0,    /* vfmadd ymm: 8 lanes */
    NACC * 16 * 2.0,   /* vfmadd zmm: 16 lanes */
    NACC * 32 * 2.0,   /* vpmaddubsw + vpmaddwd + vpaddd ymm: 32 u8 x s8 products */
    NACC * 64 * 2.0,   /* vpdpbusd zmm: 64 u8 x s8 products */
    24 * 16 * 2.0,     /* 16 columns of 6 x 4 outputs */
    8 * 256 * 2.0,     /* 256 columns of 4 x 2 outputs */
};
static const char *const mode_name[] = {
    "scalar fp32 multiply-add", "avx2 fp32 vfmadd (ymm)", "avx512 fp32 vfmadd (zmm)",
    "avx2 int8 vpmaddubsw+vpmaddwd (ymm)", "avx512 int8 vpdpbusd (zmm)",
    "avx512 bf16 tile: 4 bf16 widenings (vpmovzxwd+vpslld) per 24 vfmadd (zmm)",
    "avx512 nvfp4 tile: 2 x (2 loads, 2 vpermt2d, 2 shifts, 4 vpermb, 16 scales) per 8 x (4 vpdpbusd, vcvtdq2ps, vmulps, vfmadd) (zmm)",
};

static float fma_scalar(long iters) {
    float a[NACC];
    for (int j = 0; j < NACC; j++) a[j] = 0.5f + 0.01f * j;
    for (long i = 0; i < iters; i++)
        for (int j = 0; j < NACC; j++) a[j] = a[j] * 0.9999999f + 1e-7f;
    float s = 0;
    for (int j = 0; j < NACC; j++) s += a[j];
    return s;
}

#ifdef PROBE_X86
#define REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

__attribute__((target("avx2,fma"))) static float fma_avx2(long iters) {
#define D(j) __m256 a##j = _mm256_set1_ps(0.5f + 0.01f * j);
    REP12(D)
#undef D
    const __m256 m = _mm256_set1_ps(0.9999999f), c = _mm256_set1_ps(1e-7f);
    for (long i = 0; i < iters; i++) {
#define F(j) a##j = _mm256_fmadd_ps(a##j, m, c);
        REP12(F)
#undef F
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    float v[8];
    _mm256_storeu_ps(v, s);
    return v[0] + v[7];
}

__attribute__((target("avx512f"))) static float fma_avx512(long iters) {
#define D(j) __m512 a##j = _mm512_set1_ps(0.5f + 0.01f * j);
    REP12(D)
#undef D
    const __m512 m = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-7f);
    for (long i = 0; i < iters; i++) {
#define F(j) a##j = _mm512_fmadd_ps(a##j, m, c);
        REP12(F)
#undef F
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    float v[16];
    _mm512_storeu_ps(v, s);
    return v[0] + v[15];
}

__attribute__((target("avx2"))) static int32_t i8_avx2(long iters) {
#define D(j) __m256i a##j = _mm256_set1_epi32(j);
    REP12(D)
#undef D
    __m256i u = _mm256_set1_epi8(3);
    const __m256i s = _mm256_set1_epi8(-2), one = _mm256_set1_epi16(1);
    for (long i = 0; i < iters; i++) {
        /* the empty asm makes u opaque before every product: no product is computed once and
         * reused, as the constant operands would otherwise allow */
#define F(j) __asm__ volatile("" : "+x"(u)); \
             a##j = _mm256_add_epi32(a##j, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), one));
        REP12(F)
#undef F
    }
    __m256i t = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)),
                                 _mm256_add_epi32(_mm256_add_epi32(a4, a5), _mm256_add_epi32(a6, a7)));
    t = _mm256_add_epi32(t, _mm256_add_epi32(_mm256_add_epi32(a8, a9), _mm256_add_epi32(a10, a11)));
    return _mm256_extract_epi32(t, 0);
}

__attribute__((target("avx512f,avx512vnni"))) static int32_t i8_vnni512(long iters) {
#define D(j) __m512i a##j = _mm512_set1_epi32(j);
    REP12(D)
#undef D
    const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
    for (long i = 0; i < iters; i++) {
#define F(j) a##j = _mm512_dpbusd_epi32(a##j, u, s);
        REP12(F)
#undef F
    }
    __m512i t = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                                 _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
    t = _mm512_add_epi32(t, _mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11)));
    int32_t v[16];
    _mm512_storeu_si512((void *)v, t);
    return v[0] + v[15];
}

/* The tile probes run a CPU matmul tile's inner step on L1-resident operands: the loads, the
 * conversions and the arithmetic of the kernel in its proportions, so that the peak they report
 * is what that kernel could reach with every operand in cache, not what its multiply-adds alone
 * could. The empty asm makes the pointers opaque each step, so the loads are not hoisted. */
__attribute__((target("avx512f,avx512bw"))) static float bf16_tile512(long iters) {
    uint16_t w[4 * 16];
    float x[6 * 16];
    for (int i = 0; i < 64; i++) w[i] = 0x38d1; /* bf16 1e-4 */
    for (int i = 0; i < 96; i++) x[i] = 1e-4f;
    const uint16_t *wp = w;
    const float *xp = x;
    __m512 acc[6][4];
#pragma GCC unroll 6
    for (int r = 0; r < 6; r++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_ps();
    for (long i = 0; i < iters; i++) {
        __asm__ volatile("" : "+r"(wp), "+r"(xp));
        __m512 wv[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) /* a5_load's BF16 widening */
            wv[j] = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(wp + 16 * j))), 16));
#pragma GCC unroll 6
        for (int r = 0; r < 6; r++) {
            __m512 xv = _mm512_loadu_ps(xp + 16 * r);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) acc[r][j] = _mm512_fmadd_ps(wv[j], xv, acc[r][j]);
        }
    }
    __m512 s = _mm512_setzero_ps();
#pragma GCC unroll 6
    for (int r = 0; r < 6; r++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) s = _mm512_add_ps(s, acc[r][j]);
    float v[16];
    _mm512_storeu_ps(v, s);
    return v[0] + v[15];
}

/* One 256-value superchunk of cpu_quant.c's NVFP4 prefill tile (a5_nvfp4_super, 2 weight rows x
 * 4 tokens): per weight row two 64-byte loads, two dword permutes, two shifts, four vpermb and
 * the 16 block scales' conversion (byte load, widen, shift, mask, vcvtph2ps); per token four
 * activation loads, a scale load and a correction load; per (token, row) four vpdpbusd, a
 * convert, a multiply and an FMA. Operands stay in L1, so this is the tile's arithmetic ceiling. */
__attribute__((target("avx512f,avx512bw,avx512vnni,avx512vbmi"))) static float nvfp4_tile512(long iters) {
    uint8_t w[2 * 128], s[2 * 16];
    int8_t q[4 * 256];
    int32_t c[4 * 16];
    float d[4 * 16];
    for (int i = 0; i < 256; i++) w[i] = (uint8_t)(0x21 + i);
    for (int i = 0; i < 32; i++) s[i] = (uint8_t)(0x30 + i % 5);
    for (int i = 0; i < 1024; i++) q[i] = (int8_t)(i % 7 - 3);
    for (int i = 0; i < 64; i++) {
        c[i] = -12;
        d[i] = 1e-6f;
    }
    const uint8_t *wp = w, *sp = s;
    const int8_t *qp = q;
    const int32_t *cp = c;
    const float *dp = d;
    const __m512i lut = _mm512_broadcast_i32x4(
        _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    __m512 acc[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 2
        for (int j = 0; j < 2; j++) acc[r][j] = _mm512_setzero_ps();
    for (long i = 0; i < iters; i++) {
        __asm__ volatile("" : "+r"(wp), "+r"(sp), "+r"(qp), "+r"(cp), "+r"(dp));
        __m512i wv[2][4];
        __m512 sf[2];
#pragma GCC unroll 2
        for (int j = 0; j < 2; j++) { /* a5_fp4_unpack256 and a5_scales16 */
            const __m512i v0 = _mm512_loadu_si512((const void *)(wp + 128 * j));
            const __m512i v1 = _mm512_loadu_si512((const void *)(wp + 128 * j + 64));
            const __m512i a = _mm512_permutex2var_epi32(v0, ie, v1);
            const __m512i b = _mm512_permutex2var_epi32(v0, io, v1);
            wv[j][0] = _mm512_permutexvar_epi8(a, lut);
            wv[j][1] = _mm512_permutexvar_epi8(_mm512_srli_epi16(a, 4), lut);
            wv[j][2] = _mm512_permutexvar_epi8(b, lut);
            wv[j][3] = _mm512_permutexvar_epi8(_mm512_srli_epi16(b, 4), lut);
            __m256i h = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(sp + 16 * j)));
            h = _mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16((short)0xbfff));
            sf[j] = _mm512_cvtph_ps(h);
        }
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const __m512i x0 = _mm512_loadu_si512((const void *)(qp + 256 * r));
            const __m512i x1 = _mm512_loadu_si512((const void *)(qp + 256 * r + 64));
            const __m512i x2 = _mm512_loadu_si512((const void *)(qp + 256 * r + 128));
            const __m512i x3 = _mm512_loadu_si512((const void *)(qp + 256 * r + 192));
            const __m512 dv = _mm512_loadu_ps(dp + 16 * r);
            const __m512i cv = _mm512_loadu_si512((const void *)(cp + 16 * r));
#pragma GCC unroll 2
            for (int j = 0; j < 2; j++) {
                __m512i x = _mm512_dpbusd_epi32(cv, wv[j][0], x0);
                x = _mm512_dpbusd_epi32(x, wv[j][1], x1);
                x = _mm512_dpbusd_epi32(x, wv[j][2], x2);
                x = _mm512_dpbusd_epi32(x, wv[j][3], x3);
                acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(x), _mm512_mul_ps(sf[j], dv), acc[r][j]);
            }
        }
    }
    __m512 t = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 2
        for (int j = 0; j < 2; j++) t = _mm512_add_ps(t, acc[r][j]);
    float v[16];
    _mm512_storeu_ps(v, t);
    return v[0] + v[15];
}
#endif

static void peak_range(void *vctx, int begin, int end) {
    peak_ctx *c = vctx;
    for (int i = begin; i < end; i++) {
        switch (c->mode) {
#ifdef PROBE_X86
        case MODE_FMA_AVX2: c->sinkf[i % MAX_ITEMS] += fma_avx2(c->iters); break;
        case MODE_FMA_AVX512: c->sinkf[i % MAX_ITEMS] += fma_avx512(c->iters); break;
        case MODE_I8_AVX2: c->sinki[i % MAX_ITEMS] += i8_avx2(c->iters); break;
        case MODE_I8_VNNI512: c->sinki[i % MAX_ITEMS] += i8_vnni512(c->iters); break;
        case MODE_BF16_TILE512: c->sinkf[i % MAX_ITEMS] += bf16_tile512(c->iters); break;
        case MODE_NVFP4_TILE512: c->sinkf[i % MAX_ITEMS] += nvfp4_tile512(c->iters); break;
#endif
        default: c->sinkf[i % MAX_ITEMS] += fma_scalar(c->iters); break;
        }
    }
}

double cn_probe_peak(cn_pool *pool, cn_peak_kind kind, double seconds, const char **what) {
    static peak_ctx c;
    memset(&c, 0, sizeof c);
    int i = isa();
    if (i == ISA_AVX512) c.mode = MODE_FMA_AVX512;
    else if (i == ISA_AVX2) c.mode = MODE_FMA_AVX2;
    else c.mode = MODE_FMA_SCALAR;
    if (kind == CN_PEAK_INT8_VNNI) {
        if (i == ISA_AVX512 && has_vnni()) c.mode = MODE_I8_VNNI512;
        else if (i >= ISA_AVX2) c.mode = MODE_I8_AVX2;
    }
    /* the tile kinds exist for the AVX-512 kernels; elsewhere the widest plain kind stands in */
    if (kind == CN_PEAK_BF16_TILE && i == ISA_AVX512) c.mode = MODE_BF16_TILE512;
    if (kind == CN_PEAK_NVFP4_TILE) {
        if (i == ISA_AVX512 && has_vnni() && has_vbmi()) c.mode = MODE_NVFP4_TILE512;
        else if (i >= ISA_AVX2) c.mode = MODE_I8_AVX2;
    }
    if (what) *what = mode_name[c.mode];
    int items = 8 * cn_pool_size(pool);
    /* calibrate: grow iters until one run takes a tenth of the budget */
    c.iters = 1000;
    double dt = 0;
    for (;;) {
        double t0 = now_s();
        cn_pool_for(pool, items, 1, peak_range, &c);
        dt = now_s() - t0;
        if (dt >= seconds / 10 || c.iters > (1L << 40)) break;
        c.iters *= dt > 0 ? (long)(seconds / 10 / dt) + 2 : 16;
    }
    double best = 0;
    long per_run = dt > 0 ? (long)(c.iters * (seconds / 3) / dt) : c.iters;
    c.iters = per_run > 1 ? per_run : 1;
    for (int r = 0; r < 3; r++) {
        double t0 = now_s();
        cn_pool_for(pool, items, 1, peak_range, &c);
        dt = now_s() - t0;
        double g = dt > 0 ? (double)items * c.iters * ops_per_iter[c.mode] / dt / 1e9 : 0;
        if (g > best) best = g;
    }
    return best;
}
