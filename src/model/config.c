/* config.c - config.json / generation_config.json into a cn_config; see config.h.
 *
 * Promises: every required field that is missing, of the wrong JSON type or out of range is an
 * error (CN_ECONFIG, or CN_ENOENT/CN_EIO for the files) whose message reads
 *     "<file>: <field>: <what is wrong>"
 * and the config is left zeroed. Optional fields take the transformers NemotronHConfig defaults
 * (or the header's, where the header says otherwise). Legacy field names that transformers still
 * accepts (mamba_n_groups, mamba_d_conv, mamba_chunk_size, mamba_conv_bias, mamba_dt_limit,
 * layer_types, num_local_experts, norm_eps) are read when the current name is absent.
 * Never: reads weights, keeps a pointer into the JSON, or logs anything but the
 * num_hidden_layers mismatch warning (transformers warns there too and trusts the pattern).
 */
#include "model/config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/readfile.h"

/* Where a field is being read from: the file name for messages and the JSON object. */
typedef struct src {
    const char *what;
    const cJSON *obj;
} src;

/* ---------------------------------------------------------------------------------------------
 * Field readers. Each returns 0 or CN_ECONFIG with "<what>: <name>: ..." in err.
 * ------------------------------------------------------------------------------------------- */

/* The first of up to two names that is present (the second is a legacy alias); NULL if neither. */
static const cJSON *field2(const src *s, const char *name, const char *alias, const char **used) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(s->obj, name);
    *used = name;
    if (!j && alias) {
        j = cJSON_GetObjectItemCaseSensitive(s->obj, alias);
        if (j) *used = alias;
    }
    return j;
}

static const char *json_type_name(const cJSON *j) {
    if (cJSON_IsNull(j)) return "null";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsArray(j)) return "a list";
    if (cJSON_IsObject(j)) return "an object";
    return "an invalid value";
}

/* 1 if j is a number with an integral value inside int range. */
static int json_is_int(const cJSON *j) {
    if (!cJSON_IsNumber(j)) return 0;
    double v = j->valuedouble;
    return isfinite(v) && v == floor(v) && v >= (double)INT32_MIN && v <= (double)INT32_MAX;
}

/* Reads an integer field >= min. A missing (or null) field is an error when required, else *out
 * gets def. */
static int get_int(const src *s, const char *name, const char *alias, int required, int def,
                   int min, int *out, cn_err *err) {
    const char *used;
    const cJSON *j = field2(s, name, alias, &used);
    if (!j || cJSON_IsNull(j)) {
        if (required)
            return cn_err_set(err, CN_ECONFIG, "%s: %s: required field is missing", s->what, name);
        *out = def;
        return CN_OK;
    }
    if (!json_is_int(j)) {
        if (cJSON_IsNumber(j))
            return cn_err_set(err, CN_ECONFIG, "%s: %s: must be an integer, got %g", s->what, used,
                              j->valuedouble);
        return cn_err_set(err, CN_ECONFIG, "%s: %s: must be an integer, got %s", s->what, used,
                          json_type_name(j));
    }
    int v = (int)j->valuedouble;
    if (v < min)
        return cn_err_set(err, CN_ECONFIG, "%s: %s: must be >= %d, got %d", s->what, used, min, v);
    *out = v;
    return CN_OK;
}

/* Reads a boolean field; 0/1 numbers are accepted because some exporters write them. */
static int get_bool(const src *s, const char *name, const char *alias, int def, int *out,
                    cn_err *err) {
    const char *used;
    const cJSON *j = field2(s, name, alias, &used);
    if (!j || cJSON_IsNull(j)) {
        *out = def;
        return CN_OK;
    }
    if (cJSON_IsBool(j)) {
        *out = cJSON_IsTrue(j) ? 1 : 0;
        return CN_OK;
    }
    if (json_is_int(j) && (j->valuedouble == 0 || j->valuedouble == 1)) {
        *out = (int)j->valuedouble;
        return CN_OK;
    }
    return cn_err_set(err, CN_ECONFIG, "%s: %s: must be true or false, got %s", s->what, used,
                      json_type_name(j));
}

