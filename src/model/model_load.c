/* model_load.c - binds the checkpoint's tensors to the model's weight structs.
 *
 * Every tensor the config implies is looked up by its published name and checked for shape and
 * dtype before anything is used, so a defective checkpoint fails here with a message naming the
 * tensor (expected vs found), never later inside a kernel. Big matrices stay in the mapping
 * (cn_backend_weight makes them usable: nothing on CPU, an upload on GPUs); small vectors are
 * converted to F32 and owned by the model.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fp.h"
#include "model/model_impl.h"

#define NAME_MAX_LEN 256

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t off = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (off < n) snprintf(buf + off, n - off, "]");
}

static int check_shape(const cn_st_tensor *t, int ndim, const int64_t *shape, cn_err *err) {
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (ok) return CN_OK;
    char want[96], got[96];
    shape_str(want, sizeof want, ndim, shape);
    shape_str(got, sizeof got, t->ndim, t->shape);
    return cn_err_set(err, CN_ESHAPE, "tensor %s has shape %s, expected %s", t->name, got, want);
}

static const cn_st_tensor *need(cn_model *m, const char *name, cn_err *err) {
    const cn_st_tensor *t = cn_st_find(m->st, name);
    if (!t) cn_err_set(err, CN_ENOTENSOR, "missing tensor %s", name);
    return t;
}

/* One F32 (or BF16) scalar tensor `name`, the per-tensor scale of `of`. */
static int read_scalar(cn_model *m, const char *name, const char *of, const char *role, float *out,
                       cn_err *err) {
    const cn_st_tensor *s = cn_st_find(m->st, name);
    if (!s) return cn_err_set(err, CN_ENOTENSOR, "missing tensor %s (%s %s)", name, role, of);
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->shape[i];
    if (n != 1 || (s->dtype != CN_F32 && s->dtype != CN_BF16))
        return cn_err_set(err, CN_ESHAPE,
                          "tensor %s: expected one F32 value (%s %s), found %lld of %s", name,
                          role, of, (long long)n, cn_dtype_name(s->dtype));
    *out = s->dtype == CN_F32 ? *(const float *)s->data : cn_bf16_to_f32(*(const uint16_t *)s->data);
    return CN_OK;
}

/* A descriptor the model owns (freed at close); its data stays in the mapping. */
static cn_tensor *new_desc(cn_model *m) {
    if (m->n_descs == m->cap_descs) {
        int cap = m->cap_descs ? 2 * m->cap_descs : 64;
        cn_tensor **p = realloc(m->descs, (size_t)cap * sizeof *p);
        if (!p) return NULL;
        m->descs = p;
        m->cap_descs = cap;
    }
    cn_tensor *t = calloc(1, sizeof *t);
    if (t) m->descs[m->n_descs++] = t;
    return t;
}

/* The block scales `name` of `of` ([rows, cols / blk], E4M3 for NVFP4, E8M0 or U8 for MXFP8),
 * bound into a model-owned descriptor. */
static int bind_block_scale(cn_model *m, cn_tensor *w, const char *name, const char *of,
                            int64_t rows, int64_t cols, int64_t blk, cn_err *err) {
    const char *fmt = blk == 16 ? "NVFP4" : "MXFP8";
    const cn_st_tensor *s = cn_st_find(m->st, name);
    if (!s)
        return cn_err_set(err, CN_ENOTENSOR, "missing tensor %s (block scales of %s tensor %s)",
                          name, fmt, of);
    int ok_dt = blk == 16 ? (s->dtype == CN_F8_E4M3 || s->dtype == CN_U8)
                          : (s->dtype == CN_F8_E8M0 || s->dtype == CN_U8);
    if (!ok_dt)
        return cn_err_set(err, CN_EDTYPE, "tensor %s: dtype %s, expected %s (block scales of %s)",
                          name, cn_dtype_name(s->dtype), blk == 16 ? "F8_E4M3" : "U8 or F8_E8M0",
                          of);
    int64_t shape[2] = {rows, cols / blk};
    int rc = check_shape(s, 2, shape, err);
    if (rc) return rc;
    cn_tensor *d = new_desc(m);
    if (!d) return cn_err_set(err, CN_ENOMEM, "out of memory");
    cn_tensor_init(d, s->dtype, 2, shape, (void *)s->data);
    d->name = s->name;
    if ((rc = cn_backend_weight(m->b, d)))
        return cn_err_set(err, rc, "cannot place %s on the %s backend: %s", name,
                          cn_backend_name(m->b), cn_strerror(rc));
    w->block_scale = d;
    return CN_OK;
}

