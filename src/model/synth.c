/* synth.c - presets, tensor list, seeded values and the JSON files of a synthetic NemotronH
 * checkpoint; see synth.h.
 *
 * Values come from a counter-based generator: element i of tensor T is a pure function of
 * mix64(key(seed, T) + (i + 1) * golden), so any chunk can be produced on its own (the writer
 * streams) and the bytes never depend on order or sharding. No libc rand, no global state.
 * Never writes outside dir, never leaves a partial file under a final name, never exits.
 */
#include "model/synth.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/fp.h"
#include "base/threadpool.h"
#include "model/config.h"
#include "model/nano3_template.h"
#include "model/quantize.h"
#include "model/st_writer.h"

/* ---- presets -------------------------------------------------------------------------------- */

typedef struct synth_shape {
    const char *name;
    const char *pattern; /* hybrid_override_pattern before --layers */
    int hidden, vocab, max_pos;
    int n_heads, n_kv_heads, head_dim;                              /* '*' */
    int m_heads, m_head_dim, n_groups, d_state, conv_k, chunk;      /* 'M' */
    int n_experts, top_k, moe_inter, n_shared, shared_inter;        /* 'E' */
    int inter;                                                      /* '-' */
    float routed_scale;
} synth_shape;

static const synth_shape kPresets[] = {
    /* tiny: unit tests; 8 layers (3 M, 2 *, 2 E, 1 -), d_inner 128, conv_dim 192, in_proj 328.
     * 280,920 parameters without MTP; the "*E" MTP block adds 62,280 (343,200 in all). */
    {"tiny", "M*EM-E*M", 64, 512, 2048,
     4, 2, 16,
     8, 16, 2, 16, 4, 16,
     8, 2, 32, 1, 64,
     128, 2.5f},
    /* small: ~100M for CPU prefill benchmarks; 16 layers (7 M, 6 E, 2 *, 1 -), d_inner 1024,
     * conv_dim 1536, in_proj 2576. 102,986,256 parameters without MTP (33.6M of them embedding +
     * lm_head; 25.4M of the rest active per token); the MTP block adds 10,111,520 (113,097,776
     * in all). */
    {"small", "MEM*EMEM-EMEM*EM", 512, 32768, 8192,
     8, 2, 64,
     16, 64, 4, 64, 4, 128,
     32, 4, 256, 1, 512,
     1536, 2.5f},
    /* nano-shape: Nemotron 3 Nano 30B-A3B (architecture notes, section 1); 52 layers (23 M,
     * 23 E, 6 *). 31,577,940,288 parameters without MTP; MTP adds 1,335,325,952. */
    {"nano-shape", "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME", 2688, 131072, 262144,
     32, 2, 128,
     64, 64, 8, 128, 4, 128,
     128, 6, 1856, 1, 3712,
     1856, 2.5f},
};

#define MTP_PATTERN "*E"

/* ---- tensor specs --------------------------------------------------------------------------- */

typedef enum init_kind {
    INIT_NORMAL,  /* std a; rows >= split_row use std b (in_proj's dt rows) */
    INIT_UNIFORM, /* U[a, b) */
    INIT_ALOG,    /* log(U[1, 16]) */
    INIT_DT_BIAS, /* softplus^-1(dt), dt log-uniform in [0.001, 0.1] */
    INIT_CONST,   /* a (fp8 scales) */
} init_kind;

typedef struct synth_spec {
    char name[96];
    cn_dtype dtype; /* as stored */
    int ndim;
    int64_t shape[3];
    init_kind kind;
    float a, b;
    int64_t split_row; /* INIT_NORMAL: first row drawn with std b; INT64_MAX if none */
    float fp8_scale;   /* F8_E4M3: stored code = e4m3(value / fp8_scale); NVFP4: the global
                        * scale g (weight_scale_2) */
    int is_mtp;        /* under mtp.* */
    int is_scale;      /* a quantization scale, not a parameter */
    int nvfp4;         /* NVFP4 mode: 1 the packed codes [N, K/2] of the logical [N, K] weight
                        * this spec describes, 2 their block scales [N, K/16] (of spec `src`) */
    int64_t nvfp4_k;   /* the logical K */
    int src;           /* nvfp4 2: the index of the codes' spec, whose values these are */
} synth_spec;

typedef struct synth_model {
    const synth_shape *sh;
    char pattern[128];
    int n_layers;
    cn_dtype wdtype;     /* Linear weights */
    cn_dtype small_dtype;/* norms, conv1d */
    int mtp;
    int window;          /* sliding_window of the 'S' layers; 0 when there are none */
    synth_spec *specs;
    int n, cap;
    int oom;             /* sticky: an append failed */
} synth_model;