/* Reads a number field; *present (if given) says whether it was there. */
static int get_float(const src *s, const char *name, const char *alias, float def, float *out,
                     int *present, cn_err *err) {
    const char *used;
    const cJSON *j = field2(s, name, alias, &used);
    if (present) *present = 0;
    if (!j || cJSON_IsNull(j)) {
        *out = def;
        return CN_OK;
    }
    if (!cJSON_IsNumber(j) || isnan(j->valuedouble))
        return cn_err_set(err, CN_ECONFIG, "%s: %s: must be a number, got %s", s->what, used,
                          json_type_name(j));
    *out = (float)j->valuedouble;
    if (present) *present = 1;
    return CN_OK;
}

/* eos_token_id: an int, a list of ints, or null/absent (n_eos = 0). *present says which. */
static int get_eos(const src *s, int *ids, int *n, int *present, cn_err *err) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(s->obj, "eos_token_id");
    *present = 0;
    if (!j || cJSON_IsNull(j)) return CN_OK;
    *present = 1;
    if (json_is_int(j)) {
        if (j->valuedouble < 0)
            return cn_err_set(err, CN_ECONFIG, "%s: eos_token_id: must be >= 0, got %g", s->what,
                              j->valuedouble);
        ids[0] = (int)j->valuedouble;
        *n = 1;
        return CN_OK;
    }
    if (!cJSON_IsArray(j))
        return cn_err_set(err, CN_ECONFIG, "%s: eos_token_id: must be an integer or a list of "
                          "integers, got %s", s->what, json_type_name(j));
    int k = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, j) {
        if (!json_is_int(e) || e->valuedouble < 0)
            return cn_err_set(err, CN_ECONFIG, "%s: eos_token_id[%d]: must be an integer >= 0",
                              s->what, k);
        if (k == CN_MAX_EOS)
            return cn_err_set(err, CN_ECONFIG, "%s: eos_token_id: more than %d ids", s->what,
                              CN_MAX_EOS);
        ids[k++] = (int)e->valuedouble;
    }
    *n = k;
    return CN_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Layer patterns
 * ------------------------------------------------------------------------------------------- */

static int block_from_char(char ch) {
    return ch == CN_BLOCK_MAMBA || ch == CN_BLOCK_ATTN || ch == CN_BLOCK_SWA || ch == CN_BLOCK_MOE ||
           ch == CN_BLOCK_MLP;
}

/* layers_block_type names, new and legacy, as transformers' remapping accepts them. */
static char block_from_name(const char *s) {
    if (!strcmp(s, "mamba") || !strcmp(s, "linear_attention")) return CN_BLOCK_MAMBA;
    if (!strcmp(s, "attention") || !strcmp(s, "full_attention")) return CN_BLOCK_ATTN;
    if (!strcmp(s, "sliding_attention")) return CN_BLOCK_SWA; /* Gemma/Mistral layer_types */
    if (!strcmp(s, "moe")) return CN_BLOCK_MOE;
    if (!strcmp(s, "mlp")) return CN_BLOCK_MLP;
    return 0;
}

/* The string form; *out is malloc'd (NULL and 0 when the field is absent). */
static int pattern_from_string(const src *s, const char *name, char **out, cn_err *err) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(s->obj, name);
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return CN_OK;
    if (!cJSON_IsString(j))
        return cn_err_set(err, CN_ECONFIG, "%s: %s: must be a string of M, *, S, E, -, got %s",
                          s->what, name, json_type_name(j));
    const char *p = j->valuestring;
    size_t n = strlen(p);
    if (n == 0) return cn_err_set(err, CN_ECONFIG, "%s: %s: is empty", s->what, name);
    for (size_t i = 0; i < n; i++)
        if (!block_from_char(p[i]))
            return cn_err_set(err, CN_ECONFIG,
                              "%s: %s: unknown block type '%c' at layer %zu "
                              "(expected M, *, S, E or -)", s->what, name, p[i], i);
    char *c = malloc(n + 1);
    if (!c) return cn_err_set(err, CN_ENOMEM, "%s: %s: out of memory", s->what, name);
    memcpy(c, p, n + 1);
    *out = c;
    return CN_OK;
}