static const char *fmt_of_dtype(cn_dtype dt) {
    return dt == CN_U8 ? "U8 (packed NVFP4)" : cn_dtype_name(dt);
}

/* A weight matrix [rows, cols] used in place, in the format the quantization config gives its
 * module (quant_config.h), or the one its stored dtype implies when there is no config:
 *   F32/BF16/F16   as stored (modules excluded from quantization, or never quantized: modelopt
 *                  leaves non-Linear modules such as the router in high precision whatever the
 *                  global quant_algo says)
 *   FP8            X.weight F8_E4M3 [rows, cols] + X.weight_scale one F32
 *   NVFP4          X.weight U8 [rows, cols/2] + X.weight_scale E4M3 [rows, cols/16]
 *                  + X.weight_scale_2 one F32
 *   MXFP8          X.weight F8_E4M3 [rows, cols] + X.weight_scale U8/E8M0 [rows, cols/32]
 * X.input_scale (static activation scale) is not needed: activations stay in fp32/int8 here. */
static int bind_matrix(cn_model *m, cn_tensor *out, const char *name, int64_t rows, int64_t cols,
                       cn_err *err) {
    const cn_st_tensor *t = need(m, name, err);
    if (!t) return CN_ENOTENSOR;
    char module[NAME_MAX_LEN], sname[NAME_MAX_LEN], s2name[NAME_MAX_LEN];
    size_t ln = strlen(name);
    snprintf(module, sizeof module, "%.*s", (int)(ln > 7 && !strcmp(name + ln - 7, ".weight") ? ln - 7 : ln), name);
    snprintf(sname, sizeof sname, "%s_scale", name);    /* X.weight -> X.weight_scale */
    snprintf(s2name, sizeof s2name, "%s_scale_2", name); /* X.weight -> X.weight_scale_2 */
    cn_qalgo algo = cn_qconfig_module(&m->qc, module);
    int64_t shape[2] = {rows, cols};
    int rc;

    if (t->dtype == CN_F32 || t->dtype == CN_BF16 || t->dtype == CN_F16) {
        if ((rc = check_shape(t, 2, shape, err))) return rc;
        cn_tensor_init(out, t->dtype, 2, shape, (void *)t->data);
        out->name = t->name;
        return cn_backend_weight(m->b, out);
    }
    if (t->dtype != CN_U8 && t->dtype != CN_F8_E4M3)
        return cn_err_set(err, CN_EDTYPE, "tensor %s: dtype %s is not supported for weights", name,
                          cn_dtype_name(t->dtype));
    if (algo == CN_QALGO_AUTO) { /* no config: the stored tensors decide */
        const cn_st_tensor *s = cn_st_find(m->st, sname);
        algo = t->dtype == CN_U8 ? CN_QALGO_NVFP4
             : s && s->ndim == 2 && s->shape[1] > 1 ? CN_QALGO_MXFP8 : CN_QALGO_FP8;
    }
    cn_dtype want = algo == CN_QALGO_NVFP4 ? CN_U8 : CN_F8_E4M3;
    if (algo == CN_QALGO_NONE || t->dtype != want)
        return cn_err_set(err, CN_EDTYPE,
                          "tensor %s is %s but %s gives module %s quant_algo %s (expected %s)", name,
                          fmt_of_dtype(t->dtype), m->qc.source, module, cn_qalgo_name(algo),
                          algo == CN_QALGO_NONE ? "F32, BF16 or F16" : fmt_of_dtype(want));
    if (!cn_backend_supports_weight(m->b, algo == CN_QALGO_NVFP4 ? CN_NVFP4 :
                                          algo == CN_QALGO_MXFP8 ? CN_MXFP8 : CN_F8_E4M3))
        return cn_err_set(err, CN_EDTYPE, "tensor %s: %s weights are not supported by the %s backend",
                          name, cn_qalgo_name(algo), cn_backend_name(m->b));
    switch (algo) {
    case CN_QALGO_NVFP4: {
        if (cols % 16)
            return cn_err_set(err, CN_ESHAPE, "tensor %s: K = %lld is not a multiple of the NVFP4 "
                              "block size 16", name, (long long)cols);
        int64_t packed[2] = {rows, cols / 2};
        if ((rc = check_shape(t, 2, packed, err))) return rc;
        cn_tensor_init(out, CN_NVFP4, 2, shape, (void *)t->data);
        out->name = t->name;
        if ((rc = bind_block_scale(m, out, sname, name, rows, cols, 16, err))) return rc;
        if ((rc = read_scalar(m, s2name, name, "global scale of NVFP4 tensor", &out->scale, err))) return rc;
        break;
    }
    case CN_QALGO_MXFP8:
        if (cols % 32)
            return cn_err_set(err, CN_ESHAPE, "tensor %s: K = %lld is not a multiple of the MXFP8 "
                              "block size 32", name, (long long)cols);
        if ((rc = check_shape(t, 2, shape, err))) return rc;
        cn_tensor_init(out, CN_MXFP8, 2, shape, (void *)t->data);
        out->name = t->name;
        if ((rc = bind_block_scale(m, out, sname, name, rows, cols, 32, err))) return rc;
        break;
    default: /* FP8 per tensor */
        if ((rc = check_shape(t, 2, shape, err))) return rc;
        cn_tensor_init(out, CN_F8_E4M3, 2, shape, (void *)t->data);
        out->name = t->name;
        if ((rc = read_scalar(m, sname, name, "per-tensor scale of F8 tensor", &out->scale, err)))
            return rc;
        break;
    }
    return cn_backend_weight(m->b, out);
}