static synth_spec *spec_add(synth_model *m, const char *prefix, const char *suffix, cn_dtype dtype,
                            int ndim, int64_t d0, int64_t d1, int64_t d2) {
    if (m->oom) return NULL;
    if (m->n == m->cap) {
        int cap = m->cap ? m->cap * 2 : 256;
        synth_spec *s = realloc(m->specs, (size_t)cap * sizeof *s);
        if (!s) {
            m->oom = 1;
            return NULL;
        }
        m->specs = s;
        m->cap = cap;
    }
    synth_spec *s = &m->specs[m->n++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s%s", prefix, suffix);
    s->dtype = dtype;
    s->ndim = ndim;
    s->shape[0] = d0;
    s->shape[1] = d1;
    s->shape[2] = d2;
    s->split_row = INT64_MAX;
    s->is_mtp = !strncmp(prefix, "mtp.", 4);
    return s;
}

/* Largest |value| the Irwin-Hall(4) normal below can take, in units of its std. */
#define NORMAL_MAX 3.4641016f /* 2 sqrt(3) */

/* NVFP4 mode leaves BF16 what NVIDIA's NVFP4 release (and cn_quantize_dir) leaves: attention's
 * projections, and in_proj / out_proj of a Mamba layer whose next Mamba-or-attention layer is
 * attention. */
static int nvfp4_kept(const synth_model *m, const char *prefix, const char *suffix) {
    static const char *const attn[] = {"q_proj.", "k_proj.", "v_proj.", "o_proj."};
    for (int i = 0; i < 4; i++)
        if (!strncmp(suffix, attn[i], strlen(attn[i]))) return 1;
    int l;
    if ((strncmp(suffix, "in_proj.", 8) && strncmp(suffix, "out_proj.", 9)) ||
        sscanf(prefix, "backbone.layers.%d.", &l) != 1)
        return 0;
    return cn_mamba_feeds_attn(m->pattern, m->n_layers, l);
}

/* A Linear weight [out, in], std 1/sqrt(in) (rows >= split_row: split_std). In fp8 mode it is
 * stored F8_E4M3 with a per-tensor scale mapping the largest possible value to 448, and the
 * scale is written as the F32 scalar `<name>_scale` (X.weight -> X.weight_scale). In nvfp4 mode
 * (but for nvfp4_kept's, BF16) it is stored as cn_quantize_dir writes NVFP4, each row quantized as
 * it is generated: codes U8 [out, in/2], `<name>_scale` E4M3 [out, in/16], and `<name>_scale_2`
 * the global scale, here the largest possible value / (6 * 448) instead of the tensor's amax. */
static void add_linear(synth_model *m, const char *prefix, const char *suffix, int64_t out,
                       int64_t in, int64_t split_row, float split_std) {
    float std = 1.0f / sqrtf((float)in);
    const int fp4 = m->wdtype == CN_NVFP4 && !nvfp4_kept(m, prefix, suffix);
    cn_dtype dt = m->wdtype == CN_NVFP4 ? (fp4 ? CN_U8 : CN_BF16) : m->wdtype;
    synth_spec *s = spec_add(m, prefix, suffix, dt, 2, out, fp4 ? in / 2 : in, 0);
    if (!s) return;
    s->kind = INIT_NORMAL;
    s->a = std;
    if (split_row < out) {
        s->split_row = split_row;
        s->b = split_std;
    }
    float amax = NORMAL_MAX * (s->split_row < out && split_std > std ? split_std : std);
    if (fp4) {
        const int src = m->n - 1;
        s->nvfp4 = 1;
        s->nvfp4_k = in;
        s->fp8_scale = amax / (6.0f * 448.0f);
        const float g = s->fp8_scale;
        char base[96];
        snprintf(base, sizeof base, "%s", s->name);
        synth_spec *q = spec_add(m, base, "_scale", CN_F8_E4M3, 2, out, in / 16, 0);
        if (!q) return;
        q->nvfp4 = 2;
        q->src = src;
        q->is_scale = 1;
        q = spec_add(m, base, "_scale_2", CN_F32, 0, 0, 0, 0);
        if (!q) return;
        q->kind = INIT_CONST;
        q->a = g;
        q->is_scale = 1;
        return;
    }
    if (m->wdtype != CN_F8_E4M3) return;
    s->fp8_scale = amax / 448.0f;
    float scale = s->fp8_scale;
    char base[96]; /* spec_add may move s */
    snprintf(base, sizeof base, "%s", s->name);
    synth_spec *q = spec_add(m, base, "_scale", CN_F32, 0, 0, 0, 0);
    if (!q) return;
    q->kind = INIT_CONST;
    q->a = scale;
    q->is_scale = 1;
}

static void add_vec(synth_model *m, const char *prefix, const char *suffix, cn_dtype dtype,
                    int64_t n, init_kind kind, float a, float b) {
    synth_spec *s = spec_add(m, prefix, suffix, dtype, 1, n, 0, 0);
    if (!s) return;
    s->kind = kind;
    s->a = a;
    s->b = b;
}

static void add_norm(synth_model *m, const char *prefix, const char *suffix, int64_t n) {
    add_vec(m, prefix, suffix, m->small_dtype, n, INIT_UNIFORM, 0.9f, 1.1f);
}

/* The tensors of one mixer (prefix ends in "mixer."). */
static void add_mixer(synth_model *m, const char *p, char type) {
    const synth_shape *h = m->sh;
    int64_t H = h->hidden;
    char name[96];
    switch (type) {
    case 'M': {
        int64_t d_in = (int64_t)h->m_heads * h->m_head_dim;
        int64_t conv_dim = d_in + 2 * (int64_t)h->n_groups * h->d_state;
        float kb = 1.0f / sqrtf((float)h->conv_k);
        /* z | xBC | dt: the dt rows get std 0.1/sqrt(H) so softplus(dt + dt_bias) stays near
         * the [0.001, 0.1] that dt_bias alone gives, as in a trained model. */
        add_linear(m, p, "in_proj.weight", d_in + conv_dim + h->m_heads, H, d_in + conv_dim,
                   0.1f / sqrtf((float)H));
        synth_spec *c = spec_add(m, p, "conv1d.weight", m->small_dtype, 3, conv_dim, 1, h->conv_k);
        if (c) {
            c->kind = INIT_UNIFORM;
            c->a = -kb;
            c->b = kb;
        }
        add_vec(m, p, "conv1d.bias", m->small_dtype, conv_dim, INIT_UNIFORM, -kb, kb);
        add_vec(m, p, "dt_bias", CN_F32, h->m_heads, INIT_DT_BIAS, 0, 0);
        add_vec(m, p, "A_log", CN_F32, h->m_heads, INIT_ALOG, 0, 0);
        add_vec(m, p, "D", CN_F32, h->m_heads, INIT_UNIFORM, 0.9f, 1.1f);
        add_norm(m, p, "norm.weight", d_in);
        add_linear(m, p, "out_proj.weight", H, d_in, INT64_MAX, 0);
        break;
    }
    case 'S': /* sliding-window attention: the same tensors as '*' */
    case '*': {
        int64_t q = (int64_t)h->n_heads * h->head_dim, kv = (int64_t)h->n_kv_heads * h->head_dim;
        add_linear(m, p, "q_proj.weight", q, H, INT64_MAX, 0);
        add_linear(m, p, "k_proj.weight", kv, H, INT64_MAX, 0);
        add_linear(m, p, "v_proj.weight", kv, H, INT64_MAX, 0);
        add_linear(m, p, "o_proj.weight", H, q, INT64_MAX, 0);
        break;
    }
    case 'E': {
        synth_spec *g = spec_add(m, p, "gate.weight", CN_F32, 2, h->n_experts, H, 0);
        if (g) {
            g->kind = INIT_NORMAL;
            g->a = 1.0f / sqrtf((float)H);
        }
        add_vec(m, p, "gate.e_score_correction_bias", CN_F32, h->n_experts, INIT_UNIFORM, -0.05f,
                0.05f);
        for (int e = 0; e < h->n_experts; e++) {
            snprintf(name, sizeof name, "experts.%d.up_proj.weight", e);
            add_linear(m, p, name, h->moe_inter, H, INT64_MAX, 0);
            snprintf(name, sizeof name, "experts.%d.down_proj.weight", e);
            add_linear(m, p, name, H, h->moe_inter, INT64_MAX, 0);
        }
        add_linear(m, p, "shared_experts.up_proj.weight", h->shared_inter, H, INT64_MAX, 0);
        add_linear(m, p, "shared_experts.down_proj.weight", H, h->shared_inter, INT64_MAX, 0);
        break;
    }
    case '-':
        add_linear(m, p, "up_proj.weight", h->inter, H, INT64_MAX, 0);
        add_linear(m, p, "down_proj.weight", H, h->inter, INT64_MAX, 0);
        break;
    }
}

static int find_preset(const char *name) {
    for (size_t i = 0; i < sizeof kPresets / sizeof kPresets[0]; i++)
        if (name && !strcmp(name, kPresets[i].name)) return (int)i;
    return -1;
}

/* Validates o and lists every tensor in declaration (file) order. */
static int model_build(synth_model *m, const cn_synth_opts *o, cn_err *err) {
    memset(m, 0, sizeof *m);
    int pi = find_preset(o->preset);
    if (pi < 0)
        return cn_err_set(err, CN_EINVAL, "unknown preset '%s' (expected %s)",
                          o->preset ? o->preset : "(null)", CN_SYNTH_PRESETS);
    m->sh = &kPresets[pi];
    const char *pat = o->pattern ? o->pattern : m->sh->pattern;
    int full = (int)strlen(pat);
    if (full == 0 || full >= (int)sizeof m->pattern || strspn(pat, "M*SE-") != (size_t)full)
        return cn_err_set(err, CN_EINVAL, "pattern '%s' must be 1..%d of M, *, S, E, -", pat,
                          (int)sizeof m->pattern - 1);
    if (o->sliding_window < 0)
        return cn_err_set(err, CN_EINVAL, "--window %d must be at least 1", o->sliding_window);
    if (o->layers < 0 || o->layers > full)
        return cn_err_set(err, CN_EINVAL, "--layers %d out of range for preset %s (1..%d, 0 = all)",
                          o->layers, m->sh->name, full);
    if (o->dtype != CN_BF16 && o->dtype != CN_F32 && o->dtype != CN_F8_E4M3 && o->dtype != CN_NVFP4)
        return cn_err_set(err, CN_EINVAL,
                          "weight dtype %s not supported (BF16, F32, F8_E4M3, NVFP4)",
                          cn_dtype_name(o->dtype));
    m->n_layers = o->layers ? o->layers : full;
    memcpy(m->pattern, pat, (size_t)m->n_layers);
    m->pattern[m->n_layers] = '\0';
    m->wdtype = o->dtype;
    m->small_dtype = o->dtype == CN_F32 ? CN_F32 : CN_BF16;
    m->mtp = o->mtp != 0;
    m->window = strchr(m->pattern, 'S') ? (o->sliding_window ? o->sliding_window : 16) : 0;

    const synth_shape *h = m->sh;
    int64_t H = h->hidden;
    /* Embeddings and lm_head are never fp8 (the FP8 releases keep them BF16). */
    cn_dtype edtype = o->dtype == CN_F32 ? CN_F32 : CN_BF16;
    synth_spec *s = spec_add(m, "backbone.embeddings.weight", "", edtype, 2, h->vocab, H, 0);
    if (s) {
        s->kind = INIT_NORMAL;
        s->a = 1.0f;
    }
    char p[96];
    for (int l = 0; l < m->n_layers; l++) {
        snprintf(p, sizeof p, "backbone.layers.%d.", l);
        add_norm(m, p, "norm.weight", H);
        snprintf(p, sizeof p, "backbone.layers.%d.mixer.", l);
        add_mixer(m, p, m->pattern[l]);
    }
    add_norm(m, "backbone.norm_f.weight", "", H);
    s = spec_add(m, "lm_head.weight", "", edtype, 2, h->vocab, H, 0);
    if (s) {
        s->kind = INIT_NORMAL;
        s->a = 1.0f / sqrtf((float)H);
    }
    if (m->mtp) {
        int n_mtp = (int)strlen(MTP_PATTERN);
        for (int j = 0; j < n_mtp; j++) {
            snprintf(p, sizeof p, "mtp.layers.%d.", j);
            if (j == 0) {
                add_norm(m, p, "enorm.weight", H);
                add_norm(m, p, "hnorm.weight", H);
                add_linear(m, p, "eh_proj.weight", H, 2 * H, INT64_MAX, 0);
            }
            add_norm(m, p, "norm.weight", H);
            snprintf(p, sizeof p, "mtp.layers.%d.mixer.", j);
            add_mixer(m, p, MTP_PATTERN[j]);
            if (j == n_mtp - 1) {
                snprintf(p, sizeof p, "mtp.layers.%d.", j);
                add_norm(m, p, "final_layernorm.weight", H);
            }
        }
    }
    if (m->oom) {
        free(m->specs);
        memset(m, 0, sizeof *m);
        return cn_err_set(err, CN_ENOMEM, "synth: out of memory listing tensors");
    }
    return CN_OK;
}

static void model_free(synth_model *m) { free(m->specs); }

static uint64_t spec_nelem(const synth_spec *s) {
    uint64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= (uint64_t)s->shape[d];
    return n;
}

void cn_synth_opts_init(cn_synth_opts *o) {
    memset(o, 0, sizeof *o);
    o->preset = "tiny";
    o->mtp = 1;
    o->dtype = CN_BF16;
}

int cn_synth_describe(const cn_synth_opts *o, cn_synth_info *out, cn_err *err) {
    synth_model m;
    int rc = model_build(&m, o, err);
    if (rc != CN_OK) return rc;
    memset(out, 0, sizeof *out);
    snprintf(out->pattern, sizeof out->pattern, "%s", m.pattern);
    out->n_layers = m.n_layers;
    out->hidden_size = m.sh->hidden;
    out->vocab_size = m.sh->vocab;
    out->n_tensors = m.n;
    uint64_t shard_used = 0;
    out->n_files = 1;
    for (int i = 0; i < m.n; i++) {
        const synth_spec *s = &m.specs[i];
        uint64_t n = spec_nelem(s), bytes = n * cn_dtype_size(s->dtype);
        const uint64_t np = s->nvfp4 == 1 ? 2 * n : n; /* two codes a byte */
        if (!s->is_scale) out->params += np;
        if (!s->is_scale && s->is_mtp) out->mtp_params += np;
        out->tensor_bytes += bytes;
        /* Same greedy rule as the writer (st_writer.h invariant 1). */
        if (o->shard_bytes && shard_used > 0 && shard_used + bytes > o->shard_bytes) {
            out->n_files++;
            shard_used = 0;
        }
        shard_used += bytes;
    }
    model_free(&m);
    return CN_OK;
}

/* ---- values --------------------------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t z) { /* splitmix64's finalizer */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t tensor_key(uint64_t seed, const char *name) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a of the name */
    for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    return mix64(mix64(seed + 0x9e3779b97f4a7c15ull) ^ h);
}

