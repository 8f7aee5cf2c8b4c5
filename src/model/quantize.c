/* quantize.c - streaming quantization of a checkpoint directory; see quantize.h. */
#include "model/quantize.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fp.h"
#include "base/readfile.h"
#include "base/log.h"
#include "base/threadpool.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/st_writer.h"

/* ---------------------------------------------------------------- encoders */

uint8_t cn_e4m3_encode(float v) {
    uint8_t sign = (v < 0 || (v == 0 && signbit(v))) ? 0x80 : 0;
    float a = fabsf(v);
    if (a != a) return 0x7f;
    if (a >= 448.0f) return (uint8_t)(sign | 0x7e);
    int code;
    if (a < 0.015625f) { /* below 2^-6: subnormal steps of 2^-9 (8 steps reach code 8 = 2^-6) */
        code = (int)nearbyintf(a * 512.0f);
    } else {
        int e;
        float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
        e -= 1;                  /* a = (2m) * 2^e, 2m in [1, 2) */
        int q = (int)nearbyintf((2.0f * m - 1.0f) * 8.0f); /* ties to even = even code */
        code = ((e + 7) << 3) + q;                         /* q == 8 carries into the exponent */
    }
    if (code > 0x7e) code = 0x7e;
    return (uint8_t)(sign | code);
}

/* Nearest E2M1 code of v (ties to the even code), saturating at 6; bit 3 the sign. */
static uint8_t e2m1_encode(float v) {
    float a = fabsf(v);
    uint8_t c = a <= 0.25f ? 0 : a < 0.75f ? 1 : a <= 1.25f ? 2 : a < 1.75f ? 3
              : a <= 2.5f ? 4 : a < 3.5f ? 5 : a <= 5.0f ? 6 : 7;
    return (uint8_t)(c && v < 0 ? c | 8 : c);
}

void cn_quantize_nvfp4_row(const float *w, int64_t K, float g, uint8_t *packed, uint8_t *scales) {
    for (int64_t b = 0; b < K; b += 16) {
        float amax = 0;
        for (int i = 0; i < 16; i++) amax = fmaxf(amax, fabsf(w[b + i]));
        uint8_t sc = g > 0 ? cn_e4m3_encode(fminf(amax / 6.0f / g, 448.0f)) : 0;
        float s = cn_e4m3_to_f32(sc) * g;
        scales[b / 16] = sc;
        for (int i = 0; i < 16; i += 2) {
            uint8_t lo = s > 0 ? e2m1_encode(w[b + i] / s) : 0;
            uint8_t hi = s > 0 ? e2m1_encode(w[b + i + 1] / s) : 0;
            packed[(b + i) / 2] = (uint8_t)(lo | hi << 4);
        }
    }
}

void cn_quantize_mxfp8_row(const float *w, int64_t K, uint8_t *codes, uint8_t *exps) {
    for (int64_t b = 0; b < K; b += 32) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(w[b + i]));
        int e = 0;
        if (amax > 0) { /* smallest e with 448 * 2^e >= amax */
            e = (int)ceilf(log2f(amax / 448.0f));
            while (e < 127 && ldexpf(448.0f, e) < amax) e++;
            while (e > -127 && ldexpf(448.0f, e - 1) >= amax) e--;
        }
        exps[b / 32] = (uint8_t)(e + 127);
        for (int i = 0; i < 32; i++) codes[b + i] = cn_e4m3_encode(ldexpf(w[b + i], -e));
    }
}

/* ---------------------------------------------------------------- plan */

typedef enum part {
    P_COPY,      /* the source tensor as stored */
    P_NVFP4_W,   /* U8 [N, K/2] */
    P_NVFP4_S,   /* F8_E4M3 [N, K/16] */
    P_NVFP4_S2,  /* F32 scalar g */
    P_MX_W,      /* F8_E4M3 [N, K] */
    P_MX_S,      /* U8 [N, K/32] */
    P_FP8_W,     /* F8_E4M3 [N, K] */
    P_FP8_S,     /* F32 scalar */
} part;

