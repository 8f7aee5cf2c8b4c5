/* quant_config.c - modelopt quantization configs into per-module formats; see quant_config.h. */
#include "model/quant_config.h"

#include <cjson/cJSON.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/readfile.h"

const char *cn_qalgo_name(cn_qalgo a) {
    switch (a) {
    case CN_QALGO_FP8: return "FP8";
    case CN_QALGO_NVFP4: return "NVFP4";
    case CN_QALGO_MXFP8: return "MXFP8";
    case CN_QALGO_NONE: return "none (kept high precision)";
    default: return "auto";
    }
}

void cn_qconfig_free(cn_qconfig *q) {
    for (int i = 0; i < q->n_exclude; i++) free(q->exclude[i]);
    free(q->exclude);
    for (int i = 0; i < q->n_rules; i++) free(q->rules[i].module);
    free(q->rules);
    memset(q, 0, sizeof *q);
}

/* quant_algo text -> algo; group (-1 when absent) must be the format's block size. */
static int algo_of(const char *what, const char *module, const cJSON *algo, const cJSON *group,
                   cn_qalgo *out, cn_err *err) {
    const char *where = module ? module : "quantization";
    if (!cJSON_IsString(algo))
        return cn_err_set(err, CN_ECONFIG, "%s: %s: quant_algo must be a string", what, where);
    const char *s = algo->valuestring;
    int want;
    if (!strcmp(s, "FP8")) *out = CN_QALGO_FP8, want = 0;
    else if (!strcmp(s, "NVFP4")) *out = CN_QALGO_NVFP4, want = 16;
    else if (!strcmp(s, "MXFP8")) *out = CN_QALGO_MXFP8, want = 32;
    else
        return cn_err_set(err, CN_ECONFIG,
                          "%s: %s: quant_algo '%s' is not supported (FP8, NVFP4, MXFP8, "
                          "MIXED_PRECISION)", what, where, s);
    if (group && !cJSON_IsNull(group) && want) {
        if (!cJSON_IsNumber(group) || group->valuedouble != want)
            return cn_err_set(err, CN_ECONFIG, "%s: %s: group_size must be %d for %s", what,
                              where, want, s);
    }
    return CN_OK;
}

static char *dup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

static int read_excludes(cn_qconfig *q, const char *what, const cJSON *list, cn_err *err) {
    if (!list || cJSON_IsNull(list)) return CN_OK;
    if (!cJSON_IsArray(list))
        return cn_err_set(err, CN_ECONFIG, "%s: exclude_modules must be a list", what);
    int n = cJSON_GetArraySize(list);
    q->exclude = calloc((size_t)(n ? n : 1), sizeof *q->exclude);
    if (!q->exclude) return cn_err_set(err, CN_ENOMEM, "out of memory");
    const cJSON *e;
    cJSON_ArrayForEach(e, list) {
        if (!cJSON_IsString(e))
            return cn_err_set(err, CN_ECONFIG, "%s: exclude_modules: entries must be strings",
                              what);
        if (!(q->exclude[q->n_exclude] = dup(e->valuestring)))
            return cn_err_set(err, CN_ENOMEM, "out of memory");
        q->n_exclude++;
    }
    return CN_OK;
}

static int read_rules(cn_qconfig *q, const char *what, const cJSON *map, cn_err *err) {
    if (!cJSON_IsObject(map))
        return cn_err_set(err, CN_ECONFIG, "%s: quantized_layers: MIXED_PRECISION needs an object "
                          "of per-module quant_algo", what);
    int n = cJSON_GetArraySize(map);
    q->rules = calloc((size_t)(n ? n : 1), sizeof *q->rules);
    if (!q->rules) return cn_err_set(err, CN_ENOMEM, "out of memory");
    const cJSON *e;
    cJSON_ArrayForEach(e, map) {
        cn_qrule *r = &q->rules[q->n_rules];
        int rc = algo_of(what, e->string, cJSON_GetObjectItemCaseSensitive(e, "quant_algo"),
                         cJSON_GetObjectItemCaseSensitive(e, "group_size"), &r->algo, err);
        if (rc) return rc;
        if (!(r->module = dup(e->string))) return cn_err_set(err, CN_ENOMEM, "out of memory");
        q->n_rules++;
    }
    return CN_OK;
}