/* Uniform in [0, 1) with 24 bits, exact in float. */
static inline float unit24(uint64_t h) { return (float)(h >> 40) * (1.0f / 16777216.0f); }

/* Approximately N(0, 1): Irwin-Hall sum of the hash's four 16-bit lanes, recentred and scaled;
 * integer arithmetic and one multiply, so it is bit-identical on every platform. */
static inline float normal16(uint64_t h) {
    int32_t s = (int32_t)(h & 0xffff) + (int32_t)((h >> 16) & 0xffff) +
                (int32_t)((h >> 32) & 0xffff) + (int32_t)(h >> 48) - 2 * 65535;
    return (float)s * (NORMAL_MAX / (2.0f * 65536.0f));
}

static float spec_value(const synth_spec *s, uint64_t key, uint64_t i) {
    uint64_t h = mix64(key + (i + 1) * 0x9e3779b97f4a7c15ull);
    switch (s->kind) {
    case INIT_NORMAL: {
        int64_t row = s->ndim == 2 ? (int64_t)(i / (uint64_t)s->shape[1]) : 0;
        return normal16(h) * (row >= s->split_row ? s->b : s->a);
    }
    case INIT_UNIFORM: return s->a + (s->b - s->a) * unit24(h);
    case INIT_ALOG: return logf(1.0f + 15.0f * unit24(h));
    case INIT_DT_BIAS: {
        float dt = expf(logf(0.001f) + unit24(h) * (logf(0.1f) - logf(0.001f)));
        return dt + logf(-expm1f(-dt)); /* softplus^-1(dt) = log(exp(dt) - 1) */
    }
    case INIT_CONST: return s->a;
    }
    return 0.0f;
}