typedef struct out_tensor {
    int src;   /* index in the input */
    part part;
} out_tensor;

typedef struct qctx {
    const cn_safetensors *st;
    out_tensor *outs; /* [declared] in declaration order */
    float *amax;      /* [n_src] per source tensor, -1 until computed */
    cn_pool *pool;    /* rows and amax slices run on it; NULL runs them inline */
    cn_err *err;
} qctx;

static float src_value(const cn_st_tensor *t, int64_t i) {
    const char *p = (const char *)t->data;
    switch (t->dtype) {
    case CN_BF16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return cn_bf16_to_f32(h);
    }
    case CN_F16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return cn_f16_to_f32(h);
    }
    default: {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    }
}

/* amax over slices of a tensor, each slice on a pool thread; `bad` is the first non-finite
 * index of a slice (-1: none), so the error names the same element whatever the thread count. */
#define AMAX_SLICES 64
typedef struct amax_job {
    const cn_st_tensor *t;
    int64_t n;
    float part[AMAX_SLICES];
    int64_t bad[AMAX_SLICES];
} amax_job;

static void amax_task(void *vctx, int begin, int end) {
    amax_job *j = vctx;
    for (int p = begin; p < end; p++) {
        int64_t i0 = j->n * p / AMAX_SLICES, i1 = j->n * (p + 1) / AMAX_SLICES;
        float a = 0;
        j->bad[p] = -1;
        for (int64_t i = i0; i < i1; i++) {
            float v = fabsf(src_value(j->t, i));
            if (!(v <= FLT_MAX)) {
                j->bad[p] = i;
                break;
            }
            a = fmaxf(a, v);
        }
        j->part[p] = a;
    }
}

static int tensor_amax(qctx *c, int src, float *out) {
    if (c->amax[src] < 0) {
        amax_job j = {.t = cn_st_at(c->st, src)};
        j.n = j.t->shape[0] * j.t->shape[1];
        cn_pool_for(c->pool, AMAX_SLICES, 1, amax_task, &j);
        float a = 0;
        for (int p = 0; p < AMAX_SLICES; p++) {
            if (j.bad[p] >= 0)
                return cn_err_set(c->err, CN_ERANGE, "tensor %s holds a non-finite value at %lld",
                                  j.t->name, (long long)j.bad[p]);
            a = fmaxf(a, j.part[p]);
        }
        c->amax[src] = a;
    }
    *out = c->amax[src];
    return CN_OK;
}

/* Bytes per output row of a matrix part. */
static int64_t part_row_bytes(part p, int64_t K) {
    switch (p) {
    case P_NVFP4_W: return K / 2;
    case P_NVFP4_S: return K / 16;
    case P_MX_S: return K / 32;
    default: return K;
    }
}

/* One chunk of a quantized part: the rows it touches, split over the pool. Each range quantizes
 * whole rows into its own scratch and copies the chunk's bytes of them; rows are independent,
 * so the output is the same for any thread count. */
typedef struct fill_job {
    const cn_st_tensor *t;
    part part;
    float g, fs;
    int64_t K, rb, r0;        /* row bytes of the part, first row of the chunk */
    uint64_t offset, nbytes;  /* the chunk within the part */
    uint8_t *dst;
    _Atomic int oom;
} fill_job;

static void fill_task(void *vctx, int begin, int end) {
    fill_job *j = vctx;
    const int64_t K = j->K;
    float *row = malloc((size_t)K * sizeof *row);
    uint8_t *q = malloc((size_t)K), *sc = malloc((size_t)K / 16 + 1);
    if (!row || !q || !sc) {
        j->oom = 1;
        goto out;
    }
    for (int64_t r = j->r0 + begin; r < j->r0 + end; r++) {
        for (int64_t k = 0; k < K; k++) row[k] = src_value(j->t, r * K + k);
        const uint8_t *res;
        switch (j->part) {
        case P_NVFP4_W:
        case P_NVFP4_S:
            cn_quantize_nvfp4_row(row, K, j->g, q, sc);
            res = j->part == P_NVFP4_W ? q : sc;
            break;
        case P_MX_W:
        case P_MX_S:
            cn_quantize_mxfp8_row(row, K, q, sc);
            res = j->part == P_MX_W ? q : sc;
            break;
        default: /* P_FP8_W */
            for (int64_t k = 0; k < K; k++) q[k] = cn_e4m3_encode(row[k] / j->fs);
            res = q;
            break;
        }
        /* the part of this row inside [offset, offset + nbytes) */
        uint64_t rs = (uint64_t)(r * j->rb), re = rs + (uint64_t)j->rb;
        uint64_t a = rs > j->offset ? rs : j->offset;
        uint64_t b = re < j->offset + j->nbytes ? re : j->offset + j->nbytes;
        memcpy(j->dst + (a - j->offset), res + (a - rs), b - a);
    }
out:
    free(row);
    free(q);
    free(sc);
}