/* The list form (name or alias); *out is malloc'd, NULL when absent; *used gets the name read. */
static int pattern_from_list(const src *s, const char *name, const char *alias, char **out,
                             const char **used, cn_err *err) {
    const cJSON *j = field2(s, name, alias, used);
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return CN_OK;
    if (!cJSON_IsArray(j))
        return cn_err_set(err, CN_ECONFIG, "%s: %s: must be a list of block type names, got %s",
                          s->what, *used, json_type_name(j));
    int n = cJSON_GetArraySize(j);
    if (n == 0) return cn_err_set(err, CN_ECONFIG, "%s: %s: is empty", s->what, *used);
    char *c = malloc((size_t)n + 1);
    if (!c) return cn_err_set(err, CN_ENOMEM, "%s: %s: out of memory", s->what, *used);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, j) {
        char b = cJSON_IsString(e) ? block_from_name(e->valuestring) : 0;
        if (!b) {
            int rc;
            if (cJSON_IsString(e))
                rc = cn_err_set(err, CN_ECONFIG,
                                "%s: %s[%d]: unknown block type \"%s\" (expected mamba, "
                                "linear_attention, attention, full_attention, "
                                "sliding_attention, moe or mlp)",
                                s->what, *used, i, e->valuestring);
            else
                rc = cn_err_set(err, CN_ECONFIG, "%s: %s[%d]: must be a string, got %s", s->what,
                                *used, i, json_type_name(e));
            free(c);
            return rc;
        }
        c[i++] = b;
    }
    c[i] = '\0';
    *out = c;
    return CN_OK;
}

/* Reads both forms of one pattern; when both are present they must agree. *out is malloc'd, or
 * NULL when neither is present. */
static int read_pattern(const src *s, const char *str_name, const char *list_name,
                        const char *list_alias, char **out, cn_err *err) {
    char *a = NULL, *b = NULL;
    const char *list_used = list_name;
    int rc = pattern_from_string(s, str_name, &a, err);
    if (rc) goto done;
    rc = pattern_from_list(s, list_name, list_alias, &b, &list_used, err);
    if (rc) goto done;
    if (a && b && strcmp(a, b) != 0) {
        size_t i = 0;
        while (a[i] && a[i] == b[i]) i++;
        rc = cn_err_set(err, CN_ECONFIG,
                        "%s: %s \"%s\" and %s (as pattern \"%s\") disagree at layer %zu", s->what,
                        str_name, a, list_used, b, i);
        goto done;
    }
    if (a) { /* hand over whichever form was present; the other (if any) is freed below */
        *out = a;
        a = NULL;
    } else {
        *out = b;
        b = NULL;
    }
done:
    free(a);
    free(b);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Per-block-type fields
 * ------------------------------------------------------------------------------------------- */

static int has_block(const char *layers, const char *mtp, char b) {
    return (layers && strchr(layers, b)) || (mtp && strchr(mtp, b));
}

static int read_attention(const src *s, cn_config *c, cn_err *err) {
    int rc;
    if ((rc = get_int(s, "num_attention_heads", NULL, 1, 0, 1, &c->n_heads, err))) return rc;
    if ((rc = get_int(s, "num_key_value_heads", NULL, 1, 0, 1, &c->n_kv_heads, err))) return rc;
    if (c->n_heads % c->n_kv_heads)
        return cn_err_set(err, CN_ECONFIG,
                          "%s: num_key_value_heads: %d does not divide num_attention_heads %d",
                          s->what, c->n_kv_heads, c->n_heads);
    /* The header's default (hidden_size / heads) is what older remote-code configs implied. */
    int def = c->hidden_size % c->n_heads == 0 ? c->hidden_size / c->n_heads : 0;
    const cJSON *hd = cJSON_GetObjectItemCaseSensitive(s->obj, "head_dim");
    if (def == 0 && (!hd || cJSON_IsNull(hd)))
        return cn_err_set(err, CN_ECONFIG,
                          "%s: head_dim: required because hidden_size %d is not a multiple of "
                          "num_attention_heads %d", s->what, c->hidden_size, c->n_heads);
    if ((rc = get_int(s, "head_dim", NULL, 0, def, 1, &c->head_dim, err))) return rc;
    return get_bool(s, "attention_bias", NULL, 0, &c->attention_bias, err);
}

/* A number, or transformers 5's spelling of a non-finite one: {"__float__": "Infinity"}. */
static int json_float(const cJSON *j, double *out) {
    if (cJSON_IsNumber(j)) {
        *out = j->valuedouble;
        return 1;
    }
    const cJSON *f = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "__float__") : NULL;
    if (!cJSON_IsString(f) || cJSON_GetArraySize(j) != 1) return 0;
    if (!strcmp(f->valuestring, "Infinity") || !strcmp(f->valuestring, "inf")) *out = INFINITY;
    else if (!strcmp(f->valuestring, "-Infinity") || !strcmp(f->valuestring, "-inf")) *out = -INFINITY;
    else return 0; /* NaN is no valid limit */
    return 1;
}