/* E4M3 encode by binary search over the 127 non-negative finite codes (monotonic in the code),
 * ties to the even code, saturating at 448: the same result as cn_f32_to_e4m3, ~10x faster. */
static uint8_t e4m3_encode(const float *pos, float f) {
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a != a) return 0x7f;
    if (a >= pos[126]) return (uint8_t)(sign | 126);
    int lo = 0, hi = 126; /* pos[lo] <= a < pos[hi] */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (pos[mid] <= a) lo = mid;
        else hi = mid;
    }
    float dl = a - pos[lo], dh = pos[hi] - a;
    int c = dl < dh ? lo : dh < dl ? hi : (lo & 1 ? hi : lo);
    return (uint8_t)(sign | c);
}

typedef struct fill_ctx {
    const synth_model *m;
    uint64_t seed;
    float e4m3_pos[127]; /* value of code c, c = 0..126 */
    cn_pool *pool;       /* elements are independent: a chunk is split over it (NULL: inline) */
} fill_ctx;

typedef struct fill_job {
    const fill_ctx *c;
    const synth_spec *s;
    uint64_t key, i0, n; /* the chunk: elements [i0, i0 + n) of the tensor */
    void *buf;
} fill_job;

#define FILL_BLOCK 4096 /* elements per pool item */