static int qfill(void *vctx, int index, const char *name, uint64_t offset, void *buf,
                 uint64_t nbytes) {
    (void)name;
    qctx *c = vctx;
    const out_tensor *o = &c->outs[index];
    const cn_st_tensor *t = cn_st_at(c->st, o->src);
    if (o->part == P_COPY) {
        memcpy(buf, (const char *)t->data + offset, nbytes);
        return CN_OK;
    }
    float amax = 0;
    int rc = tensor_amax(c, o->src, &amax);
    if (rc) return rc;
    const float g = amax / (6.0f * 448.0f), fs = amax > 0 ? amax / 448.0f : 1.0f;
    if (o->part == P_NVFP4_S2 || o->part == P_FP8_S) {
        float v = o->part == P_NVFP4_S2 ? g : fs;
        memcpy(buf, &v, 4);
        return CN_OK;
    }
    if (nbytes == 0) return CN_OK;
    fill_job j = {.t = t, .part = o->part, .g = g, .fs = fs, .K = t->shape[1],
                  .offset = offset, .nbytes = nbytes, .dst = buf};
    j.rb = part_row_bytes(o->part, j.K);
    j.r0 = (int64_t)(offset / (uint64_t)j.rb);
    const int64_t r1 = (int64_t)((offset + nbytes - 1) / (uint64_t)j.rb) + 1;
    atomic_init(&j.oom, 0);
    cn_pool_for(c->pool, (int)(r1 - j.r0), 8, fill_task, &j);
    if (atomic_load(&j.oom)) return cn_err_set(c->err, CN_ENOMEM, "out of memory");
    return CN_OK;
}

/* ---------------------------------------------------------------- files */

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* Copies every regular file of in that is not weights or a config we rewrite. */
static int copy_side_files(const char *in, const char *out, cn_err *err) {
    DIR *d = opendir(in);
    if (!d) return cn_err_set(err, CN_ENOENT, "%s: cannot open directory", in);
    int rc = CN_OK;
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        const char *n = e->d_name;
        if (n[0] == '.' || ends_with(n, ".safetensors") || !strcmp(n, "model.safetensors.index.json") ||
            !strcmp(n, "config.json") || !strcmp(n, "hf_quant_config.json"))
            continue;
        char src[2048], dst[2048];
        snprintf(src, sizeof src, "%s/%s", in, n);
        snprintf(dst, sizeof dst, "%s/%s", out, n);
        struct stat sb;
        if (stat(src, &sb) || !S_ISREG(sb.st_mode)) continue;
        size_t len = 0;
        char *data = NULL;
        if ((rc = cn_read_file(src, &data, &len, err))) break;
        rc = cn_write_file_atomic(dst, data, len, err);
        free(data);
    }
    closedir(d);
    return rc;
}

static cJSON *quant_object(cn_qalgo algo, char *const *excl, int n_excl) {
    cJSON *q = cJSON_CreateObject();
    if (!q) return NULL;
    cJSON_AddStringToObject(q, "quant_algo", cn_qalgo_name(algo));
    cJSON_AddNullToObject(q, "kv_cache_quant_algo");
    if (algo == CN_QALGO_NVFP4) cJSON_AddNumberToObject(q, "group_size", 16);
    if (algo == CN_QALGO_MXFP8) cJSON_AddNumberToObject(q, "group_size", 32);
    cJSON *ex = cJSON_AddArrayToObject(q, "exclude_modules");
    for (int i = 0; ex && i < n_excl; i++) cJSON_AddItemToArray(ex, cJSON_CreateString(excl[i]));
    return q;
}

