/* fp.h - scalar conversions between fp32 and the storage formats weights arrive in.
 *
 * bf16 and f16 round to nearest even; f8 E4M3 (the "fn" variant: no infinities, 0x7f/0xff are NaN,
 * max 448) saturates on encode; E8M0 is a power-of-two scale, 0xff is NaN; E2M1 (fp4) codes 0-7 are
 * {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 the sign. All functions are pure and never fail.
 */
#ifndef CN_FP_H
#define CN_FP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float cn_u32_as_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t cn_f32_as_u32(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float cn_bf16_to_f32(uint16_t h) { return cn_u32_as_f32((uint32_t)h << 16); }

static inline uint16_t cn_f32_to_bf16(float f) {
    uint32_t u = cn_f32_as_u32(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float cn_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) {
        float v = ldexpf((float)man, -24);
        return sign ? -v : v;
    }
    if (exp == 31) return cn_u32_as_f32(sign | 0x7f800000u | (man << 13));
    return cn_u32_as_f32(sign | ((exp + 112) << 23) | (man << 13));
}

static inline uint16_t cn_f32_to_f16(float f) {
    uint32_t u = cn_f32_as_u32(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    float a = fabsf(f);
    if (a != a) return (uint16_t)(sign | 0x7e00u);
    if (a >= 65520.0f) return (uint16_t)(sign | 0x7c00u);
    if (a < 6.103515625e-05f) { /* subnormal: units of 2^-24, round to nearest even */
        float q = a * 16777216.0f;
        return (uint16_t)(sign | (uint16_t)nearbyintf(q));
    }
    uint32_t au = cn_f32_as_u32(a);
    au += 0xfffu + ((au >> 13) & 1u);
    return (uint16_t)(sign | (((au >> 23) - 112) << 10) | ((au >> 13) & 0x3ffu));
}

static inline float cn_e4m3_to_f32(uint8_t v) {
    uint32_t sign = v & 0x80u, exp = (v >> 3) & 0xfu, man = v & 0x7u;
    float r;
    if (exp == 0xf && man == 0x7) return NAN;
    if (exp == 0) r = ldexpf((float)man, -9);
    else r = ldexpf(1.0f + (float)man / 8.0f, (int)exp - 7);
    return sign ? -r : r;
}

static inline uint8_t cn_f32_to_e4m3(float f) {
    uint8_t sign = (f < 0 || (f == 0 && signbit(f))) ? 0x80 : 0;
    float a = fabsf(f);
    if (a != a) return 0x7f;
    if (a >= 448.0f) return (uint8_t)(sign | 0x7e);
    /* Search the 127 non-negative codes for the nearest; ties go to the even code. */
    uint8_t best = 0;
    float bestd = INFINITY;
    for (int c = 0; c < 0x7f; c++) {
        float d = fabsf(cn_e4m3_to_f32((uint8_t)c) - a);
        if (d < bestd || (d == bestd && (c & 1) == 0)) { bestd = d; best = (uint8_t)c; }
    }
    return (uint8_t)(sign | best);
}

static inline float cn_e8m0_to_f32(uint8_t v) {
    if (v == 0xff) return NAN;
    return ldexpf(1.0f, (int)v - 127);
}

static inline float cn_e2m1_to_f32(uint8_t nib) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float m = mag[nib & 7u];
    return (nib & 8u) ? -m : m;
}

#endif