static void fill_task(void *vctx, int begin, int end) {
    const fill_job *j = vctx;
    const synth_spec *s = j->s;
    uint64_t k0 = (uint64_t)begin * FILL_BLOCK, k1 = (uint64_t)end * FILL_BLOCK;
    if (k1 > j->n) k1 = j->n;
    for (uint64_t k = k0; k < k1; k++) {
        float v = spec_value(s, j->key, j->i0 + k);
        switch (s->dtype) {
        case CN_F32: ((float *)j->buf)[k] = v; break;
        case CN_BF16: ((uint16_t *)j->buf)[k] = cn_f32_to_bf16(v); break;
        default: ((uint8_t *)j->buf)[k] = e4m3_encode(j->c->e4m3_pos, v / s->fp8_scale); break;
        }
    }
}

/* NVFP4 mode: bytes [off, off + n) of a weight's codes (part 1) or block scales (part 2), each
 * row generated and quantized whole (cn_quantize_nvfp4_row), a pool item per row. */
typedef struct fp4_job {
    const synth_spec *w; /* the codes' spec */
    uint64_t key;        /* its values' key */
    int part;
    uint64_t off, n, row_bytes;
    uint8_t *buf;
    atomic_int oom; /* set by a task that could not allocate */
} fp4_job;

static void fp4_task(void *vctx, int begin, int end) {
    fp4_job *j = vctx;
    const int64_t K = j->w->nvfp4_k;
    synth_spec v = *j->w; /* the logical [N, K] weight, for spec_value's rows */
    v.shape[1] = K;
    float *vals = malloc((size_t)K * sizeof *vals);
    uint8_t *codes = malloc((size_t)(K / 2)), *scales = malloc((size_t)(K / 16));
    if (!vals || !codes || !scales) {
        atomic_store(&j->oom, 1);
        begin = end;
    }
    const uint64_t r0 = j->off / j->row_bytes;
    for (int i = begin; i < end; i++) {
        const uint64_t r = r0 + (uint64_t)i;
        for (int64_t k = 0; k < K; k++) vals[k] = spec_value(&v, j->key, r * (uint64_t)K + (uint64_t)k);
        cn_quantize_nvfp4_row(vals, K, j->w->fp8_scale, codes, scales);
        const uint8_t *src = j->part == 1 ? codes : scales;
        const uint64_t a = r * j->row_bytes, b = a + j->row_bytes; /* the row's bytes */
        const uint64_t lo = a > j->off ? a : j->off, hi = b < j->off + j->n ? b : j->off + j->n;
        memcpy(j->buf + (lo - j->off), src + (lo - a), (size_t)(hi - lo));
    }
    free(vals);
    free(codes);
    free(scales);
}