static int write_json(const char *dir, const char *name, cJSON *j, cn_err *err) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = j ? cJSON_Print(j) : NULL;
    if (!text) return cn_err_set(err, CN_ENOMEM, "out of memory writing %s", path);
    size_t n = strlen(text);
    char *with_nl = malloc(n + 2);
    int rc;
    if (!with_nl) {
        rc = cn_err_set(err, CN_ENOMEM, "out of memory writing %s", path);
    } else {
        memcpy(with_nl, text, n);
        with_nl[n] = '\n';
        rc = cn_write_file_atomic(path, with_nl, n + 1, err);
    }
    free(with_nl);
    cJSON_free(text);
    return rc;
}

/* config.json of in, with quantization_config set, into out; then hf_quant_config.json. */
static int write_configs(const char *in, const char *out, cn_qalgo algo, char *const *excl,
                         int n_excl, cn_err *err) {
    char path[2048];
    snprintf(path, sizeof path, "%s/config.json", in);
    char *text = NULL;
    int rc = cn_read_file(path, &text, NULL, err);
    if (rc) return rc;
    cJSON *cfg = cJSON_Parse(text);
    free(text);
    if (!cfg) return cn_err_set(err, CN_EFORMAT, "%s: not valid JSON", path);
    cJSON *qc = quant_object(algo, excl, n_excl);
    if (qc) cJSON_AddStringToObject(qc, "quant_method", "modelopt");
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "quantization_config");
    if (!qc || !cJSON_AddItemToObject(cfg, "quantization_config", qc)) {
        cJSON_Delete(qc);
        rc = cn_err_set(err, CN_ENOMEM, "out of memory");
    } else {
        rc = write_json(out, "config.json", cfg, err);
    }
    cJSON_Delete(cfg);
    if (rc) return rc;
    cJSON *hf = cJSON_CreateObject(), *q = quant_object(algo, excl, n_excl);
    cJSON *prod = hf ? cJSON_AddObjectToObject(hf, "producer") : NULL;
    /* "modelopt" is the producer name runtimes key on to read this file as modelopt's */
    int ok = prod && cJSON_AddStringToObject(prod, "name", "modelopt") &&
             cJSON_AddStringToObject(prod, "version", "cairn-quantize") && q &&
             cJSON_AddItemToObject(hf, "quantization", q);
    if (!ok) {
        if (!cJSON_GetObjectItemCaseSensitive(hf, "quantization")) cJSON_Delete(q);
        cJSON_Delete(hf);
        return cn_err_set(err, CN_ENOMEM, "out of memory");
    }
    rc = write_json(out, "hf_quant_config.json", hf, err);
    cJSON_Delete(hf);
    return rc;
}

/* ---------------------------------------------------------------- driver */

typedef struct strlist {
    char **v;
    int n, cap;
} strlist;

static int sl_add(strlist *l, const char *s) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 32;
        char **p = realloc(l->v, (size_t)cap * sizeof *p);
        if (!p) return CN_ENOMEM;
        l->v = p;
        l->cap = cap;
    }
    size_t n = strlen(s) + 1;
    if (!(l->v[l->n] = malloc(n))) return CN_ENOMEM;
    memcpy(l->v[l->n++], s, n);
    return CN_OK;
}

static void sl_free(strlist *l) {
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
}

static int kept(const strlist *keep, const char *module) {
    for (int i = 0; i < keep->n; i++)
        if (cn_qpattern_match(keep->v[i], module)) return 1;
    return 0;
}

