/* bench_model.c - `cairn bench [--model DIR | --preset NAME]`: prefill and decode speed of one
 * model, each figure set against this machine's limits measured in the same run.
 *
 * What it measures, in this order, on one model and one backend:
 *   machine   peak_gops: cn_probe_peak of the instruction mix the weights' matmuls run (BF16:
 *             the BF16 tile's step; NVFP4: the NVFP4 tile's, and the BF16 tile's for the modules
 *             kept BF16, weighted by parameters; FP8, MXFP8: fp32 FMA), every thread. A backend with
 *             its own device (cn_backend_measure: CUDA) gives its BF16 GEMM peak instead, its
 *             memory bandwidth for every probe below, and the pinned host link each way.
 *   warm-up   a forward of min(U, --prompt-short) and one of min(U, --prompt) tokens, U the
 *             model's forward piece (--ubatch or the backend's default), and a few decodes (touches the weights and every chunk shape:
 *             page-table setup, lazily loaded GPU kernels and scratch growth never land in a
 *             timed run), not reported.
 *   prefill512, prefill (2048)
 *             a fresh state absorbs --prompt-short / --prompt random tokens in one
 *             cn_model_forward (logits of the last position only): tokens / seconds.
 *   decode    a fresh state decodes --gen tokens one cn_model_decode_greedy at a time, each the
 *             greedy pick of the previous token's logits, taken on the backend as a greedy
 *             request's decode takes it (4 bytes to the host per token): tokens / seconds.
 *   decode_8k a second state absorbs --context tokens (timed apart, reported as prefill_ctx),
 *             then decodes --gen tokens as above.
 *             The two decode runs take turns in bursts of --burst tokens (default 8), each burst
 *             between two probes: probe, decode burst, probe, decode_8k burst, probe, ... On the
 *             CPU's shared machines memory bandwidth switches level every few minutes, so two
 *             runs timed minutes apart compare two memory levels (decode_8k_over_start read 0.88
 *             and 1.08 that way); a pair of bursts fractions of a second apart sees one. A device
 *             backend runs each side in one burst (its bandwidth holds still, and a switch of
 *             state re-captures its step graph).
 *   decode_parallel  --parallel N fresh states decode --gen tokens each, one cn_model_forward_seqs
 *             step a token for every state (each fed its own previous greedy pick, taken on the
 *             backend): N x gen / seconds, and decode_parallel_speedup, its ratio to decode's
 *             tok/s. Skipped for N < 2.
 *   prefill_long a fresh state absorbs --long-context tokens (default 32768; timed apart,
 *             reported as prefill_long_prefix), then one chunk of --prompt-short tokens is timed
 *             between two probes: prefill512's chunk, evaluated after the long prefix. Skipped
 *             with --long-context 0.
 *   decode_eager (device backends) decode again with the backend's steps launched op by op
 *             rather than replayed as graphs (cn_backend_set_record 0): decode_graph_speedup.
 * Each prefill run, and each decode burst, is bracketed by a bandwidth probe right before and
 * right after it (cn_probe_bandwidth: a streaming read of a --probe-mb buffer on every thread).
 * Probes that differ by more than 10% mark a prefill run unreliable, and a decode run when they
 * do so for more than half of its bursts. Each run also reports its cpu_share, process CPU
 * seconds / (wall seconds * threads): below 1, other jobs held the cores.
 *
 * Figures (formulas, also in the report):
 *   bytes_per_token      = W + S + KV * c, cn_model_decode_traffic (model.h): W the weight bytes
 *                          one decoded token streams (every main tensor as stored, k of E routed
 *                          experts per MoE layer, one embedding row, lm_head whole), S the
 *                          recurrent state read (conv tails + SSM states), KV the K/V bytes read
 *                          per token of context, c the mean context over the timed decode.
 *   mem_bw_gbs           = the decode run's probes, each burst's two averaged, weighted by the
 *                          burst's seconds.
 *   decode_roofline_ratio = decode_tok_s / (mem_bw_gbs * 1e9 / bytes_per_token), taken over the
 *                          decode bursts whose two probes agree (all of them if none do, and then
 *                          decode_roofline_from_agreeing is false): sum of tokens * bytes_per_token
 *                          / sum of seconds * burst bandwidth. decode_8k_roofline_ratio likewise.
 *   decode_8k_over_start = decode_8k_tok_s / decode_tok_s: the two runs' bursts interleaved, each
 *                          side meets the same mix of machine states. Under load (other jobs on
 *                          the cores, cpu share 0.4-0.5; NVFP4, --gen 128 --burst 4) two runs
 *                          gave 0.993 and 0.991 where the median of the pairs that looked alike
 *                          (below) gave 0.83 and 1.13: which pairs look alike is itself noise.
 *   decode_8k_over_start_agreeing = the median, over the pairs (decode burst k, decode_8k burst
 *                          k) that saw one machine (three probes within 10%, the two bursts' cpu
 *                          shares within 10%: decode_pairs_agreeing of decode_bursts), of
 *                          decode_8k tok/s / decode tok/s; 0 if none. decode_pair_ratios each
 *                          pair's, negated where the pair saw two machines.
 *   decode_8k_over_start_cpu = process
 *                          CPU seconds of the decode bursts over those of the decode_8k bursts
 *                          (the same tokens): the work per token, which time slices lost to
 *                          other jobs do not move (stalls on memory are in it).
 *   decode_8k_over_start_token_median = the start's median token seconds over decode_8k's,
 *                          every token of each side: a job that takes the cores for a few
 *                          tokens moves a burst's sum but not the median token. Under load (cpu
 *                          share 0.3-0.9, BF16, 2k of context) pairs of 8-token bursts ranged
 *                          0.50-1.85, and a burst's first token (right after a probe) ran about
 *                          twice as slow as the rest; two runs whose bursts gave 1.05 and 1.07
 *                          had median tokens 0.995 and 1.003 apart (a third: 0.781 and 0.849).
 *                          A diagnostic beside the burst figures, which keep their formulas.
 *   runs.decode.median_token_tok_s, runs.decode_8k.median_token_tok_s = 1 / each side's
 *                          median token seconds (also on the text lines): the rate between the
 *                          one-time costs a burst pays (a device backend captures its step graph
 *                          again on each side's first token, and on a new attention bucket).
 *   prefill_gops         = 2 * P * prefill_tok_s / 1e9, P the matrix parameters a prefill token
 *                          passes through (active params less the embedding and lm_head, which
 *                          prefill runs for the last position only). Attention's score/value
 *                          products and the SSM scan are not counted: the ratio is a floor.
 *   prefill_compute_ratio = prefill_gops (2048-token prompt) / peak_gops.
 *   prefill_long_over_start = prefill_long_tok_s / prefill512_tok_s: the same chunk after the
 *                          long prefix and at the start.
 *   attention_gops       = (A(C) - A(0)) / (prefill_long seconds - prefill512 seconds): the
 *                          attention arithmetic the long prefix adds to the chunk over the time
 *                          it adds, A(c) = 4 * L * H * D * (n * c + n (n + 1) / 2) for a chunk of
 *                          n queries after c keys (L full-attention layers, H query heads of D:
 *                          scores and weighted values, a multiply-add two operations). The real
 *                          forward by difference, so what else grows with the context counts
 *                          against it: a floor. 0 when the long chunk was not slower.
 *   attention_compute_ratio = attention_gops / attention_peak_gops, the fp32 FMA probe
 *                          (cn_probe_peak CN_PEAK_FP32_FMA: the instruction the attention
 *                          kernels run; not measured on a device backend).
 *   peak_memory_bytes    = VmHWM of /proc/self/status less the probe buffer (allocated first and
 *                          resident throughout), the high-water mark reset (clear_refs 5) once the
 *                          preset is built, so building the checkpoint does not count.
 * With a --layers slice of a preset, full_model projects the whole preset: bytes per token and
 * prefill parameters scaled from the slice's per-layer-type figures; decode tok/s with the
 * layers' time scaled by their bytes and the lm_head's kept (at the probed bandwidth), prefill
 * tok/s at the slice's op rate. Projections, labelled as such.
 *
 * Presets are built into a directory on tmpfs (/dev/shm) when memory allows, else under $TMPDIR:
 * a tmpfs file is RAM, and mapping it gives the weights in memory without a second copy, loaded
 * by exactly the code that maps a published checkpoint (what is timed is what serves). BF16 is
 * written by cn_synth_write (synth.h), other formats converted from it by cn_quantize_dir with
 * NVIDIA's module choices (quantize.h). The directory is removed at the end unless --work-dir
 * names where to keep it (and reuse it next time).
 *
 * Never asserts a speed; exit status 0, 1 (a step failed, message on stderr) or 2 (usage).
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cache/snapshot.h"
#include "cli/bench_probe.h"
#include "cli/cli.h"
#include "cli/cli_util.h"
#include "cli/flags.h"
#include "model/quantize.h"
#include "model/state.h"
#include "model/synth.h"
#include "tensor/backends.h"

static const char kSynopsis[] =
    "bench [--model DIR | --preset " CN_SYNTH_PRESETS " [--layers N]] [--weights bf16|fp8|mxfp8|nvfp4] "
    "[--prompt N] [--long-context N] [--gen N] [--json]";

#define UNRELIABLE_SPREAD 0.10 /* probes further apart than this mark a run unreliable */
#define PROBE_PASSES 3
#define PEAK_SECONDS 0.6
#define N_TYPES 4 /* cn_block_index */
#define MAX_BURSTS 256 /* decode bursts a side at most (--burst grows past gen / 256) */

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double now_s(void) { return clock_s(CLOCK_MONOTONIC); }