/* The quantization object `o` (hf_quant_config's "quantization" or config's
 * "quantization_config"). */
static int read_object(cn_qconfig *q, const char *what, const cJSON *o, cn_err *err) {
    if (!cJSON_IsObject(o)) return cn_err_set(err, CN_ECONFIG, "%s: quantization must be an object", what);
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(o, "quant_method");
    const cJSON *algo = cJSON_GetObjectItemCaseSensitive(o, "quant_algo");
    if (cJSON_IsString(method) && strcmp(method->valuestring, "modelopt") != 0 && !algo)
        return cn_err_set(err, CN_ECONFIG, "%s: quant_method '%s' is not supported (modelopt)",
                          what, method->valuestring);
    snprintf(q->source, sizeof q->source, "%s", what);
    q->present = 1;
    int rc;
    if (cJSON_IsString(algo) && !strcmp(algo->valuestring, "MIXED_PRECISION")) {
        q->mixed = 1;
        q->algo = CN_QALGO_NONE;
        rc = read_rules(q, what, cJSON_GetObjectItemCaseSensitive(o, "quantized_layers"), err);
    } else {
        rc = algo_of(what, NULL, algo, cJSON_GetObjectItemCaseSensitive(o, "group_size"), &q->algo,
                     err);
    }
    if (rc) return rc;
    const cJSON *ex = cJSON_GetObjectItemCaseSensitive(o, "exclude_modules");
    if (!ex) ex = cJSON_GetObjectItemCaseSensitive(o, "ignore");
    return read_excludes(q, what, ex, err);
}

int cn_qconfig_parse(cn_qconfig *q, const char *json, const char *what, cn_err *err) {
    memset(q, 0, sizeof *q);
    cJSON *root = cJSON_Parse(json);
    if (!root) return cn_err_set(err, CN_EFORMAT, "%s: not valid JSON", what);
    int hf = strstr(what, "hf_quant_config") != NULL;
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, hf ? "quantization" : "quantization_config");
    int rc = CN_OK;
    if (o && !cJSON_IsNull(o)) rc = read_object(q, what, o, err);
    else if (hf) rc = cn_err_set(err, CN_ECONFIG, "%s: quantization: required object is missing", what);
    cJSON_Delete(root);
    if (rc) cn_qconfig_free(q);
    return rc;
}

int cn_qconfig_load_dir(cn_qconfig *q, const char *dir, cn_err *err) {
    memset(q, 0, sizeof *q);
    static const char *const files[2] = {"hf_quant_config.json", "config.json"};
    for (int i = 0; i < 2; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        char *text = NULL;
        cn_err ignored; /* a missing or unreadable candidate is just not the map */
        if (cn_read_file(path, &text, NULL, &ignored)) continue;
        int rc = cn_qconfig_parse(q, text, files[i], err);
        free(text);
        if (rc || q->present) return rc;
    }
    return CN_OK;
}

int cn_qpattern_match(const char *pattern, const char *module) {
    if (fnmatch(pattern, module, 0) == 0) return 1;
    size_t n = strlen(pattern);
    return strncmp(pattern, module, n) == 0 && module[n] == '.';
}

cn_qalgo cn_qconfig_module(const cn_qconfig *q, const char *module) {
    if (!q || !q->present) return CN_QALGO_AUTO;
    for (int i = 0; i < q->n_exclude; i++)
        if (cn_qpattern_match(q->exclude[i], module)) return CN_QALGO_NONE;
    if (!q->mixed) return q->algo;
    for (int i = 0; i < q->n_rules; i++) /* exact names first, then globs */
        if (!strcmp(q->rules[i].module, module)) return q->rules[i].algo;
    for (int i = 0; i < q->n_rules; i++)
        if (cn_qpattern_match(q->rules[i].module, module)) return q->rules[i].algo;
    return CN_QALGO_NONE;
}