static int own(cn_model *m, cn_tensor *t) {
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? 2 * m->cap_owned : 64;
        cn_tensor **p = realloc(m->owned, (size_t)cap * sizeof *p);
        if (!p) return CN_ENOMEM;
        m->owned = p;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = t;
    return CN_OK;
}

/* A small vector (or tiny matrix) converted to F32 and uploaded; the model owns it. ndim/shape are
 * what the checkpoint must hold; the result is viewed as out_rows x out_cols. */
static int bind_vector(cn_model *m, cn_tensor *out, const char *name, int ndim, const int64_t *shape,
                       int64_t out_rows, int64_t out_cols, cn_err *err) {
    const cn_st_tensor *t = need(m, name, err);
    if (!t) return CN_ENOTENSOR;
    int rc = check_shape(t, ndim, shape, err);
    if (rc) return rc;
    int64_t n = out_rows * out_cols;
    float *host = malloc((size_t)n * sizeof *host);
    if (!host) return cn_err_set(err, CN_ENOMEM, "out of memory converting %s", name);
    for (int64_t i = 0; i < n; i++) {
        switch (t->dtype) {
        case CN_F32: memcpy(&host[i], (const char *)t->data + 4 * i, 4); break;
        case CN_BF16: {
            uint16_t h;
            memcpy(&h, (const char *)t->data + 2 * i, 2);
            host[i] = cn_bf16_to_f32(h);
            break;
        }
        case CN_F16: {
            uint16_t h;
            memcpy(&h, (const char *)t->data + 2 * i, 2);
            host[i] = cn_f16_to_f32(h);
            break;
        }
        default:
            free(host);
            return cn_err_set(err, CN_EDTYPE, "tensor %s: dtype %s is not supported (expected F32, BF16 or F16)",
                              name, cn_dtype_name(t->dtype));
        }
    }
    if (out_rows == 1) *out = cn_tensor_1d(CN_F32, out_cols, NULL);
    else *out = cn_tensor_2d(CN_F32, out_rows, out_cols, NULL);
    out->name = t->name;
    rc = cn_backend_alloc(m->b, out);
    if (!rc) rc = own(m, out);
    if (!rc) rc = cn_backend_upload(m->b, out, 0, host, (uint64_t)n * sizeof *host);
    free(host);
    if (rc) return cn_err_set(err, rc, "cannot place %s on the %s backend: %s", name,
                              cn_backend_name(m->b), cn_strerror(rc));
    return CN_OK;
}

static int bind_vec1(cn_model *m, cn_tensor *out, const char *name, int64_t n, cn_err *err) {
    return bind_vector(m, out, name, 1, &n, 1, n, err);
}

#define FMT(buf, ...) snprintf(buf, sizeof buf, __VA_ARGS__)