/* ---- the checkpoint ------------------------------------------------------------------------- */

/* Bytes of MemAvailable, 0 if unknown. */
static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb << 10;
}

static uint64_t fs_free(const char *dir) {
    struct statvfs v;
    if (statvfs(dir, &v)) return 0;
    return (uint64_t)v.f_bavail * v.f_frsize;
}

/* Where to build a checkpoint of `need` bytes: tmpfs if it and RAM have room (with 2 GiB to
 * spare for the run itself), else $TMPDIR or /tmp. */
static const char *build_base(uint64_t need) {
    const uint64_t spare = (uint64_t)2 << 30;
    if (access("/dev/shm", W_OK) == 0 && fs_free("/dev/shm") > need + spare &&
        mem_available() > need + spare)
        return "/dev/shm";
    const char *t = getenv("TMPDIR");
    return t && *t ? t : "/tmp";
}

/* Removes dir and the plain files in it (what synth and quantize write). */
static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char path[4400];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
                unlink(path);
            }
        closedir(d);
    }
    rmdir(dir);
}

static int has_checkpoint(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (access(p, R_OK)) return 0;
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    if (access(p, R_OK) == 0) return 1;
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    return access(p, R_OK) == 0;
}

typedef struct ckpt {
    char dir[4096];   /* what the bench loads */
    char tmp[4096];   /* a directory to remove at the end ("" if none) */
    double build_s;   /* seconds spent building (0 if reused or given) */
    int reused;
} ckpt;

static int quantize_into(const char *in, const char *out, cn_qalgo algo) {
    cn_quantize_opts q = {.in_dir = in, .out_dir = out, .algo = algo};
    cn_err err;
    cn_err_clear(&err);
    if (cn_quantize_dir(&q, NULL, &err)) {
        fprintf(stderr, "cairn: quantize %s: %s\n", in, err.msg);
        return 1;
    }
    return 0;
}

/* Builds (or finds) the checkpoint to bench. Returns 0, or 1 with the message printed. */
static int ckpt_prepare(ckpt *c, const char *model, const char *preset, int layers, uint64_t seed,
                        const char *weights, cn_qalgo algo, const char *work_dir) {
    memset(c, 0, sizeof *c);
    double t0 = now_s();
    if (model && algo == CN_QALGO_NONE) { /* as stored */
        snprintf(c->dir, sizeof c->dir, "%s", model);
        return 0;
    }
    /* NVFP4 is synthesised directly, each row quantized as it is generated (the whole model in
     * BF16 first would take 63 GB of disk); the other formats quantize a BF16 synthesis */
    const int direct = algo == CN_QALGO_NONE || algo == CN_QALGO_NVFP4;
    uint64_t need = 0;
    cn_synth_opts o;
    cn_synth_opts_init(&o);
    if (preset) {
        o.preset = preset;
        o.seed = seed;
        o.mtp = 0;
        o.layers = layers;
        if (algo == CN_QALGO_NVFP4) o.dtype = CN_NVFP4;
        cn_synth_info info;
        cn_err err;
        cn_err_clear(&err);
        if (cn_synth_describe(&o, &info, &err)) {
            fprintf(stderr, "cairn: %s\n", err.msg);
            return 1;
        }
        need = info.tensor_bytes * (direct ? 1 : 2);
    }
    /* the directory to load */
    if (work_dir) {
        mkdir(work_dir, 0755);
        if (preset)
            snprintf(c->dir, sizeof c->dir, "%s/%s-L%d-s%llu-%s", work_dir, preset, layers,
                     (unsigned long long)seed, weights);
        else
            snprintf(c->dir, sizeof c->dir, "%s/model-%s", work_dir, weights);
        if (has_checkpoint(c->dir)) {
            c->reused = 1;
            return 0;
        }
    } else {
        snprintf(c->tmp, sizeof c->tmp, "%s/cairn-bench-XXXXXX", build_base(need));
        if (!mkdtemp(c->tmp)) {
            fprintf(stderr, "cairn: cannot create a directory %s: %s\n", c->tmp, strerror(errno));
            c->tmp[0] = '\0';
            return 1;
        }
        snprintf(c->dir, sizeof c->dir, "%s", c->tmp);
    }
    fprintf(stderr, "cairn: building %s %s weights in %s ...\n", preset ? preset : model, weights, c->dir);
    int rc = 0;
    if (!preset) {
        rc = quantize_into(model, c->dir, algo);
    } else if (direct) {
        cn_err err;
        cn_err_clear(&err);
        if ((rc = cn_synth_write(c->dir, &o, &err) ? 1 : 0)) fprintf(stderr, "cairn: %s\n", err.msg);
    } else {
        char bf[4200];
        snprintf(bf, sizeof bf, "%s.bf16", c->dir);
        cn_err err;
        cn_err_clear(&err);
        if (cn_synth_write(bf, &o, &err)) {
            fprintf(stderr, "cairn: %s\n", err.msg);
            rc = 1;
        } else {
            rc = quantize_into(bf, c->dir, algo);
        }
        remove_dir(bf);
    }
    c->build_s = now_s() - t0;
    return rc;
}

static void ckpt_release(ckpt *c) {
    if (c->tmp[0]) remove_dir(c->tmp);
    c->tmp[0] = '\0';
}

/* ---- measurement ---------------------------------------------------------------------------- */

typedef struct run {
    const char *name;
    int tokens;           /* timed tokens */
    int ctx0;             /* context before the first timed token */
    double seconds;
    double cpu_share;     /* process CPU seconds / (seconds * threads): below 1, others had cores */
    double tok_s;
    double bw_before, bw_after; /* GB/s */
    double bw;            /* their mean */
    int reliable;
    double tok_s_median;  /* the decode pair's sides: 1 / the median token's seconds (else 0) */
} run;

typedef struct bench {
    cn_backend *be;
    int device;           /* the backend measures its own device (cn_backend_measure) */
    cn_model *m;
    cn_state *s;
    cn_pool *pool;
    int n_threads;
    void *probe;
    size_t probe_bytes;
    int32_t *toks;        /* [max_ctx] random prompt ids */
    float *logits;        /* [vocab] */
    int vocab;
} bench;

static double probe_bw(bench *B) {
    if (B->device) { /* the memory the model streams is the device's */
        cn_backend_limits l;
        return cn_backend_measure(B->be, CN_LIMIT_MEM, &l) ? 0 : l.mem_gbs;
    }
    return cn_probe_bandwidth(B->pool, B->probe, B->probe_bytes, PROBE_PASSES);
}

static int prefill(bench *B, int n) {
    cn_batch b = {.tokens = B->toks, .n = n, .logits = B->logits};
    return cn_model_forward(B->m, B->s, &b);
}

/* n greedy decodes on s from token *tok, each fed the previous pick (*tok ends as the last);
 * each token's seconds into tsec[i] when tsec is not NULL. */
static int decode_times(bench *B, cn_state *s, int32_t *tok, int n, double *tsec) {
    for (int i = 0; i < n; i++) {
        double t0 = tsec ? now_s() : 0;
        int rc = cn_model_decode_greedy(B->m, s, *tok, tok);
        if (rc) return rc;
        if (tsec) tsec[i] = now_s() - t0;
    }
    return 0;
}

/* Attention's multiply-adds (as two operations each) for a chunk of n queries after ctx keys:
 * scores and weighted values of every full-attention layer (sliding windows left out). */
static double attention_ops(const cn_config *c, double ctx, double n) {
    int layers = 0;
    for (const char *p = c->layers; *p; p++) layers += *p == CN_BLOCK_ATTN;
    return 4.0 * layers * c->n_heads * c->head_dim * (n * ctx + n * (n + 1) / 2);
}

static int decode(bench *B, int n) {
    int32_t t = B->toks[0];
    return decode_times(B, B->s, &t, n, NULL);
}

/* Two probes (or cpu shares) within UNRELIABLE_SPREAD of each other, relative to the lower. */
static int probes_agree(double a, double b) {
    double lo = fmin(a, b), hi = fmax(a, b);
    return lo > 0 && (hi - lo) / lo <= UNRELIABLE_SPREAD;
}

/* The timed stretch of a run: a bandwidth probe before it, the wall and CPU clocks, and at the
 * end the probe after it and the run's figures (r->tokens over r->seconds). */
typedef struct run_clock {
    double t0, c0;
} run_clock;

static run_clock run_start(bench *B, run *r) {
    r->bw_before = probe_bw(B);
    return (run_clock){now_s(), clock_s(CLOCK_PROCESS_CPUTIME_ID)};
}

