/* amx_probe.c - what Intel AMX does on this machine, for planning the CPU prefill: asks the
 * kernel for the tile state (arch_prctl ARCH_REQ_XCOMP_PERM), then times four independent
 * accumulator tiles fed by TDPBF16PS (bf16 pairs, fp32 sums) and by TDPBUSD (u8 x s8, int32 sums)
 * on one core, operands in tile registers (no loads): the units' ceiling, not a kernel's rate.
 *
 * Build and run: cc -O2 -o amx_probe tools/amx_probe.c && ./amx_probe
 * A development tool: never linked into cairn. On a 2-vCPU Intel Xeon (amx_bf16, amx_int8 in
 * /proc/cpuinfo) it measured about 2.1 TFLOP/s bf16 on one core, 10x the AVX-512 tiles `cairn
 * bench` measures (docs/performance.md). cairn does not use AMX: its sums round differently from
 * the AVX-512 tiles, and the CPU backend promises that a row of a multi-row product equals the
 * one-row product bit for bit (cpu_impl.h: mm_rows; exact speculation relies on it), so AMX would
 * have to serve decode too, where a one-row AMX tile streams weights slower than AVX-512.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define REPS 20000000L

typedef struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

__attribute__((target("amx-tile,amx-bf16,amx-int8"))) int main(void) {
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) {
        perror("amx_probe: arch_prctl(ARCH_REQ_XCOMP_PERM)");
        return 1;
    }
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.rows[i] = 16;
        cfg.colsb[i] = 64;
    }
    _tile_loadconfig(&cfg);
    static uint16_t a[16 * 32];
    static float c[16 * 16];
    for (int i = 0; i < 16 * 32; i++) a[i] = 0x3f80; /* bf16 1.0; as bytes: 0x80, 0x3f */
    _tile_loadd(4, a, 64);
    _tile_loadd(5, a, 64);
    _tile_loadd(6, a, 64);
    _tile_loadd(7, a, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    double t0 = now_s();
    for (long i = 0; i < REPS; i++) {
        _tile_dpbf16ps(0, 4, 5);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 6, 5);
        _tile_dpbf16ps(3, 6, 7);
    }
    double t = now_s() - t0;
    _tile_stored(0, c, 64);
    printf("TDPBF16PS: %.1f GFLOP/s on one core (c[0] = %g)\n",
           4.0 * REPS * 16 * 16 * 32 * 2 / t / 1e9, (double)c[0]);
    t0 = now_s();
    for (long i = 0; i < REPS; i++) {
        _tile_dpbusd(0, 4, 5);
        _tile_dpbusd(1, 4, 7);
        _tile_dpbusd(2, 6, 5);
        _tile_dpbusd(3, 6, 7);
    }
    t = now_s() - t0;
    printf("TDPBUSD:   %.1f GOP/s on one core\n", 4.0 * REPS * 16 * 16 * 64 * 2 / t / 1e9);
    _tile_release();
    return 0;
}