/* buf = a ++ b, cut to NAME_MAX_LEN - 1 bytes (published names are far shorter). */
static const char *join(char *buf, const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > NAME_MAX_LEN - 1) la = NAME_MAX_LEN - 1;
    if (lb > NAME_MAX_LEN - 1 - la) lb = NAME_MAX_LEN - 1 - la;
    memcpy(buf, a, la);
    memcpy(buf + la, b, lb);
    buf[la + lb] = '\0';
    return buf;
}

static int bind_mamba(cn_model *m, cn_mamba_w *w, const char *p, cn_err *err) {
    const cn_config *c = &m->cfg;
    char n[NAME_MAX_LEN];
    int64_t H = c->hidden_size, nh = c->mamba_n_heads, K = c->conv_kernel;
    int rc;
    if (c->mamba_proj_bias) return cn_err_set(err, CN_ECONFIG, "config: mamba_proj_bias=true is not supported");
    if ((rc = bind_matrix(m, &w->in_proj, join(n, p, "in_proj.weight"), m->in_proj_dim, H, err))) return rc;
    int64_t cshape[3] = {m->conv_dim, 1, K};
    if ((rc = bind_vector(m, &w->conv_w, join(n, p, "conv1d.weight"), 3, cshape, m->conv_dim, K, err)))
        return rc;
    if (c->use_conv_bias) {
        if ((rc = bind_vec1(m, &w->conv_b, join(n, p, "conv1d.bias"), m->conv_dim, err))) return rc;
    } else {
        w->conv_b.data = NULL;
    }
    if ((rc = bind_vec1(m, &w->dt_bias, join(n, p, "dt_bias"), nh, err))) return rc;
    if ((rc = bind_vec1(m, &w->A_log, join(n, p, "A_log"), nh, err))) return rc;
    if ((rc = bind_vec1(m, &w->D, join(n, p, "D"), nh, err))) return rc;
    if ((rc = bind_vec1(m, &w->norm, join(n, p, "norm.weight"), m->d_inner, err))) return rc;
    return bind_matrix(m, &w->out_proj, join(n, p, "out_proj.weight"), H, m->d_inner, err);
}

static int bind_attn(cn_model *m, cn_attn_w *w, const char *p, cn_err *err) {
    const cn_config *c = &m->cfg;
    char n[NAME_MAX_LEN];
    int64_t H = c->hidden_size, q = (int64_t)c->n_heads * c->head_dim,
            kv = (int64_t)c->n_kv_heads * c->head_dim;
    int rc;
    if (c->attention_bias) return cn_err_set(err, CN_ECONFIG, "config: attention_bias=true is not supported");
    if ((rc = bind_matrix(m, &w->q, join(n, p, "q_proj.weight"), q, H, err))) return rc;
    if ((rc = bind_matrix(m, &w->k, join(n, p, "k_proj.weight"), kv, H, err))) return rc;
    if ((rc = bind_matrix(m, &w->v, join(n, p, "v_proj.weight"), kv, H, err))) return rc;
    return bind_matrix(m, &w->o, join(n, p, "o_proj.weight"), H, q, err);
}

static int bind_moe(cn_model *m, cn_moe_w *w, const char *p, cn_err *err) {
    const cn_config *c = &m->cfg;
    char n[NAME_MAX_LEN];
    char suf[64];
    int64_t H = c->hidden_size, E = c->n_routed_experts, I = c->moe_intermediate_size;
    int rc;
    if (c->mlp_bias) return cn_err_set(err, CN_ECONFIG, "config: mlp_bias=true is not supported");
    if ((rc = bind_matrix(m, &w->gate, join(n, p, "gate.weight"), E, H, err))) return rc;
    join(n, p, "gate.e_score_correction_bias");
    if (cn_st_find(m->st, n)) {
        if ((rc = bind_vec1(m, &w->bias, n, E, err))) return rc;
    } else {
        w->bias.data = NULL;
    }
    w->up = calloc((size_t)E, sizeof *w->up);
    w->down = calloc((size_t)E, sizeof *w->down);
    w->up_p = calloc((size_t)(E + CN_MOE_MAX_PARTS), sizeof *w->up_p);
    w->down_p = calloc((size_t)(E + CN_MOE_MAX_PARTS), sizeof *w->down_p);
    if (!w->up || !w->down || !w->up_p || !w->down_p) return cn_err_set(err, CN_ENOMEM, "out of memory");
    for (int64_t e = 0; e < E; e++) {
        if ((rc = bind_matrix(m, &w->up[e], join(n, p, (FMT(suf, "experts.%lld.up_proj.weight", (long long)e), suf)), I, H, err)))
            return rc;
        if ((rc = bind_matrix(m, &w->down[e], join(n, p, (FMT(suf, "experts.%lld.down_proj.weight", (long long)e), suf)), H, I, err)))
            return rc;
        w->up_p[e] = &w->up[e];
        w->down_p[e] = &w->down[e];
    }
    w->has_shared = c->n_shared_experts > 0;
    if (w->has_shared) {
        int64_t Is = c->moe_shared_intermediate_size;
        if ((rc = bind_matrix(m, &w->shared_up, join(n, p, "shared_experts.up_proj.weight"), Is, H, err)))
            return rc;
        if ((rc = bind_matrix(m, &w->shared_down, join(n, p, "shared_experts.down_proj.weight"), H, Is, err)))
            return rc;
    }
    cn_moe_fold_shared(m, w);
    return CN_OK;
}