static void run_stop(bench *B, run *r, run_clock k) {
    r->seconds = now_s() - k.t0;
    double cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID) - k.c0;
    r->cpu_share = r->seconds > 0 ? cpu / (r->seconds * B->n_threads) : 0;
    r->bw_after = probe_bw(B);
    r->tok_s = r->seconds > 0 ? r->tokens / r->seconds : 0;
    r->bw = (r->bw_before + r->bw_after) / 2;
    r->reliable = probes_agree(r->bw_before, r->bw_after);
}

/* Runs one measurement on a fresh state: a prefill of n tokens, or n decodes, between two
 * bandwidth probes (the decodes at 8k of context: measure_decode_pair). */
static int measure(bench *B, run *r, const char *name, int is_decode, int n) {
    memset(r, 0, sizeof *r);
    r->name = name;
    r->tokens = n;
    int rc = cn_state_reset(B->s);
    if (rc) return rc;
    run_clock k = run_start(B, r);
    rc = is_decode ? decode(B, n) : prefill(B, n);
    run_stop(B, r, k);
    if (rc) return rc;
    fprintf(stderr, "cairn: %-10s %6d tokens in %8.3f s: %9.2f tok/s (cpu share %.2f, probes %.1f / %.1f GB/s%s)\n",
            name, n, r->seconds, r->tok_s, r->cpu_share, r->bw_before, r->bw_after, r->reliable ? "" : ", unreliable");
    return 0;
}

/* A fresh state absorbs ctx tokens (their seconds into *prefix_s), then a chunk of n more is
 * timed between two bandwidth probes. */
static int measure_long(bench *B, run *r, int ctx, int n, double *prefix_s) {
    memset(r, 0, sizeof *r);
    r->name = "prefill_long";
    r->tokens = n;
    r->ctx0 = ctx;
    int rc = cn_state_reset(B->s);
    if (rc) return rc;
    double t0 = now_s();
    rc = prefill(B, ctx);
    *prefix_s = now_s() - t0;
    if (rc) return rc;
    cn_batch b = {.tokens = B->toks + ctx, .n = n, .logits = B->logits};
    run_clock k = run_start(B, r);
    rc = cn_model_forward(B->m, B->s, &b);
    run_stop(B, r, k);
    if (rc) return rc;
    fprintf(stderr, "cairn: %-10s %6d tokens at context %d in %8.3f s: %9.2f tok/s (cpu share %.2f, probes "
                    "%.1f / %.1f GB/s%s; the prefix at %.2f tok/s)\n",
            r->name, n, ctx, r->seconds, r->tok_s, r->cpu_share, r->bw_before, r->bw_after,
            r->reliable ? "" : ", unreliable", *prefix_s > 0 ? ctx / *prefix_s : 0);
    return 0;
}

/* n fresh states decode gen tokens each in steps of one token a state (cn_model_forward_seqs),
 * timed between two bandwidth probes; each state starts from its own prompt token. */
static int measure_parallel(bench *B, run *r, int n, int gen) {
    memset(r, 0, sizeof *r);
    r->name = "decode_parallel";
    r->tokens = n * gen;
    cn_state **st = calloc((size_t)n, sizeof *st);
    cn_seq_batch *sb = calloc((size_t)n, sizeof *sb);
    int32_t *tok = calloc((size_t)n, sizeof *tok);
    int rc = st && sb && tok ? CN_OK : CN_ENOMEM;
    for (int i = 0; !rc && i < n; i++) {
        rc = cn_state_create(&st[i], B->m, gen + 1, 0);
        tok[i] = B->toks[i];
        sb[i] = (cn_seq_batch){.state = st[i], .tokens = &tok[i], .n = 1, .argmax = &tok[i]};
    }
    if (!rc) rc = cn_model_forward_seqs(B->m, sb, n); /* warm: the first step of this size */
    for (int i = 0; !rc && i < n; i++) rc = cn_state_reset(st[i]);
    if (!rc) {
        run_clock k = run_start(B, r);
        for (int t = 0; !rc && t < gen; t++) rc = cn_model_forward_seqs(B->m, sb, n);
        run_stop(B, r, k);
    }
    for (int i = 0; st && i < n; i++) cn_state_free(st[i]);
    free(st);
    free(sb);
    free(tok);
    if (rc) return rc;
    fprintf(stderr, "cairn: %-10s %6d tokens in %8.3f s: %9.2f tok/s, %d sequences (cpu share %.2f, probes %.1f / %.1f GB/s%s)\n",
            r->name, r->tokens, r->seconds, r->tok_s, n, r->cpu_share, r->bw_before, r->bw_after,
            r->reliable ? "" : ", unreliable");
    return 0;
}