/* The default keeps of quantize.h, plus the in/out_proj of Mamba layers feeding attention. */
static int default_keeps(strlist *keep, cn_qalgo algo, const cn_config *cfg) {
    static const char *const base[] = {"lm_head", "backbone.embeddings", "*.mixer.gate", "*.conv1d"};
    static const char *const attn[] = {"*.q_proj", "*.k_proj", "*.v_proj", "*.o_proj"};
    int rc = CN_OK;
    for (int i = 0; !rc && i < 4; i++) rc = sl_add(keep, base[i]);
    if (algo != CN_QALGO_NVFP4) return rc;
    for (int i = 0; !rc && i < 4; i++) rc = sl_add(keep, attn[i]);
    for (int l = 0; !rc && l < cfg->n_layers; l++) {
        if (!cn_mamba_feeds_attn(cfg->layers, cfg->n_layers, l)) continue;
        char n[128];
        snprintf(n, sizeof n, "backbone.layers.%d.mixer.in_proj", l);
        if (!kept(keep, n)) rc = sl_add(keep, n);
        snprintf(n, sizeof n, "backbone.layers.%d.mixer.out_proj", l);
        if (!rc && !kept(keep, n)) rc = sl_add(keep, n);
    }
    return rc;
}

static int same_dir(const char *a, const char *b) {
    struct stat sa, sb;
    return !stat(a, &sa) && !stat(b, &sb) && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int cn_quantize_dir(const cn_quantize_opts *o, cn_quantize_stats *stats, cn_err *err) {
    cn_quantize_stats stz = {0};
    cn_config cfg;
    cn_qconfig qin;
    cn_safetensors *st = NULL;
    cn_st_writer *w = NULL;
    strlist keep = {0};
    qctx c = {.err = err};
    int rc;
    memset(&cfg, 0, sizeof cfg);
    memset(&qin, 0, sizeof qin);
    if (o->algo != CN_QALGO_NVFP4 && o->algo != CN_QALGO_MXFP8 && o->algo != CN_QALGO_FP8)
        return cn_err_set(err, CN_EINVAL, "quantize: type must be nvfp4, mxfp8 or fp8");
    const int64_t blk = o->algo == CN_QALGO_NVFP4 ? 16 : o->algo == CN_QALGO_MXFP8 ? 32 : 1;
    if (mkdir(o->out_dir, 0755) && errno != EEXIST)
        return cn_err_set(err, CN_EIO, "%s: cannot create directory", o->out_dir);
    if (same_dir(o->in_dir, o->out_dir))
        return cn_err_set(err, CN_EINVAL, "quantize: --out %s is the input directory", o->out_dir);
    if ((rc = cn_config_load_dir(&cfg, o->in_dir, err))) goto done;
    if ((rc = cn_qconfig_load_dir(&qin, o->in_dir, err))) goto done;
    if (qin.present) {
        rc = cn_err_set(err, CN_EINVAL, "%s: already quantized (%s has a quantization config)",
                        o->in_dir, qin.source);
        goto done;
    }
    if ((rc = cn_st_open_dir(&st, o->in_dir, err))) goto done;
    rc = default_keeps(&keep, o->algo, &cfg);
    for (int i = 0; !rc && i < o->n_keep; i++) rc = sl_add(&keep, o->keep[i]);
    if (rc || (rc = cn_st_writer_new(&w, err))) {
        if (rc == CN_ENOMEM) cn_err_set(err, rc, "out of memory");
        goto done;
    }
    const int n_src = cn_st_count(st);
    c.st = st;
    c.outs = malloc((size_t)(4 * n_src + 1) * sizeof *c.outs);
    c.amax = malloc((size_t)(n_src + 1) * sizeof *c.amax);
    if (!c.outs || !c.amax) {
        rc = cn_err_set(err, CN_ENOMEM, "out of memory");
        goto done;
    }
    int n_out = 0;
    for (int i = 0; i < n_src; i++) {
        const cn_st_tensor *t = cn_st_at(st, i);
        char module[512], nm[600];
        c.amax[i] = -1;
        stz.bytes_in += t->nbytes;
        if (t->dtype == CN_U8 || t->dtype == CN_F8_E4M3 || t->dtype == CN_F8_E5M2) {
            rc = cn_err_set(err, CN_EINVAL, "%s: already quantized (tensor %s is %s)", o->in_dir,
                            t->name, cn_dtype_name(t->dtype));
            goto done;
        }
        int is_matrix = t->ndim == 2 && ends_with(t->name, ".weight") &&
                        (t->dtype == CN_F32 || t->dtype == CN_BF16 || t->dtype == CN_F16);
        snprintf(module, sizeof module, "%.*s", (int)strlen(t->name) - (is_matrix ? 7 : 0), t->name);
        int quant = is_matrix && !kept(&keep, module);
        if (quant && t->shape[1] % blk) {
            cn_warn("quantize: %s: K = %lld is not a multiple of the %s block size %lld; kept as %s",
                    t->name, (long long)t->shape[1], cn_qalgo_name(o->algo), (long long)blk,
                    cn_dtype_name(t->dtype));
            if ((rc = sl_add(&keep, module))) goto oom;
            quant = 0;
        }
        if (!quant) {
            if (is_matrix) stz.n_kept++;
            c.outs[n_out++] = (out_tensor){i, P_COPY};
            if ((rc = cn_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, err))) goto done;
            continue;
        }
        stz.n_quantized++;
        const int64_t N = t->shape[0], K = t->shape[1];
        int64_t sh[2] = {N, K};
        switch (o->algo) {
        case CN_QALGO_NVFP4:
            sh[1] = K / 2;
            c.outs[n_out++] = (out_tensor){i, P_NVFP4_W};
            if ((rc = cn_st_writer_add(w, t->name, CN_U8, 2, sh, err))) goto done;
            sh[1] = K / 16;
            snprintf(nm, sizeof nm, "%s_scale", t->name);
            c.outs[n_out++] = (out_tensor){i, P_NVFP4_S};
            if ((rc = cn_st_writer_add(w, nm, CN_F8_E4M3, 2, sh, err))) goto done;
            snprintf(nm, sizeof nm, "%s_scale_2", t->name);
            c.outs[n_out++] = (out_tensor){i, P_NVFP4_S2};
            if ((rc = cn_st_writer_add(w, nm, CN_F32, 0, sh, err))) goto done;
            break;
        case CN_QALGO_MXFP8:
            c.outs[n_out++] = (out_tensor){i, P_MX_W};
            if ((rc = cn_st_writer_add(w, t->name, CN_F8_E4M3, 2, sh, err))) goto done;
            sh[1] = K / 32;
            snprintf(nm, sizeof nm, "%s_scale", t->name);
            c.outs[n_out++] = (out_tensor){i, P_MX_S};
            if ((rc = cn_st_writer_add(w, nm, CN_U8, 2, sh, err))) goto done;
            break;
        default:
            c.outs[n_out++] = (out_tensor){i, P_FP8_W};
            if ((rc = cn_st_writer_add(w, t->name, CN_F8_E4M3, 2, sh, err))) goto done;
            snprintf(nm, sizeof nm, "%s_scale", t->name);
            c.outs[n_out++] = (out_tensor){i, P_FP8_S};
            if ((rc = cn_st_writer_add(w, nm, CN_F32, 0, sh, err))) goto done;
            break;
        }
    }
    int n_threads = o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads > 1 && !(c.pool = cn_pool_create(n_threads))) goto oom;
    stz.bytes_out = cn_st_writer_total_bytes(w);
    if ((rc = cn_st_writer_write(w, o->out_dir, o->shard_bytes, qfill, &c, err))) goto done;
    if ((rc = copy_side_files(o->in_dir, o->out_dir, err))) goto done;
    rc = write_configs(o->in_dir, o->out_dir, o->algo, keep.v, keep.n, err);
    if (!rc && stats) *stats = stz;
    goto done;
oom:
    rc = cn_err_set(err, CN_ENOMEM, "out of memory");
done:
    free(c.outs);
    free(c.amax);
    cn_pool_free(c.pool);
    sl_free(&keep);
    cn_st_writer_free(w);
    if (st) cn_st_close(st);
    cn_qconfig_free(&qin);
    cn_config_free(&cfg);
    return rc;
}