static int read_mamba(const src *s, cn_config *c, cn_err *err) {
    int rc;
    if ((rc = get_int(s, "mamba_num_heads", NULL, 1, 0, 1, &c->mamba_n_heads, err))) return rc;
    if ((rc = get_int(s, "mamba_head_dim", NULL, 1, 0, 1, &c->mamba_head_dim, err))) return rc;
    if ((rc = get_int(s, "n_groups", "mamba_n_groups", 1, 0, 1, &c->n_groups, err))) return rc;
    if (c->mamba_n_heads % c->n_groups)
        return cn_err_set(err, CN_ECONFIG, "%s: n_groups: %d does not divide mamba_num_heads %d",
                          s->what, c->n_groups, c->mamba_n_heads);
    if ((rc = get_int(s, "ssm_state_size", NULL, 1, 0, 1, &c->ssm_state_size, err))) return rc;
    if ((rc = get_int(s, "conv_kernel", "mamba_d_conv", 1, 0, 1, &c->conv_kernel, err))) return rc;
    if ((rc = get_int(s, "chunk_size", "mamba_chunk_size", 0, 128, 1, &c->chunk_size, err)))
        return rc;
    if ((rc = get_bool(s, "use_conv_bias", "mamba_conv_bias", 1, &c->use_conv_bias, err)))
        return rc;
    /* transformers' NemotronH mixer builds in_proj/out_proj with config.use_bias; the older
     * mamba_proj_bias name is read when use_bias is absent. */
    if ((rc = get_bool(s, "use_bias", "mamba_proj_bias", 0, &c->mamba_proj_bias, err))) return rc;

    c->dt_min = 0.0f;
    c->dt_max = INFINITY;
    const char *used;
    const cJSON *j = field2(s, "time_step_limit", "mamba_dt_limit", &used);
    if (j && !cJSON_IsNull(j)) {
        double lo = 0, hi = 0;
        if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) != 2 ||
            !json_float(cJSON_GetArrayItem(j, 0), &lo) || !json_float(cJSON_GetArrayItem(j, 1), &hi))
            return cn_err_set(err, CN_ECONFIG, "%s: %s: must be a list of two numbers [min, max]",
                              s->what, used);
        if (!(lo >= 0) || !(hi > lo))
            return cn_err_set(err, CN_ECONFIG, "%s: %s: needs 0 <= min < max, got [%g, %g]",
                              s->what, used, lo, hi);
        c->dt_min = (float)lo;
        c->dt_max = (float)hi;
    }
    return CN_OK;
}