/* The two decode runs, interleaved so that both see the same machine. */
typedef struct decode_pair {
    run start, ctx;           /* totals over every burst of each side (run.bw time-weighted) */
    int bursts;               /* bursts per side */
    int burst_tokens;         /* tokens per burst (the last may hold fewer) */
    int agree;                /* pairs (start burst k, context burst k) whose 3 probes agree */
    double over_start;        /* context tok/s over start tok/s, median of the agreeing pairs (0 if none) */
    double over_start_cpu;    /* start CPU seconds over context CPU seconds, every burst */
    double over_start_token;  /* the start's median token seconds over the context's */
    double roof_n[2], roof_bw[2]; /* per side, reliable bursts (all if none): tokens, sum of
                                   * seconds x GB/s */
    int roof_reliable[2];     /* bursts the roofline figures came from were reliable */
    double *pair_ratio;       /* [bursts] per pair: context tok/s over start tok/s */
    unsigned char *pair_ok;   /* [bursts] whether that pair's probes and CPU shares agree */
} decode_pair;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n) (sorted in place); 0 if n is 0. */
static double median(double *v, int n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The median of the agreeing pairs' ratios; 0 if none. */
static double median_agreeing(const decode_pair *d) {
    double v[MAX_BURSTS];
    int n = 0;
    for (int k = 0; k < d->bursts && n < MAX_BURSTS; k++)
        if (d->pair_ok[k]) v[n++] = d->pair_ratio[k];
    return median(v, n);
}

/* One burst of n decodes on s between the probe already taken (*bw, updated to the one after). */
static int burst(bench *B, cn_state *s, int32_t *tok, int n, double *bw, run *r, double *sec, double *cpu,
                 double *tsec) {
    double t0 = now_s(), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    int rc = decode_times(B, s, tok, n, tsec);
    *sec = now_s() - t0;
    *cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
    double after = probe_bw(B);
    r->seconds += *sec;
    r->bw += *sec * (*bw + after) / 2; /* divided by the seconds at the end */
    if (r->bw_before == 0) r->bw_before = *bw;
    r->bw_after = after;
    *bw = after;
    return rc;
}

/* `gen` decodes from a fresh state s0 and `gen` from s (which absorbs `ctx` tokens first, timed
 * into *ctx_seconds), in bursts of `bt` tokens taken in turn: probe, start burst, probe, context
 * burst, probe, ... so that a start burst and the context burst after it share their middle
 * probe. The machine's memory bandwidth switches level every few minutes; two runs minutes apart
 * compared two machines, bursts fractions of a second apart compare one. */
static int measure_decode_pair(bench *B, cn_state *s0, int ctx, int gen, int bt, decode_pair *d,
                               double *ctx_seconds) {
    int rc = cn_state_reset(B->s);
    if (!rc) rc = cn_state_reset(s0);
    if (!rc) {
        double t0 = now_s();
        rc = prefill(B, ctx);
        *ctx_seconds = now_s() - t0;
    }
    if (rc) return rc;
    if ((gen + bt - 1) / bt > MAX_BURSTS) bt = (gen + MAX_BURSTS - 1) / MAX_BURSTS;
    d->bursts = (gen + bt - 1) / bt;
    d->burst_tokens = bt;
    d->pair_ratio = calloc((size_t)d->bursts, sizeof *d->pair_ratio);
    d->pair_ok = calloc((size_t)d->bursts, 1);
    double *sec = calloc((size_t)d->bursts * 2, sizeof *sec), *bws = calloc((size_t)d->bursts * 2 + 1, sizeof *bws);
    double *tsec = calloc((size_t)gen * 2, sizeof *tsec); /* each side's token seconds */
    if (!d->pair_ratio || !d->pair_ok || !sec || !bws || !tsec) {
        free(sec);
        free(bws);
        free(tsec);
        return CN_ENOMEM;
    }
    run *side[2] = {&d->start, &d->ctx};
    side[0]->name = "decode", side[1]->name = "decode_8k";
    side[0]->ctx0 = 0, side[1]->ctx0 = ctx;
    int32_t tok[2] = {B->toks[0], B->toks[0]};
    cn_state *st[2] = {s0, B->s};
    double cpu[2] = {0, 0}, bw = probe_bw(B);
    bws[0] = bw;
    for (int k = 0; !rc && k < d->bursts; k++) {
        int n = gen - k * bt < bt ? gen - k * bt : bt;
        double share[2] = {0, 0};
        for (int i = 0; !rc && i < 2; i++) {
            double c;
            rc = burst(B, st[i], &tok[i], n, &bw, side[i], &sec[2 * k + i], &c, tsec + i * gen + k * bt);
            cpu[i] += c;
            share[i] = sec[2 * k + i] > 0 ? c / (sec[2 * k + i] * B->n_threads) : 0;
            side[i]->tokens += n;
            bws[2 * k + i + 1] = bw;
        }
        if (rc) break;
        /* one machine: the same memory speed around both, and the same share of the cores */
        double lo = fmin(fmin(bws[2 * k], bws[2 * k + 1]), bws[2 * k + 2]);
        double hi = fmax(fmax(bws[2 * k], bws[2 * k + 1]), bws[2 * k + 2]);
        d->pair_ok[k] = probes_agree(lo, hi) && probes_agree(share[0], share[1]);
        d->pair_ratio[k] = sec[2 * k + 1] > 0 ? sec[2 * k] / sec[2 * k + 1] : 0; /* same n each side */
        d->agree += d->pair_ok[k];
    }
    if (!rc) {
        /* the median pair: one burst that another job's spike slowed moves it little */
        d->over_start = median_agreeing(d);
        d->over_start_cpu = cpu[1] > 0 ? cpu[0] / cpu[1] : 0;
        double m0 = median(tsec, gen), m1 = median(tsec + gen, gen);
        d->over_start_token = m1 > 0 ? m0 / m1 : 0;
        side[0]->tok_s_median = m0 > 0 ? 1 / m0 : 0;
        side[1]->tok_s_median = m1 > 0 ? 1 / m1 : 0;
        double ts = 0, tc = 0; /* the same tokens each side */
        for (int k = 0; k < d->bursts; k++) ts += sec[2 * k], tc += sec[2 * k + 1];
        for (int i = 0; i < 2; i++) {
            run *r = side[i];
            r->tok_s = r->seconds > 0 ? r->tokens / r->seconds : 0;
            r->bw = r->seconds > 0 ? r->bw / r->seconds : 0;
            r->cpu_share = r->seconds > 0 ? cpu[i] / (r->seconds * B->n_threads) : 0;
            int good = 0;
            for (int k = 0; k < d->bursts; k++) good += probes_agree(bws[2 * k + i], bws[2 * k + i + 1]);
            r->reliable = 2 * good >= d->bursts; /* most of its bursts saw one machine */
            d->roof_reliable[i] = good > 0;
            for (int k = 0; k < d->bursts; k++) {
                if (good && !probes_agree(bws[2 * k + i], bws[2 * k + i + 1])) continue;
                int n = gen - k * bt < bt ? gen - k * bt : bt;
                d->roof_n[i] += n;
                d->roof_bw[i] += sec[2 * k + i] * (bws[2 * k + i] + bws[2 * k + i + 1]) / 2;
            }
            fprintf(stderr, "cairn: %-10s %6d tokens in %8.3f s: %9.2f tok/s (cpu share %.2f, %d bursts, %d with "
                            "agreeing probes, %.1f GB/s)\n",
                    r->name, r->tokens, r->seconds, r->tok_s, r->cpu_share, d->bursts, good, r->bw);
        }
        fprintf(stderr, "cairn: decode_8k over decode %.3f over every burst; %.3f over the %d of %d pairs that saw "
                        "one machine; CPU seconds %.3f; median token %.3f\n", ts > 0 && tc > 0 ? ts / tc : 0,
                d->over_start, d->agree, d->bursts, d->over_start_cpu, d->over_start_token);
    }
    free(sec);
    free(bws);
    free(tsec);
    return rc;
}

static void decode_pair_free(decode_pair *d) {
    free(d->pair_ratio);
    free(d->pair_ok);
}

/* ---- snapshot paging: the prefix cache's device tier ---------------------------------------- */

typedef struct paging {
    int offset;              /* tokens in the state the snapshots hold */
    uint64_t bytes;          /* one round's snapshots: every stateful layer at `offset` */
    double out_gbs, in_gbs;  /* best round: device buffers -> pinned host; pinned host -> live */
    double decode_tok_s;     /* decodes from `offset`, alone */
    double decode_paging_tok_s; /* the same decodes with a page-out of every snapshot in flight */
} paging;

/* Every stateful layer of the bench state, as the cache takes it: recurrent states and KV rows
 * [0, offset) copied into device buffers (queued with the ops). n_out: snapshots made. */
static int snaps_take(bench *B, cn_snap **sn, int *n_out) {
    const cn_state *s = B->s;
    int n = 0, rc = CN_OK;
    for (int l = 0; !rc && l < s->n_layers; l++) {
        cn_snap *p = NULL;
        if (s->layers[l].type == CN_BLOCK_MAMBA) {
            rc = cn_snap_state_take(s, l, CN_SNAP_DEVICE, &p);
        } else if (s->layers[l].type == CN_BLOCK_ATTN) {
            if (!(p = cn_snap_kv_lazy(s, l, 0, s->offset))) rc = CN_ENOMEM;
            else rc = cn_snap_materialize(p, s, l, CN_SNAP_DEVICE);
        } else {
            continue;
        }
        if (!rc && p->tier != CN_SNAP_DEVICE) rc = CN_ENOMEM; /* the device had no room */
        if (p) sn[n++] = p;
    }
    *n_out = n;
    if (!rc) rc = cn_backend_sync(B->be);
    return rc;
}

static void snaps_free(cn_snap **sn, int n) {
    for (int i = 0; i < n; i++) cn_snap_free(sn[i]);
}

static int snaps_to_host(cn_snap **sn, int n) {
    int rc = CN_OK;
    for (int i = 0; !rc && i < n; i++) rc = cn_snap_to_host(sn[i]);
    return rc;
}

static int snaps_wait(bench *B, cn_snap **sn, int n) {
    int rc = CN_OK;
    for (int i = 0; !rc && i < n; i++) rc = cn_backend_fence_wait(B->be, sn[i]->fence, 1);
    return rc;
}

/* Restores the state to `offset` from the snapshots (either tier), waiting until it is there. */
static int snaps_restore(bench *B, cn_snap **sn, int n, int offset) {
    cn_state *s = B->s;
    int rc = CN_OK;
    for (int l = 0, i = 0; !rc && l < s->n_layers && i < n; l++) {
        if (s->layers[l].type == CN_BLOCK_MAMBA) rc = cn_snap_state_restore(sn[i++], s, l);
        else if (s->layers[l].type == CN_BLOCK_ATTN) rc = cn_snap_kv_restore(sn[i++], s, l, 0, offset);
    }
    if (!rc) rc = cn_backend_sync(B->be);
    if (!rc) s->offset = offset;
    return rc;
}

/* Pages every stateful layer's snapshot of a `prompt`-token state out to pinned host memory and
 * back into the live state, best of three rounds (the first also pins its host buffers); then
 * times `gen` decodes alone and with such a page-out queued on the copy stream behind them. */
static int measure_paging(bench *B, int prompt, int gen, paging *pg) {
    memset(pg, 0, sizeof *pg);
    cn_snap **sn = calloc((size_t)B->s->n_layers + 1, sizeof *sn);
    if (!sn) return CN_ENOMEM;
    int n = 0, rc = cn_state_reset(B->s);
    if (!rc) rc = prefill(B, prompt);
    int o = B->s->offset;
    pg->offset = o;
    if (gen > B->s->max_ctx - o) gen = B->s->max_ctx - o; /* the decodes stay inside the state */
    for (int round = 0; !rc && round < 3; round++) {
        if ((rc = snaps_take(B, sn, &n))) break;
        pg->bytes = 0;
        for (int i = 0; i < n; i++) pg->bytes += sn[i]->bytes;
        double t0 = now_s();
        rc = snaps_to_host(sn, n);
        if (!rc) rc = snaps_wait(B, sn, n);
        double t1 = now_s();
        if (!rc) rc = snaps_restore(B, sn, n, o);
        double t2 = now_s();
        if (!rc && t1 > t0 && pg->bytes / (t1 - t0) / 1e9 > pg->out_gbs) pg->out_gbs = pg->bytes / (t1 - t0) / 1e9;
        if (!rc && t2 > t1 && pg->bytes / (t2 - t1) / 1e9 > pg->in_gbs) pg->in_gbs = pg->bytes / (t2 - t1) / 1e9;
        snaps_free(sn, n);
        n = 0;
    }
    if (!rc) rc = snaps_take(B, sn, &n);
    if (!rc) {
        double t0 = now_s();
        rc = decode(B, gen);
        double t1 = now_s();
        if (!rc) pg->decode_tok_s = t1 > t0 ? gen / (t1 - t0) : 0;
    }
    if (!rc) rc = snaps_restore(B, sn, n, o); /* from the device copies */
    if (!rc) {
        double t0 = now_s();
        rc = snaps_to_host(sn, n); /* queued: the decodes run while it copies */
        if (!rc) rc = decode(B, gen);
        if (!rc) rc = snaps_wait(B, sn, n);
        double t1 = now_s();
        if (!rc) pg->decode_paging_tok_s = t1 > t0 ? gen / (t1 - t0) : 0;
    }
    snaps_free(sn, n);
    free(sn);
    if (!rc)
        fprintf(stderr, "cairn: snapshots of %d tokens, %.1f MiB: page-out %.2f GB/s, page-in %.2f GB/s; "
                        "decode %.2f tok/s, %.2f with a page-out in flight\n",
                o, pg->bytes / 1048576.0, pg->out_gbs, pg->in_gbs, pg->decode_tok_s, pg->decode_paging_tok_s);
    return rc;
}

/* VmHWM in bytes, 0 if unreadable. */
static uint64_t vm_hwm(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kb = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb << 10;
}

/* Resets VmHWM to the current RSS (Linux clear_refs 5). 1 on success. */
static int reset_hwm(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return 0;
    int ok = fputs("5", f) >= 0;
    ok &= fclose(f) == 0;
    return ok;
}

/* The stored weight format, from the bytes per dtype. NVFP4 stores U8 weights with E4M3 scales
 * (an eighth of their bytes), MXFP8 E4M3 weights with U8 scales (a thirty-second), FP8 E4M3
 * weights alone; whatever else is kept (embeddings, lm_head, attention) stays BF16 or F32. */
static const char *stored_format(const cn_model_stats *st) {
    uint64_t u8 = st->bytes[CN_U8], f8 = st->bytes[CN_F8_E4M3];
    if (u8 && u8 > f8) return "nvfp4";
    if (f8) return u8 ? "mxfp8" : "fp8";
    if (st->bytes[CN_F32] > st->bytes[CN_BF16] && st->bytes[CN_F32] > st->bytes[CN_F16]) return "f32";
    return st->bytes[CN_F16] > st->bytes[CN_BF16] ? "f16" : "bf16";
}

/* ---- report --------------------------------------------------------------------------------- */

static cJSON *run_json(const run *r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "tokens", r->tokens);
    cJSON_AddNumberToObject(o, "context", r->ctx0);
    cJSON_AddNumberToObject(o, "seconds", r->seconds);
    cJSON_AddNumberToObject(o, "tok_s", r->tok_s);
    cJSON_AddNumberToObject(o, "cpu_share", r->cpu_share);
    cJSON_AddNumberToObject(o, "probe_before_gbs", r->bw_before);
    cJSON_AddNumberToObject(o, "probe_after_gbs", r->bw_after);
    cJSON_AddBoolToObject(o, "reliable", r->reliable);
    if (r->tok_s_median > 0) cJSON_AddNumberToObject(o, "median_token_tok_s", r->tok_s_median);
    return o;
}