int cn_moe_parts_of(const cn_config *c) {
    const int64_t I = c->moe_intermediate_size, Is = c->moe_shared_intermediate_size;
    if (c->n_shared_experts <= 0 || I <= 0 || Is % I || Is / I > CN_MOE_MAX_PARTS) return 0;
    return (int)(Is / I);
}

/* One table serves one kernel, so the parts must share the routed experts' formats (a mixed
 * precision map may keep the shared expert in another); the scale blocks divide I, as the
 * routed down projections' K. */
void cn_moe_fold_shared(const cn_model *m, cn_moe_w *w) {
    const cn_config *c = &m->cfg;
    const int E = c->n_routed_experts, P = cn_moe_parts_of(c);
    const int64_t H = c->hidden_size, I = c->moe_intermediate_size;
    w->n_parts = 0;
    if (!P || !w->has_shared || E <= 0 || m->shared_apart) return;
    for (int e = 1; e < E; e++)
        if (w->up[e].dtype != w->up[0].dtype || w->down[e].dtype != w->down[0].dtype) return;
    if (w->shared_up.dtype != w->up[0].dtype || w->shared_down.dtype != w->down[0].dtype) return;
    for (int i = 0; i < P; i++) {
        w->part_up[i] = cn_weight_view(&w->shared_up, i * I, I, 0, H, &w->part_up_bs[i]);
        w->part_down[i] = cn_weight_view(&w->shared_down, 0, H, i * I, I, &w->part_down_bs[i]);
        w->up_p[E + i] = &w->part_up[i];
        w->down_p[E + i] = &w->part_down[i];
    }
    w->n_parts = P;
}

static int bind_mlp(cn_model *m, cn_mlp_w *w, const char *p, cn_err *err) {
    const cn_config *c = &m->cfg;
    char n[NAME_MAX_LEN];
    int64_t H = c->hidden_size, I = c->intermediate_size;
    int rc;
    if (c->mlp_bias) return cn_err_set(err, CN_ECONFIG, "config: mlp_bias=true is not supported");
    if ((rc = bind_matrix(m, &w->up, join(n, p, "up_proj.weight"), I, H, err))) return rc;
    return bind_matrix(m, &w->down, join(n, p, "down_proj.weight"), H, I, err);
}

/* One block: its pre-norm at `prefix`norm.weight and its mixer at `prefix`mixer.* */
static int bind_layer(cn_model *m, cn_layer_w *l, cn_block type, const char *prefix, cn_err *err) {
    char n[NAME_MAX_LEN], mp[NAME_MAX_LEN];
    int rc;
    l->type = type;
    if ((rc = bind_vec1(m, &l->norm, join(n, prefix, "norm.weight"), m->cfg.hidden_size, err))) return rc;
    join(mp, prefix, "mixer.");
    switch (type) {
    case CN_BLOCK_MAMBA: return bind_mamba(m, &l->mamba, mp, err);
    case CN_BLOCK_ATTN:
    case CN_BLOCK_SWA: return bind_attn(m, &l->attn, mp, err);
    case CN_BLOCK_MOE: return bind_moe(m, &l->moe, mp, err);
    case CN_BLOCK_MLP: return bind_mlp(m, &l->mlp, mp, err);
    }
    return cn_err_set(err, CN_ECONFIG, "layer type '%c' is unknown", (char)type);
}