static int read_moe(const src *s, cn_config *c, cn_err *err) {
    int rc;
    if ((rc = get_int(s, "n_routed_experts", "num_local_experts", 1, 0, 1, &c->n_routed_experts,
                      err)))
        return rc;
    if ((rc = get_int(s, "num_experts_per_tok", NULL, 1, 0, 1, &c->n_experts_per_tok, err)))
        return rc;
    if (c->n_experts_per_tok > c->n_routed_experts)
        return cn_err_set(err, CN_ECONFIG,
                          "%s: num_experts_per_tok: %d is more than n_routed_experts %d", s->what,
                          c->n_experts_per_tok, c->n_routed_experts);
    if ((rc = get_int(s, "moe_intermediate_size", NULL, 1, 0, 1, &c->moe_intermediate_size, err)))
        return rc;
    if ((rc = get_int(s, "n_shared_experts", NULL, 0, 1, 0, &c->n_shared_experts, err))) return rc;
    if (c->n_shared_experts > 0 &&
        (rc = get_int(s, "moe_shared_expert_intermediate_size", NULL, 1, 0, 1,
                      &c->moe_shared_intermediate_size, err)))
        return rc;
    if ((rc = get_int(s, "n_group", NULL, 0, 1, 1, &c->n_group, err))) return rc;
    if ((rc = get_int(s, "topk_group", NULL, 0, 1, 1, &c->topk_group, err))) return rc;
    if (c->n_routed_experts % c->n_group)
        return cn_err_set(err, CN_ECONFIG, "%s: n_group: %d does not divide n_routed_experts %d",
                          s->what, c->n_group, c->n_routed_experts);
    if (c->topk_group > c->n_group)
        return cn_err_set(err, CN_ECONFIG, "%s: topk_group: %d is more than n_group %d", s->what,
                          c->topk_group, c->n_group);
    if ((rc = get_bool(s, "norm_topk_prob", NULL, 1, &c->norm_topk_prob, err))) return rc;
    if ((rc = get_float(s, "routed_scaling_factor", NULL, 1.0f, &c->routed_scaling_factor, NULL,
                        err)))
        return rc;
    /* LatentMoE (Super) adds projections this engine does not implement: refuse rather than
     * compute something else. */
    const cJSON *lat = cJSON_GetObjectItemCaseSensitive(s->obj, "moe_latent_size");
    if (lat && !cJSON_IsNull(lat))
        return cn_err_set(err, CN_ECONFIG, "%s: moe_latent_size: LatentMoE is not supported",
                          s->what);
    return CN_OK;
}

static int read_mlp(const src *s, cn_config *c, int required, cn_err *err) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(s->obj, "intermediate_size");
    if (cJSON_IsArray(j)) {
        if (!required) return CN_OK; /* no dense MLP layer reads it */
        return cn_err_set(err, CN_ECONFIG,
                          "%s: intermediate_size: per-layer lists are not supported (give one "
                          "integer for all '-' layers)", s->what);
    }
    return get_int(s, "intermediate_size", NULL, required, 0, 1, &c->intermediate_size, err);
}

/* ---------------------------------------------------------------------------------------------
 * JSON text
 * ------------------------------------------------------------------------------------------- */

/* Python's json.dumps writes float('inf') as the bare token Infinity, which is not JSON; configs
 * saved by transformers can carry it in time_step_limit. Rewrites Infinity/-Infinity outside
 * strings into 1e999 (which strtod reads as inf), padded to the same length. Returns a malloc'd
 * copy or NULL. */
static char *json_fix_infinity(const char *json, size_t n) {
    char *t = malloc(n + 1);
    if (!t) return NULL;
    memcpy(t, json, n);
    t[n] = '\0';
    int in_str = 0;
    for (size_t i = 0; i < n; i++) {
        if (in_str) {
            if (t[i] == '\\' && i + 1 < n) i++;
            else if (t[i] == '"') in_str = 0;
        } else if (t[i] == '"') {
            in_str = 1;
        } else if (t[i] == 'I' && n - i >= 8 && !memcmp(t + i, "Infinity", 8)) {
            memcpy(t + i, "1e999   ", 8);
            i += 7;
        }
    }
    return t;
}

static int parse_json(const char *json, const char *what, cJSON **out, cn_err *err) {
    *out = NULL;
    char *t = json_fix_infinity(json, strlen(json));
    if (!t) return cn_err_set(err, CN_ENOMEM, "%s: out of memory", what);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(t, &end, 1);
    if (!root) {
        long at = end ? (long)(end - t) : -1;
        free(t);
        return cn_err_set(err, CN_ECONFIG, "%s: not valid JSON (near byte %ld)", what, at);
    }
    free(t);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return cn_err_set(err, CN_ECONFIG, "%s: top level is not a JSON object", what);
    }
    *out = root;
    return CN_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Public
 * ------------------------------------------------------------------------------------------- */