static int pattern_counts(const char *pat, int n[N_TYPES]) {
    memset(n, 0, N_TYPES * sizeof *n);
    int len = 0;
    for (; pat[len]; len++) n[cn_block_index((cn_block)pat[len])]++;
    return len;
}

int cn_bench_model(int argc, char **argv) {
    const char *model = NULL, *preset = NULL, *weights = NULL, *backend = NULL, *work_dir = NULL;
    int layers = 0, prompt = 2048, prompt_short = -1, context = 8192, gen = 64, threads = 0, ubatch = 0;
    int probe_mb = 512, json = 0, burst_tokens = 8, long_ctx = 32768, parallel = 4;
    uint64_t seed = 0;
    cn_flag flags[] = {
        {"model", CN_FLAG_STR, &model, "DIR", "model directory to bench", 0, 0},
        {"preset", CN_FLAG_STR, &preset, "NAME", "random weights of a preset's shapes: " CN_SYNTH_PRESETS, 0, 0},
        {"layers", CN_FLAG_INT, &layers, "N", "with --preset: its first N layers (figures for the whole preset are projected)", 0, 0},
        {"seed", CN_FLAG_U64, &seed, "N", "with --preset: random seed (default 0)", 0, 0},
        {"weights", CN_FLAG_STR, &weights, "T", "bf16 (default for a preset), fp8, mxfp8, nvfp4; with --model, converts it", 0, 0},
        {"prompt", CN_FLAG_INT, &prompt, "N", "tokens of the long prefill (default 2048)", 0, 0},
        {"prompt-short", CN_FLAG_INT, &prompt_short, "N", "tokens of the short prefill (default min(512, --prompt))", 0, 0},
        {"context", CN_FLAG_INT, &context, "N", "context before the second decode run (default 8192)", 0, 0},
        {"long-context", CN_FLAG_INT, &long_ctx, "N", "context before the long-context prefill chunk (default 32768; 0: none)", 0, 0},
        {"gen", CN_FLAG_INT, &gen, "N", "tokens per decode run (default 64)", 0, 0},
        {"parallel", CN_FLAG_INT, &parallel, "N", "sequences decoding at once in the parallel run (default 4; 0 or 1: none)", 0, 0},
        {"burst", CN_FLAG_INT, &burst_tokens, "N", "decode tokens per burst, the two decode runs taking turns (default 8)", 0, 0},
        {"threads", CN_FLAG_INT, &threads, "N", "CPU threads, model and probes (default: all cores)", 0, 0},
        {"backend", CN_FLAG_STR, &backend, "NAME", "cpu, cuda or cuda:N (default: $CAIRN_BACKEND or cpu)", 0, 0},
        {"ubatch", CN_FLAG_INT, &ubatch, "N", "tokens per forward chunk (default: the model's)", 0, 0},
        {"probe-mb", CN_FLAG_INT, &probe_mb, "MB", "bandwidth probe buffer in MiB, far above the caches (default 512)", 0, 0},
        {"work-dir", CN_FLAG_STR, &work_dir, "DIR", "build the preset's checkpoint here and keep it (reused when present)", 0, 0},
        {"json", CN_FLAG_BOOL, &json, NULL, "print one JSON object", 0, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int rc = cn_flags_parse(flags, argc, argv, kSynopsis);
    if (rc) {
        if (rc == 1)
            fputs("\nother benchmarks: cairn bench tokenizer | cache | serve | constraint | speculate [options]\n", stdout);
        return rc > 0 ? 0 : 2;
    }
    const char *bad = NULL;
    if (!!model == !!preset) bad = "give exactly one of --model and --preset";
    else if (layers && !preset) bad = "--layers needs --preset";
    else if (layers < 0) bad = "--layers must not be negative";
    else if (prompt < 1 || context < 1 || gen < 1) bad = "--prompt, --context and --gen must be at least 1";
    else if (burst_tokens < 1) bad = "--burst must be at least 1";
    else if (prompt_short == 0 || prompt_short < -1) bad = "--prompt-short must be at least 1";
    else if (probe_mb < 1 || probe_mb > (1 << 20)) bad = "--probe-mb must be in 1..1048576";
    else if (ubatch < 0) bad = "--ubatch must not be negative";
    else if (long_ctx < 0) bad = "--long-context must not be negative";
    else if (parallel < 0) bad = "--parallel must not be negative";
    cn_qalgo algo = CN_QALGO_NONE;
    if (!bad && weights) {
        if (!strcmp(weights, "nvfp4")) algo = CN_QALGO_NVFP4;
        else if (!strcmp(weights, "mxfp8")) algo = CN_QALGO_MXFP8;
        else if (!strcmp(weights, "fp8")) algo = CN_QALGO_FP8;
        else if (strcmp(weights, "bf16")) bad = "--weights must be bf16, fp8, mxfp8 or nvfp4";
    }
    if (bad) {
        fprintf(stderr, "cairn: %s\n", bad);
        cn_flags_usage(flags, kSynopsis, stderr);
        fputs("\nother benchmarks: cairn bench tokenizer | cache | serve | constraint | speculate [options]\n", stderr);
        return 2;
    }
    if (prompt_short < 0) prompt_short = prompt < 512 ? prompt : 512;
    if (!weights) weights = model ? "stored" : "bf16";

    /* 1. the checkpoint, then the high-water mark reset so that building it does not count */
    ckpt ck;
    bench B = {0};
    cn_state *s0 = NULL; /* the decode run from a fresh state; B.s takes the context */
    decode_pair dp;
    memset(&dp, 0, sizeof dp);
    cn_backend *be = NULL;
    cJSON *out = NULL;
    int status = 1;
    if (ckpt_prepare(&ck, model, preset, layers, seed, weights, algo, work_dir)) goto done;

    /* 2. the probe buffer first: resident from here on, so VmHWM - probe_bytes is the rest's peak */
    B.probe_bytes = (size_t)probe_mb << 20;
    int hwm_reset = reset_hwm();
    if (!(B.probe = cn_probe_buf_alloc(B.probe_bytes))) {
        fprintf(stderr, "cairn: cannot allocate the %d MiB probe buffer\n", probe_mb);
        goto done;
    }
    int n_threads = threads > 0 ? threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads < 1) n_threads = 1;
    B.n_threads = n_threads;
    if (!(B.pool = cn_pool_create(n_threads))) {
        fprintf(stderr, "cairn: cannot create %d threads\n", n_threads);
        goto done;
    }

    /* 3. the model and one state big enough for every run */
    double t_open = now_s();
    if (cn_cli_open_model(ck.dir, backend, threads, ubatch, &be, &B.m)) goto done;
    t_open = now_s() - t_open;
    B.be = be;
    const cn_config *cfg = cn_model_config(B.m);
    B.vocab = cfg->vocab_size;
    int max_ctx = prompt > prompt_short ? prompt : prompt_short;
    if (context + gen > max_ctx) max_ctx = context + gen;
    if (long_ctx && long_ctx + prompt_short > max_ctx) max_ctx = long_ctx + prompt_short;
    if ((rc = cn_state_create(&B.s, B.m, max_ctx + 1, 0))) {
        fprintf(stderr, "cairn: state of %d tokens: %s\n", max_ctx + 1, cn_strerror(rc));
        goto done;
    }
    if ((rc = cn_state_create(&s0, B.m, gen + 1, 0))) {
        fprintf(stderr, "cairn: state of %d tokens: %s\n", gen + 1, cn_strerror(rc));
        goto done;
    }
    B.toks = malloc((size_t)max_ctx * sizeof *B.toks);
    B.logits = malloc((size_t)B.vocab * sizeof *B.logits);
    if (!B.toks || !B.logits) {
        fprintf(stderr, "cairn: out of memory\n");
        goto done;
    }
    uint64_t x = 0x2545f4914f6cdd1dull ^ seed;
    int lo = B.vocab > 40 ? 20 : 0; /* ids 0..19 are the special tokens */
    for (int i = 0; i < max_ctx; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        B.toks[i] = lo + (int32_t)(x % (uint64_t)(B.vocab - lo));
    }
    cn_model_stats st;
    cn_model_stats_get(B.m, &st);
    cn_decode_traffic tr;
    cn_model_decode_traffic(B.m, &tr);
    const char *format = stored_format(&st);

    /* 4. the machine: peak arithmetic of the weights' kernel (a device backend: its own GEMM
     * peak, memory bandwidth and host link, cn_backend_measure) */
    const char *peak_what = NULL;
    char peak_mix[512];
    double peak = 0;
    cn_backend_limits lim;
    rc = cn_backend_measure(be, CN_LIMIT_MEM | CN_LIMIT_PEAK | CN_LIMIT_LINK, &lim);
    if (rc && rc != CN_EUNSUPPORTED) {
        fprintf(stderr, "cairn: measuring the %s device: %s\n", cn_backend_name(be), cn_strerror(rc));
        goto done;
    }
    B.device = rc == CN_OK;
    if (B.device) {
        peak = lim.peak_gops;
        peak_what = lim.peak_what;
        fprintf(stderr, "cairn: device memory %.1f GB/s, host link %.1f / %.1f GB/s (to / from the device)\n",
                lim.mem_gbs, lim.h2d_gbs, lim.d2h_gbs);
    } else {
        /* The tile probes time the prefill kernels' own instruction mix (bench_probe.h). An
         * NVFP4 checkpoint keeps some modules BF16: its peak is what the two tiles together
         * reach on its parameters, the time of each one's share at its own peak summed. */
        const double P = (double)tr.prefill_params, f4 = P > 0 ? tr.prefill_params_nvfp4 / P : 0;
        if (!strcmp(format, "nvfp4") && f4 < 1) {
            const char *w4 = NULL, *w16 = NULL;
            double p4 = cn_probe_peak(B.pool, CN_PEAK_NVFP4_TILE, PEAK_SECONDS / 2, &w4);
            double p16 = cn_probe_peak(B.pool, CN_PEAK_BF16_TILE, PEAK_SECONDS / 2, &w16);
            peak = p4 > 0 && p16 > 0 ? 1.0 / (f4 / p4 + (1 - f4) / p16) : 0;
            snprintf(peak_mix, sizeof peak_mix, "%.0f%% of parameters at %.1f Gop/s (%s), %.0f%% at %.1f (%s)",
                     100 * f4, p4, w4, 100 * (1 - f4), p16, w16);
            peak_what = peak_mix;
        } else {
            cn_peak_kind kind = !strcmp(format, "nvfp4") ? CN_PEAK_NVFP4_TILE
                                : !strcmp(format, "bf16") ? CN_PEAK_BF16_TILE
                                                          : CN_PEAK_FP32_FMA;
            peak = cn_probe_peak(B.pool, kind, PEAK_SECONDS, &peak_what);
        }
    }
    fprintf(stderr, "cairn: peak %.1f Gop/s (%s); %s weights, %d layers \"%s\", %d threads\n", peak, peak_what,
            format, cfg->n_layers, cfg->layers, n_threads);

    /* 5. warm-up, then the four timed runs */
    /* a first piece of each timed prefill's size: on a GPU the first use of a shape loads its
     * kernels and grows the device scratch, which must not land in a timed run */
    const int wu = cn_model_ubatch(B.m);
    const int warm[2] = {prompt_short < wu ? prompt_short : wu, prompt < wu ? prompt : wu};
    rc = 0;
    for (int i = 0; i < 2 && !rc; i++) {
        if (i == 1 && warm[1] == warm[0]) break;
        if ((rc = cn_state_reset(B.s)) == 0 && warm[i] > 0) rc = prefill(&B, warm[i]);
    }
    /* the decodes from a fresh state: after a warm-up of the whole prompt (ubatch >= --prompt)
     * they would not fit in it */
    if (rc || (rc = cn_state_reset(B.s)) || (rc = decode(&B, 2))) {
        fprintf(stderr, "cairn: warm-up forward: %s\n", cn_strerror(rc));
        goto done;
    }
    run r512, r2k, reager;
    memset(&reager, 0, sizeof reager);
    double ctx_s = 0;
    /* a device's bandwidth holds still, and each switch of state there re-captures its step:
     * one burst a side, the start's then the context's */
    if ((rc = measure(&B, &r512, "prefill512", 0, prompt_short)) ||
        (rc = measure(&B, &r2k, "prefill", 0, prompt)) ||
        (rc = measure_decode_pair(&B, s0, context, gen, B.device ? gen : burst_tokens, &dp, &ctx_s))) {
        fprintf(stderr, "cairn: forward: %s\n", cn_strerror(rc));
        goto done;
    }
    const run rdec = dp.start, rdec8k = dp.ctx;
    /* several sequences decoding at once, a step a token for each: capped by the model's piece */
    run rpar;
    memset(&rpar, 0, sizeof rpar);
    rpar.name = "decode_parallel";
    if (parallel > cn_model_ubatch(B.m)) parallel = cn_model_ubatch(B.m);
    if (parallel >= 2 && (rc = measure_parallel(&B, &rpar, parallel, gen))) {
        fprintf(stderr, "cairn: parallel decode: %s\n", cn_strerror(rc));
        goto done;
    }
    if (parallel < 2) parallel = 0;
    /* the start's chunk again after a long prefix, and the FMA peak attention is held to */
    run rlong;
    memset(&rlong, 0, sizeof rlong);
    rlong.name = "prefill_long";
    double long_prefix_s = 0, att_peak = 0;
    const char *att_peak_what = "";
    if (long_ctx && (rc = measure_long(&B, &rlong, long_ctx, prompt_short, &long_prefix_s))) {
        fprintf(stderr, "cairn: forward: %s\n", cn_strerror(rc));
        goto done;
    }
    if (long_ctx && !B.device) att_peak = cn_probe_peak(B.pool, CN_PEAK_FP32_FMA, PEAK_SECONDS / 2, &att_peak_what);
    const double att_add = attention_ops(cfg, long_ctx, prompt_short) - attention_ops(cfg, 0, prompt_short);
    const double att_dt = rlong.seconds - r512.seconds;
    const double att_gops = long_ctx && att_dt > 0 ? att_add / att_dt / 1e9 : 0;
    /* a device backend: decode again with its steps launched op by op instead of replayed */
    if (B.device) {
        if (!(rc = cn_backend_set_record(be, 0))) rc = measure(&B, &reager, "decode_eager", 1, gen);
        int rc2 = cn_backend_set_record(be, 1);
        if (rc || (rc = rc2)) {
            fprintf(stderr, "cairn: forward: %s\n", cn_strerror(rc));
            goto done;
        }
    }
    /* a device backend: the prefix cache's snapshots paged between device and host */
    paging pg;
    memset(&pg, 0, sizeof pg);
    if (B.device && (rc = measure_paging(&B, prompt, gen, &pg))) {
        fprintf(stderr, "cairn: snapshot paging: %s\n", cn_strerror(rc));
        goto done;
    }

    /* 6. figures */
    double kv = (double)tr.kv_per_ctx;
    double bpt = (double)tr.weights + tr.state_fixed + kv * (gen - 1) / 2.0;
    double bpt8k = (double)tr.weights + tr.state_fixed + kv * (context + (gen - 1) / 2.0);
    /* bytes the bursts read over bytes the memory could have given in their time, over the
     * bursts whose probes agree */
    double roof = dp.roof_bw[0] > 0 ? dp.roof_n[0] * bpt / (dp.roof_bw[0] * 1e9) : 0;
    double roof8k = dp.roof_bw[1] > 0 ? dp.roof_n[1] * bpt8k / (dp.roof_bw[1] * 1e9) : 0;
    double P = (double)tr.prefill_params;
    double gops2k = 2 * P * r2k.tok_s / 1e9, gops512 = 2 * P * r512.tok_s / 1e9;
    uint64_t hwm = vm_hwm();
    uint64_t peak_mem = hwm > B.probe_bytes ? hwm - B.probe_bytes : hwm;

    out = cJSON_CreateObject();
    cJSON_AddNumberToObject(out, "prefill_tok_s", r2k.tok_s);
    cJSON_AddNumberToObject(out, "prefill512_tok_s", r512.tok_s);
    cJSON_AddNumberToObject(out, "decode_tok_s", rdec.tok_s);
    cJSON_AddNumberToObject(out, "decode_8k_tok_s", rdec8k.tok_s);
    cJSON_AddNumberToObject(out, "bytes_per_token", bpt);
    cJSON_AddNumberToObject(out, "mem_bw_gbs", rdec.bw);
    cJSON_AddNumberToObject(out, "decode_roofline_ratio", roof);
    cJSON_AddNumberToObject(out, "peak_gops", peak);
    cJSON_AddNumberToObject(out, "prefill_compute_ratio", peak > 0 ? gops2k / peak : 0);
    cJSON_AddNumberToObject(out, "peak_memory_bytes", (double)peak_mem);
    /* extras */
    cJSON_AddStringToObject(out, "model", preset ? preset : model);
    if (preset) cJSON_AddNumberToObject(out, "layers", cfg->n_layers);
    cJSON_AddStringToObject(out, "pattern", cfg->layers);
    cJSON_AddStringToObject(out, "weights", format);
    cJSON_AddStringToObject(out, "backend", backend ? backend : cn_backend_default_name());
    cJSON_AddNumberToObject(out, "threads", n_threads);
    cJSON_AddStringToObject(out, "peak_instruction", peak_what);
    cJSON_AddNumberToObject(out, "prompt_tokens", prompt);
    cJSON_AddNumberToObject(out, "prompt_short_tokens", prompt_short);
    cJSON_AddNumberToObject(out, "decode_context", context);
    cJSON_AddNumberToObject(out, "gen_tokens", gen);
    cJSON_AddNumberToObject(out, "bytes_per_token_8k", bpt8k);
    cJSON_AddNumberToObject(out, "mem_bw_8k_gbs", rdec8k.bw);
    cJSON_AddNumberToObject(out, "decode_8k_roofline_ratio", roof8k);
    cJSON_AddNumberToObject(out, "decode_8k_over_start", rdec.tok_s > 0 ? rdec8k.tok_s / rdec.tok_s : 0);
    cJSON_AddNumberToObject(out, "decode_8k_over_start_agreeing", dp.over_start);
    cJSON_AddNumberToObject(out, "decode_8k_over_start_cpu", dp.over_start_cpu);
    cJSON_AddNumberToObject(out, "decode_8k_over_start_token_median", dp.over_start_token);
    cJSON_AddNumberToObject(out, "decode_bursts", dp.bursts);
    cJSON_AddNumberToObject(out, "decode_burst_tokens", dp.burst_tokens);
    cJSON_AddNumberToObject(out, "decode_pairs_agreeing", dp.agree);
    cJSON_AddBoolToObject(out, "decode_roofline_from_agreeing", dp.roof_reliable[0]);
    {
        cJSON *pr = cJSON_AddArrayToObject(out, "decode_pair_ratios");
        for (int k = 0; k < dp.bursts; k++)
            cJSON_AddItemToArray(pr, cJSON_CreateNumber(dp.pair_ok[k] ? dp.pair_ratio[k] : -dp.pair_ratio[k]));
    }
    cJSON_AddNumberToObject(out, "weight_bytes_per_token", (double)tr.weights);
    cJSON_AddNumberToObject(out, "state_bytes_per_token", (double)tr.state_fixed);
    cJSON_AddNumberToObject(out, "kv_bytes_per_context_token", (double)tr.kv_per_ctx);
    cJSON_AddNumberToObject(out, "prefill_params", P);
    cJSON_AddNumberToObject(out, "prefill_params_nvfp4", (double)tr.prefill_params_nvfp4);
    cJSON_AddNumberToObject(out, "active_params", (double)st.active_params);
    cJSON_AddNumberToObject(out, "params", (double)(st.params - st.params_mtp));
    cJSON_AddNumberToObject(out, "prefill_gops", gops2k);
    cJSON_AddNumberToObject(out, "prefill512_gops", gops512);
    cJSON_AddNumberToObject(out, "prefill512_compute_ratio", peak > 0 ? gops512 / peak : 0);
    cJSON_AddNumberToObject(out, "prefill_ctx_tok_s", ctx_s > 0 ? context / ctx_s : 0);
    if (parallel) {
        cJSON_AddNumberToObject(out, "decode_parallel_sequences", parallel);
        cJSON_AddNumberToObject(out, "decode_parallel_tok_s", rpar.tok_s);
        cJSON_AddNumberToObject(out, "decode_parallel_speedup", rdec.tok_s > 0 ? rpar.tok_s / rdec.tok_s : 0);
    }
    if (long_ctx) {
        cJSON_AddNumberToObject(out, "prefill_long_context", long_ctx);
        cJSON_AddNumberToObject(out, "prefill_long_tok_s", rlong.tok_s);
        cJSON_AddNumberToObject(out, "prefill_long_over_start", r512.tok_s > 0 ? rlong.tok_s / r512.tok_s : 0);
        cJSON_AddNumberToObject(out, "prefill_long_prefix_tok_s", long_prefix_s > 0 ? long_ctx / long_prefix_s : 0);
        cJSON_AddNumberToObject(out, "prefill_long_prefix_seconds", long_prefix_s);
        cJSON_AddNumberToObject(out, "attention_gops", att_gops);
        cJSON_AddNumberToObject(out, "attention_peak_gops", att_peak);
        cJSON_AddStringToObject(out, "attention_peak_instruction", att_peak_what);
        cJSON_AddNumberToObject(out, "attention_compute_ratio", att_peak > 0 ? att_gops / att_peak : 0);
    }
    cJSON_AddNumberToObject(out, "vmhwm_bytes", (double)hwm);
    cJSON_AddNumberToObject(out, "probe_buffer_bytes", (double)B.probe_bytes);
    cJSON_AddBoolToObject(out, "hwm_reset_after_build", hwm_reset);
    cJSON_AddNumberToObject(out, "build_seconds", ck.build_s);
    cJSON_AddNumberToObject(out, "open_seconds", t_open);
    cJSON_AddStringToObject(out, "bandwidth_probe", B.device ? "device" : "host");
    if (B.device) {
        cJSON_AddNumberToObject(out, "device_mem_gbs_at_start", lim.mem_gbs);
        cJSON_AddNumberToObject(out, "host_to_device_gbs", lim.h2d_gbs);
        cJSON_AddNumberToObject(out, "device_to_host_gbs", lim.d2h_gbs);
        cJSON_AddNumberToObject(out, "decode_eager_tok_s", reager.tok_s);
        cJSON_AddNumberToObject(out, "decode_graph_speedup", reager.tok_s > 0 ? rdec.tok_s / reager.tok_s : 0);
        cJSON_AddNumberToObject(out, "snapshot_page_out_gbs", pg.out_gbs);
        cJSON_AddNumberToObject(out, "snapshot_page_in_gbs", pg.in_gbs);
        cJSON_AddNumberToObject(out, "snapshot_page_out_link_ratio", lim.d2h_gbs > 0 ? pg.out_gbs / lim.d2h_gbs : 0);
        cJSON_AddNumberToObject(out, "snapshot_page_in_link_ratio", lim.h2d_gbs > 0 ? pg.in_gbs / lim.h2d_gbs : 0);
        cJSON_AddNumberToObject(out, "snapshot_bytes", (double)pg.bytes);
        cJSON_AddNumberToObject(out, "snapshot_tokens", pg.offset);
        cJSON_AddNumberToObject(out, "decode_during_page_out_tok_s", pg.decode_paging_tok_s);
        cJSON_AddNumberToObject(out, "decode_beside_page_out_tok_s", pg.decode_tok_s);
    }
    cJSON *runs = cJSON_AddObjectToObject(out, "runs");
    const run *all[] = {&r512, &r2k, &rdec, &rdec8k};
    cJSON *unrel = cJSON_AddArrayToObject(out, "unreliable");
    for (int i = 0; i < 4; i++) {
        cJSON_AddItemToObject(runs, all[i]->name, run_json(all[i]));
        if (!all[i]->reliable) cJSON_AddItemToArray(unrel, cJSON_CreateString(all[i]->name));
    }
    if (B.device) cJSON_AddItemToObject(runs, reager.name, run_json(&reager));
    if (parallel) {
        cJSON_AddItemToObject(runs, rpar.name, run_json(&rpar));
        if (!rpar.reliable) cJSON_AddItemToArray(unrel, cJSON_CreateString(rpar.name));
    }
    if (long_ctx) {
        cJSON_AddItemToObject(runs, rlong.name, run_json(&rlong));
        if (!rlong.reliable) cJSON_AddItemToArray(unrel, cJSON_CreateString(rlong.name));
    }

    /* a slice of a preset: the whole preset, projected per layer type */
    cn_synth_info full;
    int have_full = 0;
    if (preset && layers) {
        cn_synth_opts o;
        cn_synth_opts_init(&o);
        o.preset = preset;
        o.mtp = 0;
        cn_err err;
        cn_err_clear(&err);
        have_full = cn_synth_describe(&o, &full, &err) == 0 && full.n_layers > cfg->n_layers;
    }
    double full_bpt = 0, full_P = 0, full_dec = 0, full_pre = 0;
    if (have_full) {
        /* per layer type: the slice's mean per layer times the whole preset's count; outside the
         * layers (embedding row, norm_f, lm_head) as measured */
        int nf[N_TYPES];
        pattern_counts(full.pattern, nf);
        full_bpt = (double)tr.weights_outer;
        for (int t = 0; t < N_TYPES; t++) {
            if (nf[t] && !tr.n_layer[t]) have_full = 0; /* a type the slice lacks: no projection */
            if (!tr.n_layer[t]) continue;
            full_bpt += (double)tr.weights_layer[t] / tr.n_layer[t] * nf[t];
            full_P += (double)tr.prefill_params_layer[t] / tr.n_layer[t] * nf[t];
        }
        int iM = cn_block_index(CN_BLOCK_MAMBA), iA = cn_block_index(CN_BLOCK_ATTN);
        if (tr.n_layer[iM]) full_bpt += (double)tr.state_fixed / tr.n_layer[iM] * nf[iM];
        if (tr.n_layer[iA]) full_bpt += kv / tr.n_layer[iA] * nf[iA] * (gen - 1) / 2.0;
        /* decode: the layers' share of a token's time scales with their bytes, the outer reads
         * (lm_head, embedding row) keep their time, taken at the probed bandwidth. Scaling the
         * whole token at the slice's roofline ratio instead credits every layer with the
         * lm_head's streaming efficiency: on the H200 that projected 524 tok/s for a model that
         * measured 245 (nvfp4), where this gives 253. */
        const double t_outer = rdec.bw > 0 ? tr.weights_outer / (rdec.bw * 1e9) : 0;
        const double t_layers = rdec.tok_s > 0 ? 1.0 / rdec.tok_s - t_outer : 0;
        const double slice_lb = bpt - tr.weights_outer, full_lb = full_bpt - tr.weights_outer;
        full_dec = t_layers > 0 && slice_lb > 0 ? 1.0 / (t_outer + t_layers * full_lb / slice_lb) : 0;
        full_pre = full_P > 0 ? gops2k * 1e9 / (2 * full_P) : 0;
    }
    if (have_full) {
        cJSON *f = cJSON_AddObjectToObject(out, "full_model_projected");
        cJSON_AddStringToObject(f, "note", "the whole preset, scaled per layer type from this slice; not measured");
        cJSON_AddNumberToObject(f, "layers", full.n_layers);
        cJSON_AddNumberToObject(f, "bytes_per_token", full_bpt);
        cJSON_AddNumberToObject(f, "prefill_params", full_P);
        cJSON_AddNumberToObject(f, "decode_tok_s_at_slice_layer_rate", full_dec);
        cJSON_AddNumberToObject(f, "prefill_tok_s_at_slice_gops", full_pre);
    }

    if (json) {
        char *txt = cJSON_PrintUnformatted(out);
        if (!txt) {
            fprintf(stderr, "cairn: out of memory\n");
            goto done;
        }
        puts(txt);
        free(txt);
    } else {
        printf("model        %s, %d layers \"%s\", %s weights, %s backend, %d threads\n",
               preset ? preset : model, cfg->n_layers, cfg->layers, format,
               backend ? backend : cn_backend_default_name(), n_threads);
        printf("machine      %.1f GB/s streaming read of %s memory (decode's probes), peak %.1f Gop/s (%s)\n",
               rdec.bw, B.device ? "device" : "host", peak, peak_what);
        if (B.device)
            printf("host link    %.1f GB/s to the device, %.1f GB/s back (pinned, 256 MiB copies)\n", lim.h2d_gbs,
                   lim.d2h_gbs);
        const run *shown[] = {&r512, &r2k, &rlong, &rdec, &rdec8k};
        for (int k = 0; k < 5; k++) {
            const run *r = shown[k];
            if (r == &rlong && !long_ctx) continue;
            printf("%-12s %6d tokens at context %5d: %9.2f tok/s  cpu share %.2f  probes %.1f / %.1f GB/s%s",
                   r->name, r->tokens, r->ctx0, r->tok_s, r->cpu_share, r->bw_before, r->bw_after,
                   r->reliable ? "" : "  UNRELIABLE");
            if (r->tok_s_median > 0) printf("  median token %.2f tok/s", r->tok_s_median);
            printf("\n");
        }
        if (B.device)
            printf("%-12s %6d tokens at context %5d: %9.2f tok/s  (steps launched op by op; graphs %.2fx)\n",
                   reager.name, reager.tokens, reager.ctx0, reager.tok_s,
                   reager.tok_s > 0 ? rdec.tok_s / reager.tok_s : 0);
        if (B.device)
            printf("snapshots    %.1f MiB at %d tokens: page-out %.2f GB/s (%.2f of the link), page-in %.2f GB/s "
                   "(%.2f); decode %.2f tok/s with a page-out in flight, %.2f without\n",
                   pg.bytes / 1048576.0, pg.offset, pg.out_gbs, lim.d2h_gbs > 0 ? pg.out_gbs / lim.d2h_gbs : 0,
                   pg.in_gbs, lim.h2d_gbs > 0 ? pg.in_gbs / lim.h2d_gbs : 0, pg.decode_paging_tok_s,
                   pg.decode_tok_s);
        printf("decode       %.0f bytes/token (weights %.0f + state %.0f + KV %.0f/ctx token): roofline ratio %.3f\n",
               bpt, (double)tr.weights, (double)tr.state_fixed, kv, roof);
        printf("decode 8k    %.0f bytes/token: roofline ratio %.3f, %.3f of decode at the start (%d alternating "
               "pairs of %d-token bursts; %.3f over the %d that saw one machine; CPU seconds %.3f; median "
               "token %.3f)\n",
               bpt8k, roof8k, rdec.tok_s > 0 ? rdec8k.tok_s / rdec.tok_s : 0, dp.bursts, dp.burst_tokens,
               dp.over_start, dp.agree, dp.over_start_cpu, dp.over_start_token);
        if (parallel)
            printf("parallel     %d sequences decoding at once: %.2f tok/s in all, %.2fx decode's (%.2f tok/s "
                   "each)%s\n",
                   parallel, rpar.tok_s, rdec.tok_s > 0 ? rpar.tok_s / rdec.tok_s : 0, rpar.tok_s / parallel,
                   rpar.reliable ? "" : "  UNRELIABLE");
        printf("prefill      2 x %.0f params x tok/s = %.1f Gop/s (512: %.1f): %.3f of peak\n", P, gops2k, gops512,
               peak > 0 ? gops2k / peak : 0);
        if (long_ctx) {
            printf("prefill long %d tokens after %d: %.3f of prefill512's rate; the %d-token prefix took %.1f s "
                   "(%.2f tok/s)\n",
                   prompt_short, long_ctx, r512.tok_s > 0 ? rlong.tok_s / r512.tok_s : 0, long_ctx, long_prefix_s,
                   long_prefix_s > 0 ? long_ctx / long_prefix_s : 0);
            if (att_peak > 0)
                printf("attention    %.1f Gop/s added by the long prefix (by difference): %.3f of the fp32 FMA "
                       "peak %.1f Gop/s (%s)\n",
                       att_gops, att_gops / att_peak, att_peak, att_peak_what);
            else
                printf("attention    %.1f Gop/s added by the long prefix (by difference)\n", att_gops);
        }
        printf("memory       peak %.2f GiB (VmHWM less the %d MiB probe buffer)\n", peak_mem / 1073741824.0,
               probe_mb);
        if (have_full)
            printf("projected    whole %s (%d layers, not measured): %.0f bytes/token, %.1f decode tok/s at "
                   "this per-layer rate, %.1f prefill tok/s at this Gop/s\n",
                   preset, full.n_layers, full_bpt, full_dec, full_pre);
    }
    status = 0;
done:
    cJSON_Delete(out);
    free(B.toks);
    free(B.logits);
    cn_state_free(B.s);
    cn_state_free(s0);
    decode_pair_free(&dp);
    if (B.m || be) cn_cli_close_model(be, B.m);
    cn_pool_free(B.pool);
    cn_probe_buf_free(B.probe, B.probe_bytes);
    ckpt_release(&ck);
    return status;
}
