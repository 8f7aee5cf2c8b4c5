/* quant_config.h - which quantized format each module of a checkpoint has, from modelopt's
 * `hf_quant_config.json` or config.json's `quantization_config`.
 *
 * Accepted forms (the first file that has one wins: hf_quant_config.json, then config.json):
 *   {"quantization": {"quant_algo": "NVFP4"|"FP8"|"MXFP8", "group_size": 16|32,
 *                     "exclude_modules": ["lm_head", "*.conv1d", ...]}}            (hf_quant_config)
 *   {"quantization": {"quant_algo": "MIXED_PRECISION",
 *                     "quantized_layers": {"<module>": {"quant_algo": "FP8"}, ...}}}
 *   "quantization_config": {"quant_method": "modelopt", "quant_algo": ..., "exclude_modules" or
 *                           "ignore": [...], "quantized_layers": {...}}            (config.json)
 * A module is a weight's name without ".weight". Patterns are fnmatch globs as modelopt uses them
 * ('*' crosses dots); a pattern naming a parent module (e.g. "backbone.layers.4.mixer") covers its
 * children. Under MIXED_PRECISION a module absent from quantized_layers is not quantized.
 *
 * Promises: an unsupported quant_algo (anything but FP8, NVFP4, MXFP8, MIXED_PRECISION) or a group
 * size other than the format's (16, 32) is an error naming the file, the module where it applies,
 * and the value. The parser never reads weights. No config at all is not an error: every module
 * is then CN_QALGO_AUTO and the loader infers the format from the stored dtypes.
 */
#ifndef CN_QUANT_CONFIG_H
#define CN_QUANT_CONFIG_H

#include "base/error.h"

typedef enum cn_qalgo {
    CN_QALGO_AUTO = 0, /* no quantization config: go by the stored dtypes */
    CN_QALGO_NONE,     /* excluded / kept: high precision as stored */
    CN_QALGO_FP8,      /* F8_E4M3, F32 per-tensor weight_scale */
    CN_QALGO_NVFP4,    /* U8 packed E2M1, E4M3 weight_scale per 16, F32 weight_scale_2 */
    CN_QALGO_MXFP8,    /* F8_E4M3, E8M0 (U8) weight_scale per 32 */
} cn_qalgo;

typedef struct cn_qrule {
    char *module; /* name or glob; owned */
    cn_qalgo algo;
} cn_qrule;

typedef struct cn_qconfig {
    int present;           /* a quantization config was found */
    char source[32];       /* "hf_quant_config.json" or "config.json", for messages */
    cn_qalgo algo;         /* the one algorithm, or CN_QALGO_NONE under MIXED_PRECISION */
    int mixed;             /* MIXED_PRECISION: per-module rules */
    int n_exclude;
    char **exclude;        /* [n_exclude] globs kept high precision; owned */
    int n_rules;
    cn_qrule *rules;       /* [n_rules] quantized_layers under MIXED_PRECISION; owned */
} cn_qconfig;

/* Reads dir's quantization config into q (zeroed first; absent files are fine). On error q is
 * left zeroed and err names the file and field. */
int cn_qconfig_load_dir(cn_qconfig *q, const char *dir, cn_err *err);
/* Parses one file's text: `what` is "hf_quant_config.json" (reads "quantization") or
 * "config.json" (reads "quantization_config"). For tests and cairn quantize. */
int cn_qconfig_parse(cn_qconfig *q, const char *json, const char *what, cn_err *err);
void cn_qconfig_free(cn_qconfig *q);

/* The format of a module (weight name without ".weight"). */
cn_qalgo cn_qconfig_module(const cn_qconfig *q, const char *module);
/* 1 if a glob (or parent-module) pattern matches the module name. */
int cn_qpattern_match(const char *pattern, const char *module);
/* "NVFP4", "FP8", "MXFP8", "none (kept high precision)", "auto". */
const char *cn_qalgo_name(cn_qalgo a);

#endif