static int synth_fill(void *vctx, int index, const char *name, uint64_t offset, void *buf,
                      uint64_t nbytes) {
    (void)name;
    const fill_ctx *c = vctx;
    const synth_spec *s = &c->m->specs[index];
    if (s->nvfp4) {
        const synth_spec *w = s->nvfp4 == 1 ? s : &c->m->specs[s->src];
        /* the codes and the scales are asked for apart, so each row is generated twice */
        fp4_job j = {.w = w, .key = tensor_key(c->seed, w->name), .part = s->nvfp4, .off = offset,
                     .n = nbytes, .row_bytes = (uint64_t)s->shape[1], .buf = buf};
        atomic_init(&j.oom, 0);
        if (nbytes == 0) return CN_OK;
        const uint64_t rows = (offset + nbytes - 1) / j.row_bytes - offset / j.row_bytes + 1;
        cn_pool_for(c->pool, (int)rows, 1, fp4_task, &j);
        return atomic_load(&j.oom) ? CN_ENOMEM : CN_OK;
    }
    if (s->dtype != CN_F32 && s->dtype != CN_BF16 && s->dtype != CN_F8_E4M3) return CN_EDTYPE;
    size_t esz = cn_dtype_size(s->dtype);
    fill_job j = {.c = c, .s = s, .key = tensor_key(c->seed, s->name), .i0 = offset / esz,
                  .n = nbytes / esz, .buf = buf};
    cn_pool_for(c->pool, (int)((j.n + FILL_BLOCK - 1) / FILL_BLOCK), 4, fill_task, &j);
    return CN_OK;
}

/* ---- JSON files ----------------------------------------------------------------------------- */

static int mkdir_p(const char *dir, cn_err *err) {
    char path[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof path) return cn_err_set(err, CN_EINVAL, "bad output directory '%s'", dir);
    memcpy(path, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (path[i] != '/' && path[i] != '\0') continue;
        char keep = path[i];
        path[i] = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return cn_err_set(err, CN_EIO, "%s: cannot create directory: %s", path, strerror(errno));
        path[i] = keep;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return cn_err_set(err, CN_EIO, "%s: not a directory", dir);
    return CN_OK;
}

/* Prints root, writes dir/name atomically and deletes root (even on error). */
static int write_json(const char *dir, const char *name, cJSON *root, cn_err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) return cn_err_set(err, CN_ENOMEM, "%s: out of memory", path);
    size_t len = strlen(text);
    char *t = realloc(text, len + 2); /* end with a newline, like json.dump files usually do */
    if (!t) {
        free(text);
        return cn_err_set(err, CN_ENOMEM, "%s: out of memory", path);
    }
    t[len] = '\n';
    t[len + 1] = '\0';
    int rc = cn_write_file_atomic(path, t, len + 1, err);
    free(t);
    return rc;
}

static const char *torch_dtype(cn_dtype d) { return d == CN_F32 ? "float32" : "bfloat16"; }

/* config.json with transformers' NemotronHConfig key names. */
static cJSON *config_json(const synth_model *m) {
    const synth_shape *h = m->sh;
    cJSON *c = cJSON_CreateObject();
    if (!c) return NULL;
    cJSON *arch = cJSON_AddArrayToObject(c, "architectures");
    if (arch) cJSON_AddItemToArray(arch, cJSON_CreateString("NemotronHForCausalLM"));
    cJSON_AddStringToObject(c, "model_type", "nemotron_h");
    cJSON_AddStringToObject(c, "torch_dtype", torch_dtype(m->wdtype));
    cJSON_AddNumberToObject(c, "vocab_size", h->vocab);
    cJSON_AddNumberToObject(c, "hidden_size", h->hidden);
    cJSON_AddNumberToObject(c, "num_hidden_layers", m->n_layers);
    cJSON_AddStringToObject(c, "hybrid_override_pattern", m->pattern);
    cJSON_AddNumberToObject(c, "max_position_embeddings", h->max_pos);
    cJSON_AddBoolToObject(c, "tie_word_embeddings", 0);
    cJSON_AddNumberToObject(c, "layer_norm_epsilon", 1e-5);
    cJSON_AddBoolToObject(c, "residual_in_fp32", 0);
    cJSON_AddNumberToObject(c, "initializer_range", 0.02);
    cJSON_AddBoolToObject(c, "use_cache", 1);
    /* attention */
    cJSON_AddNumberToObject(c, "num_attention_heads", h->n_heads);
    cJSON_AddNumberToObject(c, "num_key_value_heads", h->n_kv_heads);
    cJSON_AddNumberToObject(c, "head_dim", h->head_dim);
    cJSON_AddBoolToObject(c, "attention_bias", 0);
    cJSON_AddNumberToObject(c, "attention_dropout", 0.0);
    if (m->window) cJSON_AddNumberToObject(c, "sliding_window", m->window); /* the 'S' layers' W */
    else cJSON_AddNullToObject(c, "sliding_window");
    /* Mamba2 */
    cJSON_AddNumberToObject(c, "mamba_num_heads", h->m_heads);
    cJSON_AddNumberToObject(c, "mamba_head_dim", h->m_head_dim);
    cJSON_AddNumberToObject(c, "n_groups", h->n_groups);
    cJSON_AddNumberToObject(c, "ssm_state_size", h->d_state);
    cJSON_AddNumberToObject(c, "conv_kernel", h->conv_k);
    cJSON_AddNumberToObject(c, "chunk_size", h->chunk);
    cJSON_AddNumberToObject(c, "expand", 2);
    cJSON_AddBoolToObject(c, "use_conv_bias", 1);
    cJSON_AddBoolToObject(c, "mamba_proj_bias", 0);
    cJSON_AddBoolToObject(c, "use_bias", 0);
    cJSON_AddStringToObject(c, "mamba_hidden_act", "silu");
    cJSON_AddStringToObject(c, "mamba_ssm_cache_dtype", "float32");
    cJSON_AddNumberToObject(c, "time_step_min", 0.001);
    cJSON_AddNumberToObject(c, "time_step_max", 0.1);
    cJSON_AddNumberToObject(c, "time_step_floor", 1e-4);
    /* MLP and MoE */
    cJSON_AddNumberToObject(c, "intermediate_size", h->inter);
    cJSON_AddStringToObject(c, "mlp_hidden_act", "relu2");
    cJSON_AddBoolToObject(c, "mlp_bias", 0);
    cJSON_AddNumberToObject(c, "n_routed_experts", h->n_experts);
    cJSON_AddNumberToObject(c, "num_experts_per_tok", h->top_k);
    cJSON_AddNumberToObject(c, "moe_intermediate_size", h->moe_inter);
    cJSON_AddNumberToObject(c, "n_shared_experts", h->n_shared);
    cJSON_AddNumberToObject(c, "moe_shared_expert_intermediate_size", h->shared_inter);
    cJSON_AddNumberToObject(c, "n_group", 1);
    cJSON_AddNumberToObject(c, "topk_group", 1);
    cJSON_AddBoolToObject(c, "norm_topk_prob", 1);
    cJSON_AddNumberToObject(c, "routed_scaling_factor", h->routed_scale);
    /* MTP */
    cJSON_AddNumberToObject(c, "num_nextn_predict_layers", m->mtp ? 1 : 0);
    if (m->mtp) cJSON_AddStringToObject(c, "mtp_hybrid_override_pattern", MTP_PATTERN);
    /* tokens */
    cJSON_AddNumberToObject(c, "bos_token_id", 1);
    cJSON_AddNumberToObject(c, "eos_token_id", 2);
    cJSON_AddNumberToObject(c, "pad_token_id", 0);
    if (m->wdtype == CN_F8_E4M3 || m->wdtype == CN_NVFP4) {
        cJSON *q = cJSON_AddObjectToObject(c, "quantization_config");
        if (q) {
            cJSON_AddStringToObject(q, "quant_method", "modelopt");
            cJSON_AddStringToObject(q, "quant_algo", m->wdtype == CN_NVFP4 ? "NVFP4" : "FP8");
            cJSON_AddNullToObject(q, "kv_cache_quant_algo");
            if (m->wdtype == CN_NVFP4) cJSON_AddNumberToObject(q, "group_size", 16);
        }
    }
    cJSON_AddStringToObject(c, "transformers_version", "4.55.4");
    return c;
}