static int parse_root(cn_config *c, const src *s, cn_err *err) {
    int rc;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(s->obj, "model_type");
    if (mt && !cJSON_IsNull(mt) && !cJSON_IsString(mt))
        return cn_err_set(err, CN_ECONFIG, "%s: model_type: must be a string, got %s", s->what,
                          json_type_name(mt));
    snprintf(c->model_type, sizeof c->model_type, "%s",
             cJSON_IsString(mt) ? mt->valuestring : "nemotron_h");

    if ((rc = get_int(s, "hidden_size", NULL, 1, 0, 1, &c->hidden_size, err))) return rc;
    if ((rc = get_int(s, "vocab_size", NULL, 1, 0, 1, &c->vocab_size, err))) return rc;

    if ((rc = read_pattern(s, "hybrid_override_pattern", "layers_block_type", "layer_types",
                           &c->layers, err)))
        return rc;
    if (!c->layers)
        return cn_err_set(err, CN_ECONFIG,
                          "%s: hybrid_override_pattern: required field is missing (and so is "
                          "layers_block_type)", s->what);
    c->n_layers = (int)strlen(c->layers);
    const cJSON *nl = cJSON_GetObjectItemCaseSensitive(s->obj, "num_hidden_layers");
    if (json_is_int(nl) && (int)nl->valuedouble != c->n_layers)
        cn_warn("%s: num_hidden_layers is %d but the layer pattern has %d layers; using %d",
                s->what, (int)nl->valuedouble, c->n_layers, c->n_layers);

    if ((rc = get_float(s, "layer_norm_epsilon", "norm_eps", 1e-5f, &c->norm_eps, NULL, err)))
        return rc;
    if (!(c->norm_eps > 0))
        return cn_err_set(err, CN_ECONFIG, "%s: layer_norm_epsilon: must be > 0, got %g", s->what,
                          c->norm_eps);
    if ((rc = get_bool(s, "tie_word_embeddings", NULL, 0, &c->tie_word_embeddings, err))) return rc;
    if ((rc = get_int(s, "max_position_embeddings", NULL, 0, 4096, 1, &c->max_position_embeddings,
                      err)))
        return rc;
    if ((rc = get_bool(s, "mlp_bias", NULL, 0, &c->mlp_bias, err))) return rc;

    /* MTP: transformers defaults the pattern to attention then MoE when layers are asked for. */
    if ((rc = get_int(s, "num_nextn_predict_layers", NULL, 0, 0, 0, &c->n_mtp, err))) return rc;
    if (c->n_mtp > 0) {
        if ((rc = read_pattern(s, "mtp_hybrid_override_pattern", "mtp_layers_block_type", NULL,
                               &c->mtp_layers, err)))
            return rc;
        if (!c->mtp_layers && !(c->mtp_layers = strdup("*E")))
            return cn_err_set(err, CN_ENOMEM, "%s: out of memory", s->what);
        c->n_mtp_layers = (int)strlen(c->mtp_layers);
    }

    /* Only the block types that occur need their fields. */
    int swa = has_block(c->layers, c->mtp_layers, CN_BLOCK_SWA);
    if ((swa || has_block(c->layers, c->mtp_layers, CN_BLOCK_ATTN)) && (rc = read_attention(s, c, err)))
        return rc;
    if (swa && (rc = get_int(s, "sliding_window", NULL, 1, 0, 1, &c->sliding_window, err))) return rc;
    if (has_block(c->layers, c->mtp_layers, CN_BLOCK_MAMBA) && (rc = read_mamba(s, c, err)))
        return rc;
    if (has_block(c->layers, c->mtp_layers, CN_BLOCK_MOE) && (rc = read_moe(s, c, err))) return rc;
    if ((rc = read_mlp(s, c, has_block(c->layers, c->mtp_layers, CN_BLOCK_MLP), err))) return rc;

    if ((rc = get_int(s, "bos_token_id", NULL, 0, -1, 0, &c->bos_token_id, err))) return rc;
    if ((rc = get_int(s, "pad_token_id", NULL, 0, -1, 0, &c->pad_token_id, err))) return rc;
    int present;
    return get_eos(s, c->eos_token_ids, &c->n_eos, &present, err);
}