static int bind_mtp(cn_model *m, cn_err *err) {
    const cn_config *c = &m->cfg;
    cn_mtp_w *w = &m->w.mtp;
    char n[NAME_MAX_LEN], p[NAME_MAX_LEN];
    int64_t H = c->hidden_size;
    int rc;
    if (c->n_mtp > 1)
        return cn_err_set(err, CN_ECONFIG, "config: num_nextn_predict_layers=%d, only 1 is supported", c->n_mtp);
    if ((rc = bind_vec1(m, &w->enorm, "mtp.layers.0.enorm.weight", H, err))) return rc;
    if ((rc = bind_vec1(m, &w->hnorm, "mtp.layers.0.hnorm.weight", H, err))) return rc;
    if ((rc = bind_matrix(m, &w->eh_proj, "mtp.layers.0.eh_proj.weight", H, 2 * H, err))) return rc;
    w->layers = calloc((size_t)c->n_mtp_layers, sizeof *w->layers);
    if (!w->layers) return cn_err_set(err, CN_ENOMEM, "out of memory");
    for (int i = 0; i < c->n_mtp_layers; i++) {
        FMT(p, "mtp.layers.%d.", i);
        if ((rc = bind_layer(m, &w->layers[i], (cn_block)c->mtp_layers[i], p, err))) return rc;
    }
    FMT(n, "mtp.layers.%d.final_layernorm.weight", c->n_mtp_layers - 1);
    return bind_vec1(m, &w->final_norm, n, H, err);
}

int cn_model_bind_weights(cn_model *m, cn_err *err) {
    const cn_config *c = &m->cfg;
    cn_weights *w = &m->w;
    char p[NAME_MAX_LEN];
    int64_t H = c->hidden_size, V = c->vocab_size;
    int rc;
    m->d_inner = c->mamba_n_heads * c->mamba_head_dim;
    m->conv_dim = m->d_inner + 2 * c->n_groups * c->ssm_state_size;
    m->in_proj_dim = m->d_inner + m->conv_dim + c->mamba_n_heads;
    if ((rc = bind_matrix(m, &w->embed, "backbone.embeddings.weight", V, H, err))) return rc;
    if ((rc = bind_vec1(m, &w->norm_f, "backbone.norm_f.weight", H, err))) return rc;
    if (c->tie_word_embeddings) w->lm_head = w->embed;
    else if ((rc = bind_matrix(m, &w->lm_head, "lm_head.weight", V, H, err))) return rc;
    w->layers = calloc((size_t)c->n_layers, sizeof *w->layers);
    if (!w->layers) return cn_err_set(err, CN_ENOMEM, "out of memory");
    for (int l = 0; l < c->n_layers; l++) {
        FMT(p, "backbone.layers.%d.", l);
        if ((rc = bind_layer(m, &w->layers[l], (cn_block)c->layers[l], p, err))) return rc;
    }
    /* A config that promises an MTP head must ship one; a checkpoint without mtp.* tensors and
     * without the promise simply has none. */
    w->has_mtp = c->n_mtp > 0 && c->n_mtp_layers > 0;
    if (w->has_mtp && (rc = bind_mtp(m, err))) return rc;
    return CN_OK;
}

void cn_model_free_layer(cn_layer_w *l) {
    if (l->type != CN_BLOCK_MOE) return;
    free(l->moe.up);
    free(l->moe.down);
    free(l->moe.up_p);
    free(l->moe.down_p);
}

void cn_model_unbind_weights(cn_model *m) {
    cn_model_mtp_draft_free(m);
    for (int i = 0; i < m->n_descs; i++) free(m->descs[i]);
    free(m->descs);
    m->descs = NULL;
    m->n_descs = m->cap_descs = 0;
    for (int i = 0; i < m->n_owned; i++) cn_backend_release(m->b, m->owned[i]);
    free(m->owned);
    m->owned = NULL;
    m->n_owned = m->cap_owned = 0;
    if (m->w.layers)
        for (int l = 0; l < m->cfg.n_layers; l++) cn_model_free_layer(&m->w.layers[l]);
    free(m->w.layers);
    m->w.layers = NULL;
    if (m->w.mtp.layers)
        for (int l = 0; l < m->cfg.n_mtp_layers; l++) cn_model_free_layer(&m->w.mtp.layers[l]);
    free(m->w.mtp.layers);
    m->w.mtp.layers = NULL;
}