static cJSON *generation_json(void) {
    cJSON *c = cJSON_CreateObject();
    if (!c) return NULL;
    cJSON_AddBoolToObject(c, "_from_model_config", 1);
    cJSON_AddNumberToObject(c, "bos_token_id", 1);
    cJSON *eos = cJSON_AddArrayToObject(c, "eos_token_id");
    if (eos) {
        cJSON_AddItemToArray(eos, cJSON_CreateNumber(2));
        cJSON_AddItemToArray(eos, cJSON_CreateNumber(11));
    }
    cJSON_AddNumberToObject(c, "pad_token_id", 0);
    cJSON_AddBoolToObject(c, "do_sample", 1);
    cJSON_AddNumberToObject(c, "temperature", 1.0);
    cJSON_AddNumberToObject(c, "top_p", 1.0);
    cJSON_AddStringToObject(c, "transformers_version", "4.55.4");
    return c;
}

static void add_special_strings(cJSON *c) {
    cJSON_AddStringToObject(c, "bos_token", "<s>");
    cJSON_AddStringToObject(c, "eos_token", "<|im_end|>");
    cJSON_AddStringToObject(c, "pad_token", "<unk>");
    cJSON_AddStringToObject(c, "unk_token", "<unk>");
}

static cJSON *tokenizer_config_json(const synth_model *m) {
    static const char *const named[20] = {
        [0] = "<unk>",        [1] = "<s>",          [2] = "</s>",
        [10] = "<|im_start|>", [11] = "<|im_end|>",  [12] = "<think>",
        [13] = "</think>",    [14] = "<tool_call>", [15] = "</tool_call>",
    };
    cJSON *c = cJSON_CreateObject();
    if (!c) return NULL;
    cJSON_AddBoolToObject(c, "add_bos_token", 0);
    cJSON_AddBoolToObject(c, "add_eos_token", 0);
    cJSON *dec = cJSON_AddObjectToObject(c, "added_tokens_decoder");
    for (int id = 0; dec && id < 20; id++) {
        char key[16], content[32];
        snprintf(key, sizeof key, "%d", id);
        if (named[id]) snprintf(content, sizeof content, "%s", named[id]);
        else snprintf(content, sizeof content, "<SPECIAL_%d>", id);
        cJSON *t = cJSON_AddObjectToObject(dec, key);
        if (!t) continue;
        cJSON_AddStringToObject(t, "content", content);
        cJSON_AddBoolToObject(t, "lstrip", 0);
        cJSON_AddBoolToObject(t, "normalized", 0);
        cJSON_AddBoolToObject(t, "rstrip", 0);
        cJSON_AddBoolToObject(t, "single_word", 0);
        cJSON_AddBoolToObject(t, "special", 1);
    }
    add_special_strings(c);
    cJSON_AddBoolToObject(c, "clean_up_tokenization_spaces", 0);
    cJSON_AddNumberToObject(c, "model_max_length", m->sh->max_pos);
    cJSON_AddStringToObject(c, "tokenizer_class", "PreTrainedTokenizerFast");
    cJSON_AddStringToObject(c, "chat_template", cn_nano3_chat_template);
    return c;
}