int cn_config_parse(cn_config *c, const char *json, const char *what, cn_err *err) {
    memset(c, 0, sizeof *c);
    if (!what) what = "config.json";
    cJSON *root;
    int rc = parse_json(json, what, &root, err);
    if (rc) return rc;
    src s = {what, root};
    rc = parse_root(c, &s, err);
    cJSON_Delete(root);
    if (rc) {
        cn_config_free(c);
        return rc;
    }
    c->gen_temperature = -1.0f;
    c->gen_top_p = -1.0f;
    c->gen_top_k = -1;
    return CN_OK;
}

/* Applies generation_config.json over a parsed config. */
static int apply_generation(cn_config *c, const char *json, const char *what, cn_err *err) {
    cJSON *root;
    int rc = parse_json(json, what, &root, err);
    if (rc) return rc;
    src s = {what, root};
    int ids[CN_MAX_EOS], n = 0, eos_present = 0;
    float t, p;
    int k;
    if ((rc = get_eos(&s, ids, &n, &eos_present, err))) goto done;
    if ((rc = get_int(&s, "bos_token_id", NULL, 0, c->bos_token_id, 0, &c->bos_token_id, err)))
        goto done;
    if ((rc = get_int(&s, "pad_token_id", NULL, 0, c->pad_token_id, 0, &c->pad_token_id, err)))
        goto done;
    int tp, pp;
    if ((rc = get_float(&s, "temperature", NULL, -1.0f, &t, &tp, err))) goto done;
    if (tp && !(t >= 0)) {
        rc = cn_err_set(err, CN_ECONFIG, "%s: temperature: must be >= 0, got %g", what, t);
        goto done;
    }
    if ((rc = get_float(&s, "top_p", NULL, -1.0f, &p, &pp, err))) goto done;
    if (pp && !(p > 0 && p <= 1)) {
        rc = cn_err_set(err, CN_ECONFIG, "%s: top_p: must be in (0, 1], got %g", what, p);
        goto done;
    }
    if ((rc = get_int(&s, "top_k", NULL, 0, -1, 0, &k, err))) goto done;
    if (eos_present) {
        memcpy(c->eos_token_ids, ids, sizeof ids);
        c->n_eos = n;
    }
    c->gen_temperature = t;
    c->gen_top_p = p;
    c->gen_top_k = k;
done:
    cJSON_Delete(root);
    return rc;
}

int cn_config_load_dir(cn_config *c, const char *dir, cn_err *err) {
    memset(c, 0, sizeof *c);
    size_t n = strlen(dir) + sizeof "/generation_config.json";
    char *path = malloc(n), *text = NULL;
    if (!path) return cn_err_set(err, CN_ENOMEM, "%s: out of memory", dir);
    snprintf(path, n, "%s/config.json", dir);
    int rc = cn_read_file(path, &text, NULL, err);
    if (rc) goto fail;
    rc = cn_config_parse(c, text, path, err);
    free(text);
    text = NULL;
    if (rc) goto fail;

    snprintf(path, n, "%s/generation_config.json", dir);
    rc = cn_read_file(path, &text, NULL, err);
    if (rc == CN_ENOENT) { /* optional */
        cn_err_clear(err);
        rc = CN_OK;
    } else if (rc) {
        goto fail;
    } else if ((rc = apply_generation(c, text, path, err))) {
        goto fail;
    }
    free(text);
    free(path);
    return CN_OK;
fail:
    free(text);
    free(path);
    cn_config_free(c);
    return rc;
}

void cn_config_free(cn_config *c) {
    if (!c) return;
    free(c->layers);
    free(c->mtp_layers);
    memset(c, 0, sizeof *c);
}

int cn_config_count(const cn_config *c, cn_block type) {
    int n = 0;
    for (int i = 0; i < c->n_layers; i++) n += c->layers[i] == (char)type;
    return n;
}