static cJSON *special_tokens_json(void) {
    cJSON *c = cJSON_CreateObject();
    if (c) add_special_strings(c);
    return c;
}

/* modelopt's hf_quant_config.json: which modules are FP8 or NVFP4 and which stay high precision
 * (NVFP4: also attention's projections and the Mamba layers feeding attention, nvfp4_kept). */
static cJSON *quant_json(const synth_model *m) {
    cJSON *c = cJSON_CreateObject();
    if (!c) return NULL;
    const int fp4 = m->wdtype == CN_NVFP4;
    cJSON *prod = cJSON_AddObjectToObject(c, "producer");
    if (prod) cJSON_AddStringToObject(prod, "name", "cairn make-model");
    cJSON *q = cJSON_AddObjectToObject(c, "quantization");
    if (q) {
        cJSON_AddStringToObject(q, "quant_algo", fp4 ? "NVFP4" : "FP8");
        cJSON_AddNullToObject(q, "kv_cache_quant_algo");
        if (fp4) cJSON_AddNumberToObject(q, "group_size", 16);
        cJSON *ex = cJSON_AddArrayToObject(q, "exclude_modules");
        if (ex) {
            cJSON_AddItemToArray(ex, cJSON_CreateString("lm_head"));
            cJSON_AddItemToArray(ex, cJSON_CreateString("backbone.embeddings"));
            cJSON_AddItemToArray(ex, cJSON_CreateString("*.mixer.gate"));
            cJSON_AddItemToArray(ex, cJSON_CreateString("*.mixer.conv1d"));
        }
        if (ex && fp4) {
            static const char *const attn[] = {"*.q_proj", "*.k_proj", "*.v_proj", "*.o_proj"};
            for (int i = 0; i < 4; i++) cJSON_AddItemToArray(ex, cJSON_CreateString(attn[i]));
            char n[96];
            for (int l = 0; l < m->n_layers; l++) {
                if (!cn_mamba_feeds_attn(m->pattern, m->n_layers, l)) continue;
                snprintf(n, sizeof n, "backbone.layers.%d.mixer.in_proj", l);
                cJSON_AddItemToArray(ex, cJSON_CreateString(n));
                snprintf(n, sizeof n, "backbone.layers.%d.mixer.out_proj", l);
                cJSON_AddItemToArray(ex, cJSON_CreateString(n));
            }
        }
    }
    return c;
}

/* ---- write ---------------------------------------------------------------------------------- */

int cn_synth_write(const char *dir, const cn_synth_opts *o, cn_err *err) {
    synth_model m;
    cn_st_writer *w = NULL;
    fill_ctx *fc = NULL;
    char *tok = NULL;
    int rc = model_build(&m, o, err);
    if (rc != CN_OK) return rc;
    if ((rc = mkdir_p(dir, err)) != CN_OK) goto done;

    if (!(fc = malloc(sizeof *fc))) {
        rc = cn_err_set(err, CN_ENOMEM, "synth: out of memory");
        goto done;
    }
    fc->m = &m;
    fc->seed = o->seed;
    fc->pool = NULL;
    int n_threads = o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads > 1 && !(fc->pool = cn_pool_create(n_threads))) {
        rc = cn_err_set(err, CN_ENOMEM, "synth: out of memory");
        goto done;
    }
    for (int c = 0; c < 127; c++) fc->e4m3_pos[c] = cn_e4m3_to_f32((uint8_t)c);
    if ((rc = cn_st_writer_new(&w, err)) != CN_OK) goto done;
    for (int i = 0; i < m.n; i++) {
        const synth_spec *s = &m.specs[i];
        if ((rc = cn_st_writer_add(w, s->name, s->dtype, s->ndim, s->shape, err)) != CN_OK) goto done;
    }
    /* Weights first and config.json last: a directory with config.json is a complete model. */
    if ((rc = cn_st_writer_write(w, dir, o->shard_bytes, synth_fill, fc, err)) != CN_OK) goto done;

    if ((rc = cn_synth_tokenizer_json(m.sh->vocab, &tok, err)) != CN_OK) goto done;
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if ((rc = cn_write_file_atomic(path, tok, strlen(tok), err)) != CN_OK) goto done;
    if ((rc = write_json(dir, "tokenizer_config.json", tokenizer_config_json(&m), err)) != CN_OK) goto done;
    if ((rc = write_json(dir, "special_tokens_map.json", special_tokens_json(), err)) != CN_OK) goto done;
    if ((rc = write_json(dir, "generation_config.json", generation_json(), err)) != CN_OK) goto done;
    if ((m.wdtype == CN_F8_E4M3 || m.wdtype == CN_NVFP4) &&
        (rc = write_json(dir, "hf_quant_config.json", quant_json(&m), err)) != CN_OK)
        goto done;
    rc = write_json(dir, "config.json", config_json(&m), err);
done:
    free(tok);
    if (fc) cn_pool_free(fc->pool);
    free(fc);
    cn_st_writer_free(w);
    model_free(&m);
    return rc;
}
