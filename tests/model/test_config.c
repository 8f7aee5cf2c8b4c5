/* test_config.c - config.json parsing: the real Nano 30B-A3B config in both pattern forms, MTP
 * fields, the generation_config.json override, and one error per missing or invalid field, each
 * naming the file and the field.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "model/config.h"

#define NANO_PATTERN "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"

/* Nano 30B-A3B config.json (reference doc §1), with ' for " to keep the literal readable. */
static const char *k_nano =
    "{'architectures': ['NemotronHForCausalLM'], 'model_type': 'nemotron_h',"
    " 'hidden_size': 2688, 'num_hidden_layers': 52,"
    " 'hybrid_override_pattern': '" NANO_PATTERN "',"
    " 'num_attention_heads': 32, 'num_key_value_heads': 2, 'head_dim': 128,"
    " 'rope_theta': 10000, 'partial_rotary_factor': 1.0,"
    " 'attention_bias': false, 'sliding_window': null,"
    " 'mamba_num_heads': 64, 'mamba_head_dim': 64, 'n_groups': 8, 'ssm_state_size': 128,"
    " 'conv_kernel': 4, 'chunk_size': 128, 'expand': 2,"
    " 'use_conv_bias': true, 'mamba_proj_bias': false, 'use_bias': false,"
    " 'time_step_min': 0.001, 'time_step_max': 0.1, 'time_step_floor': 1e-4,"
    " 'mamba_hidden_act': 'silu', 'mamba_ssm_cache_dtype': 'float32',"
    " 'layer_norm_epsilon': 1e-05,"
    " 'n_routed_experts': 128, 'num_experts_per_tok': 6,"
    " 'n_shared_experts': 1, 'moe_shared_expert_intermediate_size': 3712,"
    " 'moe_intermediate_size': 1856, 'intermediate_size': 1856,"
    " 'n_group': 1, 'topk_group': 1, 'norm_topk_prob': true, 'routed_scaling_factor': 2.5,"
    " 'mlp_hidden_act': 'relu2', 'mlp_bias': false,"
    " 'vocab_size': 131072, 'tie_word_embeddings': false, 'max_position_embeddings': 262144,"
    " 'bos_token_id': 1, 'eos_token_id': 2, 'pad_token_id': 0, 'residual_in_fp32': false,"
    " 'torch_dtype': 'bfloat16', 'transformers_version': '4.55.4'}";

/* Copies s with every ' turned into ". */
static char *dq(const char *s) {
    char *t = strdup(s);
    assert_non_null(t);
    for (char *p = t; *p; p++)
        if (*p == '\'') *p = '"';
    return t;
}

/* The Nano config with field set to the JSON text value (quotes as '), or removed when value is
 * NULL; up to two edits. Returns malloc'd JSON. */
static char *nano_with3(const char *f1, const char *v1, const char *f2, const char *v2,
                        const char *f3, const char *v3) {
    char *base = dq(k_nano);
    cJSON *root = cJSON_Parse(base);
    free(base);
    assert_non_null(root);
    const char *f[3] = {f1, f2, f3}, *v[3] = {v1, v2, v3};
    for (int i = 0; i < 3; i++) {
        if (!f[i]) continue;
        cJSON_DeleteItemFromObjectCaseSensitive(root, f[i]);
        if (v[i]) {
            char *val = dq(v[i]);
            cJSON *item = cJSON_Parse(val);
            free(val);
            assert_non_null(item);
            cJSON_AddItemToObject(root, f[i], item);
        }
    }
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    assert_non_null(out);
    return out;
}

static char *nano_with2(const char *f1, const char *v1, const char *f2, const char *v2) {
    return nano_with3(f1, v1, f2, v2, NULL, NULL);
}

static char *nano_with(const char *field, const char *value) {
    return nano_with2(field, value, NULL, NULL);
}

/* Parses json (freeing it) and expects code with each non-NULL substring in the message, which
 * must also name the file. */
static void expect_error(char *json, int code, const char *s1, const char *s2) {
    cn_config c;
    cn_err err;
    cn_err_clear(&err);
    int rc = cn_config_parse(&c, json, "models/x/config.json", &err);
    free(json);
    if (rc != code) fprintf(stderr, "got %d (%s), want %d\n", rc, err.msg, code);
    assert_int_equal(rc, code);
    assert_int_equal(err.code, code);
    assert_null(c.layers); /* zeroed: nothing to free */
    assert_int_equal(c.hidden_size, 0);
    assert_non_null(strstr(err.msg, "models/x/config.json"));
    if (s1 && !strstr(err.msg, s1)) fail_msg("'%s' not in: %s", s1, err.msg);
    if (s2 && !strstr(err.msg, s2)) fail_msg("'%s' not in: %s", s2, err.msg);
}

static void parse_ok(cn_config *c, char *json) {
    cn_err err;
    cn_err_clear(&err);
    int rc = cn_config_parse(c, json, "config.json", &err);
    free(json);
    if (rc) fail_msg("unexpected error: %s", err.msg);
}

/* Every Nano value from the reference doc. */
static void check_nano(const cn_config *c) {
    assert_string_equal(c->model_type, "nemotron_h");
    assert_int_equal(c->hidden_size, 2688);
    assert_int_equal(c->vocab_size, 131072);
    assert_int_equal(c->n_layers, 52);
    assert_string_equal(c->layers, NANO_PATTERN);
    assert_int_equal(cn_config_count(c, CN_BLOCK_MAMBA), 23);
    assert_int_equal(cn_config_count(c, CN_BLOCK_MOE), 23);
    assert_int_equal(cn_config_count(c, CN_BLOCK_ATTN), 6);
    assert_int_equal(cn_config_count(c, CN_BLOCK_MLP), 0);
    const int attn_at[6] = {5, 12, 19, 26, 33, 42};
    for (int i = 0; i < 6; i++) assert_int_equal(c->layers[attn_at[i]], CN_BLOCK_ATTN);
    assert_true(fabsf(c->norm_eps - 1e-5f) < 1e-12f);
    assert_int_equal(c->tie_word_embeddings, 0);
    assert_int_equal(c->max_position_embeddings, 262144);

    assert_int_equal(c->n_heads, 32);
    assert_int_equal(c->n_kv_heads, 2);
    assert_int_equal(c->head_dim, 128);
    assert_int_equal(c->attention_bias, 0);

    assert_int_equal(c->mamba_n_heads, 64);
    assert_int_equal(c->mamba_head_dim, 64);
    assert_int_equal(c->n_groups, 8);
    assert_int_equal(c->ssm_state_size, 128);
    assert_int_equal(c->conv_kernel, 4);
    assert_int_equal(c->chunk_size, 128);
    assert_int_equal(c->use_conv_bias, 1);
    assert_int_equal(c->mamba_proj_bias, 0);
    assert_true(c->dt_min == 0.0f);
    assert_true(isinf(c->dt_max) && c->dt_max > 0);

    assert_int_equal(c->n_routed_experts, 128);
    assert_int_equal(c->n_experts_per_tok, 6);
    assert_int_equal(c->moe_intermediate_size, 1856);
    assert_int_equal(c->n_shared_experts, 1);
    assert_int_equal(c->moe_shared_intermediate_size, 3712);
    assert_int_equal(c->n_group, 1);
    assert_int_equal(c->topk_group, 1);
    assert_int_equal(c->norm_topk_prob, 1);
    assert_true(c->routed_scaling_factor == 2.5f);
    assert_int_equal(c->mlp_bias, 0);
    assert_int_equal(c->intermediate_size, 1856);

    assert_int_equal(c->n_mtp, 0);
    assert_int_equal(c->n_mtp_layers, 0);
    assert_null(c->mtp_layers);

    assert_int_equal(c->bos_token_id, 1);
    assert_int_equal(c->pad_token_id, 0);
    assert_int_equal(c->n_eos, 1);
    assert_int_equal(c->eos_token_ids[0], 2);
    assert_true(c->gen_temperature < 0);
    assert_true(c->gen_top_p < 0);
    assert_true(c->gen_top_k < 0);
}

/* The pattern as a layers_block_type list, with the given names for M and *. */
static char *pattern_list(const char *m, const char *a) {
    static char buf[2048];
    size_t k = (size_t)snprintf(buf, sizeof buf, "[");
    const char *p = NANO_PATTERN;
    for (size_t i = 0; p[i]; i++) {
        const char *n = p[i] == 'M' ? m : p[i] == '*' ? a : p[i] == 'E' ? "moe" : "mlp";
        k += (size_t)snprintf(buf + k, sizeof buf - k, "%s'%s'", i ? "," : "", n);
    }
    snprintf(buf + k, sizeof buf - k, "]");
    return buf;
}

/* ---------------------------------------------------------------------------------------------
 * Valid configs
 * ------------------------------------------------------------------------------------------- */

static void test_nano_pattern_string(void **state) {
    (void)state;
    cn_config c;
    parse_ok(&c, dq(k_nano));
    check_nano(&c);
    cn_config_free(&c);
    cn_config_free(&c); /* idempotent on the zeroed struct */
}

static void test_nano_layers_block_type(void **state) {
    (void)state;
    cn_config c;
    /* the new names, the legacy ones, and the layer_types alias all give the same layers */
    parse_ok(&c, nano_with2("hybrid_override_pattern", NULL, "layers_block_type",
                            pattern_list("linear_attention", "full_attention")));
    check_nano(&c);
    cn_config_free(&c);
    parse_ok(&c, nano_with2("hybrid_override_pattern", NULL, "layers_block_type",
                            pattern_list("mamba", "attention")));
    check_nano(&c);
    cn_config_free(&c);
    parse_ok(&c, nano_with2("hybrid_override_pattern", NULL, "layer_types",
                            pattern_list("mamba", "full_attention")));
    check_nano(&c);
    cn_config_free(&c);
    /* both forms present and agreeing */
    parse_ok(&c, nano_with("layers_block_type", pattern_list("mamba", "attention")));
    check_nano(&c);
    cn_config_free(&c);
}

static void test_pattern_forms_disagree(void **state) {
    (void)state;
    char list[2048];
    snprintf(list, sizeof list, "%s", pattern_list("mamba", "attention"));
    /* layer 5 becomes mamba in the list only */
    char *p = strstr(list, "'attention'");
    assert_non_null(p);
    memmove(p + 7, p + 11, strlen(p + 11) + 1);
    memcpy(p, "'mamba'", 7);
    expect_error(nano_with("layers_block_type", list), CN_ECONFIG, "hybrid_override_pattern",
                 "layers_block_type");
    expect_error(nano_with("layers_block_type", "['mamba', 'mamba']"), CN_ECONFIG,
                 "hybrid_override_pattern", "disagree at layer 1");
}

static void test_num_hidden_layers_mismatch(void **state) {
    (void)state;
    cn_config c;
    parse_ok(&c, nano_with("num_hidden_layers", "50"));
    assert_int_equal(c.n_layers, 52); /* the pattern wins, as in transformers */
    cn_config_free(&c);
    parse_ok(&c, nano_with("num_hidden_layers", NULL));
    assert_int_equal(c.n_layers, 52);
    cn_config_free(&c);
}

static void test_small_hybrid_and_defaults(void **state) {
    /* A tiny ME*E- model with only required fields: every optional one takes its default. */
    (void)state;
    cn_config c;
    parse_ok(&c, dq("{'hidden_size': 64, 'vocab_size': 256, 'hybrid_override_pattern': 'ME*E-',"
                    " 'num_attention_heads': 4, 'num_key_value_heads': 2,"
                    " 'mamba_num_heads': 8, 'mamba_head_dim': 16, 'n_groups': 2,"
                    " 'ssm_state_size': 16, 'conv_kernel': 4,"
                    " 'n_routed_experts': 4, 'num_experts_per_tok': 2, 'moe_intermediate_size': 32,"
                    " 'moe_shared_expert_intermediate_size': 48, 'intermediate_size': 96}"));
    assert_int_equal(c.n_layers, 5);
    assert_int_equal(cn_config_count(&c, CN_BLOCK_MLP), 1);
    assert_int_equal(cn_config_count(&c, CN_BLOCK_MOE), 2);
    assert_int_equal(c.head_dim, 16); /* hidden_size / heads */
    assert_int_equal(c.chunk_size, 128);
    assert_int_equal(c.use_conv_bias, 1);
    assert_int_equal(c.n_shared_experts, 1);
    assert_int_equal(c.moe_shared_intermediate_size, 48);
    assert_int_equal(c.n_group, 1);
    assert_int_equal(c.norm_topk_prob, 1);
    assert_true(c.routed_scaling_factor == 1.0f);
    assert_true(fabsf(c.norm_eps - 1e-5f) < 1e-12f);
    assert_int_equal(c.intermediate_size, 96);
    assert_int_equal(c.bos_token_id, -1);
    assert_int_equal(c.pad_token_id, -1);
    assert_int_equal(c.n_eos, 0);
    assert_string_equal(c.model_type, "nemotron_h");
    cn_config_free(&c);

    /* A Mamba-only model needs no attention, MoE or MLP fields. */
    parse_ok(&c, dq("{'hidden_size': 64, 'vocab_size': 256, 'hybrid_override_pattern': 'MMM',"
                    " 'mamba_num_heads': 8, 'mamba_head_dim': 16, 'n_groups': 2,"
                    " 'ssm_state_size': 16, 'conv_kernel': 4, 'intermediate_size': [1, 2]}"));
    assert_int_equal(cn_config_count(&c, CN_BLOCK_MAMBA), 3);
    assert_int_equal(c.n_heads, 0);
    cn_config_free(&c);
}

static void test_legacy_names_and_limits(void **state) {
    (void)state;
    cn_config c;
    /* mamba_* aliases that transformers still accepts; time_step_limit as Python writes inf */
    char *j = nano_with2("n_groups", NULL, "conv_kernel", NULL);
    cJSON *root = cJSON_Parse(j);
    free(j);
    cJSON_AddNumberToObject(root, "mamba_n_groups", 4);
    cJSON_AddNumberToObject(root, "mamba_d_conv", 3);
    cJSON_AddNumberToObject(root, "mamba_chunk_size", 256);
    cJSON_DeleteItemFromObject(root, "chunk_size");
    cJSON_DeleteItemFromObject(root, "use_bias");
    cJSON_DeleteItemFromObject(root, "mamba_proj_bias");
    cJSON_AddTrueToObject(root, "mamba_proj_bias");
    j = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    /* splice the non-JSON token Python writes for float('inf') */
    size_t n = strlen(j);
    char *k = malloc(n + 64);
    assert_non_null(k);
    memcpy(k, j, n - 1);
    strcpy(k + n - 1, ",\"time_step_limit\":[0.0, Infinity]}");
    free(j);
    parse_ok(&c, k);
    assert_int_equal(c.n_groups, 4);
    assert_int_equal(c.conv_kernel, 3);
    assert_int_equal(c.chunk_size, 256);
    assert_int_equal(c.mamba_proj_bias, 1);
    assert_true(c.dt_min == 0.0f && isinf(c.dt_max));
    cn_config_free(&c);

    parse_ok(&c, nano_with("time_step_limit", "[0.001, 100.0]"));
    assert_true(c.dt_min == 0.001f && c.dt_max == 100.0f);
    cn_config_free(&c);
    /* transformers 5 save_pretrained writes inf as an object */
    parse_ok(&c, nano_with("time_step_limit", "[0.0, {'__float__': 'Infinity'}]"));
    assert_true(c.dt_min == 0.0f && isinf(c.dt_max));
    cn_config_free(&c);
    expect_error(nano_with("time_step_limit", "[0.0, {'__float__': 'NaN'}]"), CN_ECONFIG,
                 "time_step_limit", "two");
    /* "Infinity" inside a string is left alone */
    parse_ok(&c, nano_with("model_type", "'Infinity'"));
    assert_string_equal(c.model_type, "Infinity");
    cn_config_free(&c);

    expect_error(nano_with("time_step_limit", "[0.1]"), CN_ECONFIG, "time_step_limit", "two");
    expect_error(nano_with("time_step_limit", "[1.0, 0.5]"), CN_ECONFIG, "time_step_limit",
                 "min < max");
}

static void test_eos_forms(void **state) {
    (void)state;
    cn_config c;
    parse_ok(&c, nano_with("eos_token_id", "[2, 11]"));
    assert_int_equal(c.n_eos, 2);
    assert_int_equal(c.eos_token_ids[0], 2);
    assert_int_equal(c.eos_token_ids[1], 11);
    cn_config_free(&c);
    parse_ok(&c, nano_with("eos_token_id", "null"));
    assert_int_equal(c.n_eos, 0);
    cn_config_free(&c);
    expect_error(nano_with("eos_token_id", "'2'"), CN_ECONFIG, "eos_token_id", "list");
    expect_error(nano_with("eos_token_id", "[2, 'x']"), CN_ECONFIG, "eos_token_id[1]", NULL);
    expect_error(nano_with("eos_token_id", "[1,2,3,4,5,6,7,8,9]"), CN_ECONFIG, "eos_token_id",
                 "more than 8");
}

static void test_mtp(void **state) {
    (void)state;
    cn_config c;
    /* Nemotron 3.5 Lightning style: the list form with the old names */
    parse_ok(&c, nano_with2("num_nextn_predict_layers", "1", "mtp_layers_block_type",
                            "['attention', 'moe']"));
    assert_int_equal(c.n_mtp, 1);
    assert_int_equal(c.n_mtp_layers, 2);
    assert_string_equal(c.mtp_layers, "*E");
    cn_config_free(&c);
    /* the string form */
    parse_ok(&c,
             nano_with2("num_nextn_predict_layers", "1", "mtp_hybrid_override_pattern", "'*E'"));
    assert_string_equal(c.mtp_layers, "*E");
    cn_config_free(&c);
    /* layers asked for, pattern absent: transformers' default, attention then MoE */
    parse_ok(&c, nano_with("num_nextn_predict_layers", "1"));
    assert_string_equal(c.mtp_layers, "*E");
    cn_config_free(&c);
    /* no MTP layers: the pattern is not used */
    parse_ok(&c,
             nano_with2("num_nextn_predict_layers", "0", "mtp_hybrid_override_pattern", "'*E'"));
    assert_null(c.mtp_layers);
    assert_int_equal(c.n_mtp_layers, 0);
    cn_config_free(&c);

    expect_error(nano_with2("num_nextn_predict_layers", "1", "mtp_layers_block_type",
                            "['attention', 'ssm']"),
                 CN_ECONFIG, "mtp_layers_block_type[1]", "\"ssm\"");
    expect_error(
        nano_with2("num_nextn_predict_layers", "1", "mtp_hybrid_override_pattern", "'*Q'"),
        CN_ECONFIG, "mtp_hybrid_override_pattern", "'Q'");
    expect_error(nano_with("num_nextn_predict_layers", "-1"), CN_ECONFIG,
                 "num_nextn_predict_layers", ">= 0");
    /* both MTP forms present and disagreeing */
    char *j = nano_with2("num_nextn_predict_layers", "1", "mtp_hybrid_override_pattern", "'*E'");
    cJSON *root = cJSON_Parse(j);
    free(j);
    cJSON *l = cJSON_CreateArray();
    cJSON_AddItemToArray(l, cJSON_CreateString("moe"));
    cJSON_AddItemToArray(l, cJSON_CreateString("attention"));
    cJSON_AddItemToObject(root, "mtp_layers_block_type", l);
    j = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    expect_error(j, CN_ECONFIG, "mtp_hybrid_override_pattern", "mtp_layers_block_type");

    /* MTP attention in a model without attention layers still needs the attention fields */
    j = nano_with2("hybrid_override_pattern", "'MEME'", "num_attention_heads", NULL);
    root = cJSON_Parse(j);
    free(j);
    cJSON_AddNumberToObject(root, "num_nextn_predict_layers", 1);
    j = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    expect_error(j, CN_ECONFIG, "num_attention_heads", "missing");
}

/* ---------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------- */

static void test_missing_required(void **state) {
    (void)state;
    static const char *fields[] = {
        "hidden_size",          "vocab_size",           "num_attention_heads",
        "num_key_value_heads",  "mamba_num_heads",      "mamba_head_dim",
        "n_groups",             "ssm_state_size",       "conv_kernel",
        "n_routed_experts",     "num_experts_per_tok",  "moe_intermediate_size",
        "moe_shared_expert_intermediate_size",
    };
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
        expect_error(nano_with(fields[i], NULL), CN_ECONFIG, fields[i], "missing");
    /* null counts as missing */
    expect_error(nano_with("hidden_size", "null"), CN_ECONFIG, "hidden_size", "missing");
    /* neither pattern form */
    expect_error(nano_with("hybrid_override_pattern", NULL), CN_ECONFIG, "hybrid_override_pattern",
                 "layers_block_type");
    /* no shared experts: their size is not needed */
    cn_config c;
    parse_ok(&c, nano_with2("n_shared_experts", "0", "moe_shared_expert_intermediate_size", NULL));
    assert_int_equal(c.n_shared_experts, 0);
    cn_config_free(&c);
    /* a dense MLP layer needs intermediate_size */
    expect_error(nano_with2("hybrid_override_pattern", "'M-*'", "intermediate_size", NULL),
                 CN_ECONFIG, "intermediate_size", "missing");
    /* head_dim may only be left out when hidden_size divides evenly */
    expect_error(nano_with2("head_dim", NULL, "hidden_size", "2689"), CN_ECONFIG, "head_dim",
                 "not a multiple");
}

static void test_wrong_types_and_ranges(void **state) {
    (void)state;
    static const struct {
        const char *field, *value, *expect;
    } cases[] = {
        {"hidden_size", "'2688'", "must be an integer, got a string"},
        {"hidden_size", "2688.5", "must be an integer, got 2688.5"},
        {"hidden_size", "0", "must be >= 1, got 0"},
        {"vocab_size", "-3", "must be >= 1, got -3"},
        {"vocab_size", "1e12", "must be an integer"},
        {"num_attention_heads", "true", "got a boolean"},
        {"num_key_value_heads", "[2]", "got a list"},
        {"mamba_num_heads", "{}", "got an object"},
        {"ssm_state_size", "0", ">= 1"},
        {"conv_kernel", "'4'", "must be an integer"},
        {"n_routed_experts", "0", ">= 1"},
        {"moe_intermediate_size", "1856.0001", "must be an integer"},
        {"routed_scaling_factor", "'2.5'", "must be a number"},
        {"layer_norm_epsilon", "0", "must be > 0"},
        {"attention_bias", "'no'", "true or false"},
        {"tie_word_embeddings", "2", "true or false"},
        {"model_type", "7", "must be a string"},
        {"bos_token_id", "-2", ">= 0"},
        {"hybrid_override_pattern", "42", "must be a string"},
        {"hybrid_override_pattern", "''", "is empty"},
        {"n_group", "3", "does not divide n_routed_experts"},
        {"topk_group", "2", "more than n_group"},
        {"moe_latent_size", "1024", "not supported"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        expect_error(nano_with(cases[i].field, cases[i].value), CN_ECONFIG, cases[i].field,
                     cases[i].expect);
    /* relations between fields name the field and both values */
    expect_error(nano_with("num_key_value_heads", "3"), CN_ECONFIG, "num_key_value_heads",
                 "3 does not divide num_attention_heads 32");
    expect_error(nano_with("n_groups", "7"), CN_ECONFIG, "n_groups",
                 "7 does not divide mamba_num_heads 64");
    expect_error(nano_with("num_experts_per_tok", "129"), CN_ECONFIG, "num_experts_per_tok",
                 "129 is more than n_routed_experts 128");
}

/* Sliding-window attention as Hugging Face configs declare it: `sliding_window` plus the layers
 * marked sliding_attention in layer_types (or 'S' in the string). */
static void test_sliding_window(void **state) {
    (void)state;
    cn_config c;
    parse_ok(&c, nano_with2("hybrid_override_pattern", "'MS*E'", "sliding_window", "64"));
    assert_string_equal(c.layers, "MS*E");
    assert_int_equal(c.sliding_window, 64);
    assert_int_equal(cn_config_count(&c, CN_BLOCK_SWA), 1);
    assert_true(cn_block_is_attn(CN_BLOCK_SWA) && cn_block_is_attn(CN_BLOCK_ATTN));
    assert_int_equal(c.n_heads, 32); /* the attention fields serve both kinds */
    cn_config_free(&c);
    parse_ok(&c, nano_with3("hybrid_override_pattern", NULL, "layer_types",
                            "['mamba', 'sliding_attention', 'full_attention', 'moe']",
                            "sliding_window", "64"));
    assert_string_equal(c.layers, "MS*E");
    cn_config_free(&c);
    /* without an 'S' layer the window is ignored, a null one too (Mistral writes null) */
    parse_ok(&c, nano_with("sliding_window", "null"));
    assert_int_equal(c.sliding_window, 0);
    cn_config_free(&c);
    parse_ok(&c, nano_with("sliding_window", "4096"));
    assert_int_equal(c.sliding_window, 0);
    cn_config_free(&c);
}

static void test_bad_patterns(void **state) {
    (void)state;
    expect_error(nano_with("hybrid_override_pattern", "'MEM?*E'"), CN_ECONFIG,
                 "hybrid_override_pattern", "'?' at layer 3");
    expect_error(nano_with2("hybrid_override_pattern", NULL, "layers_block_type",
                            "['mamba', 'moe', 'ssm']"),
                 CN_ECONFIG, "layers_block_type[2]", "\"ssm\"");
    expect_error(nano_with2("hybrid_override_pattern", NULL, "layers_block_type", "['mamba', 3]"),
                 CN_ECONFIG, "layers_block_type[1]", "must be a string");
    expect_error(nano_with2("hybrid_override_pattern", NULL, "layers_block_type", "'MEM'"),
                 CN_ECONFIG, "layers_block_type", "must be a list");
    expect_error(nano_with2("hybrid_override_pattern", NULL, "layers_block_type", "[]"),
                 CN_ECONFIG, "layers_block_type", "empty");
    /* an 'S' layer needs its window */
    expect_error(nano_with("hybrid_override_pattern", "'MS*E'"), CN_ECONFIG, "sliding_window",
                 "required field is missing");
    expect_error(nano_with2("hybrid_override_pattern", NULL, "layer_types",
                            "['mamba', 'sliding_attention']"),
                 CN_ECONFIG, "sliding_window", "missing");
}

static void test_intermediate_size_list(void **state) {
    (void)state;
    expect_error(nano_with2("hybrid_override_pattern", "'M-*-'", "intermediate_size", "[96, 96]"),
                 CN_ECONFIG, "intermediate_size", "per-layer lists are not supported");
}

static void test_not_json(void **state) {
    (void)state;
    expect_error(strdup("{\"hidden_size\": 12,"), CN_ECONFIG, "not valid JSON", NULL);
    expect_error(strdup("[1, 2]"), CN_ECONFIG, "not a JSON object", NULL);
    expect_error(strdup(""), CN_ECONFIG, "not valid JSON", NULL);
}

/* ---------------------------------------------------------------------------------------------
 * Directory loading and generation_config.json
 * ------------------------------------------------------------------------------------------- */

static char *make_dir(void) {
    const char *base = getenv("CAIRN_TMP");
    char *p = malloc(4096);
    assert_non_null(p);
    if (base && *base) {
        mkdir(base, 0777); /* ctest run without the Makefile: create it, EEXIST is fine */
        snprintf(p, 4096, "%s/cfg-XXXXXX", base);
        if (mkdtemp(p)) return p;
    }
    snprintf(p, 4096, "/tmp/cairn-cfg-XXXXXX");
    assert_non_null(mkdtemp(p));
    return p;
}

static void rm_dir(char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
    free(dir);
}

static void write_file(const char *dir, const char *name, const char *text) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    size_t n = strlen(text);
    assert_int_equal(fwrite(text, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void test_load_dir(void **state) {
    (void)state;
    char *dir = make_dir();
    cn_config c;
    cn_err err;

    /* no config.json */
    assert_int_equal(cn_config_load_dir(&c, dir, &err), CN_ENOENT);
    assert_non_null(strstr(err.msg, "config.json"));
    assert_null(c.layers);

    /* config.json alone: config's eos, no generation defaults */
    char *j = dq(k_nano);
    write_file(dir, "config.json", j);
    free(j);
    assert_int_equal(cn_config_load_dir(&c, dir, &err), CN_OK);
    check_nano(&c);
    cn_config_free(&c);

    /* generation_config.json overrides eos and brings sampling defaults */
    j = dq("{'_from_model_config': true, 'bos_token_id': 1, 'eos_token_id': [2, 11],"
           " 'pad_token_id': 0, 'temperature': 0.6, 'top_p': 0.95, 'top_k': 20,"
           " 'transformers_version': '4.55.4'}");
    write_file(dir, "generation_config.json", j);
    free(j);
    assert_int_equal(cn_config_load_dir(&c, dir, &err), CN_OK);
    assert_int_equal(c.n_eos, 2);
    assert_int_equal(c.eos_token_ids[0], 2);
    assert_int_equal(c.eos_token_ids[1], 11);
    assert_true(fabsf(c.gen_temperature - 0.6f) < 1e-6f);
    assert_true(fabsf(c.gen_top_p - 0.95f) < 1e-6f);
    assert_int_equal(c.gen_top_k, 20);
    assert_int_equal(c.bos_token_id, 1);
    assert_int_equal(c.hidden_size, 2688);
    cn_config_free(&c);

    /* a generation_config.json without eos keeps config.json's; a single int replaces it */
    write_file(dir, "generation_config.json", "{\"temperature\": 1.0}");
    assert_int_equal(cn_config_load_dir(&c, dir, &err), CN_OK);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 2);
    assert_true(c.gen_temperature == 1.0f);
    assert_true(c.gen_top_p < 0);
    assert_int_equal(c.gen_top_k, -1);
    cn_config_free(&c);
    write_file(dir, "generation_config.json", "{\"eos_token_id\": 11}");
    assert_int_equal(cn_config_load_dir(&c, dir, &err), CN_OK);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 11);
    cn_config_free(&c);

    /* errors in generation_config.json name that file and the field */
    static const struct {
        const char *text, *expect;
    } bad[] = {
        {"{\"top_p\": 1.5}", "top_p"},
        {"{\"top_p\": 0}", "top_p"},
        {"{\"temperature\": -1}", "temperature"},
        {"{\"temperature\": \"hot\"}", "temperature"},
        {"{\"top_k\": -5}", "top_k"},
        {"{\"eos_token_id\": \"2\"}", "eos_token_id"},
        {"{\"eos_token_id\": ", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_file(dir, "generation_config.json", bad[i].text);
        cn_err_clear(&err);
        assert_int_equal(cn_config_load_dir(&c, dir, &err), CN_ECONFIG);
        assert_non_null(strstr(err.msg, "generation_config.json"));
        if (!strstr(err.msg, bad[i].expect)) fail_msg("'%s' not in: %s", bad[i].expect, err.msg);
        assert_null(c.layers);
    }

    /* errors in config.json name it */
    write_file(dir, "config.json", "{\"hidden_size\": 8}");
    assert_int_equal(cn_config_load_dir(&c, dir, &err), CN_ECONFIG);
    assert_non_null(strstr(err.msg, "/config.json: vocab_size"));
    rm_dir(dir);
}

int main(void) {
    /* Many tests shorten the pattern under num_hidden_layers 52; that warning is expected. */
    cn_log_set_level(CN_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nano_pattern_string),
        cmocka_unit_test(test_nano_layers_block_type),
        cmocka_unit_test(test_pattern_forms_disagree),
        cmocka_unit_test(test_num_hidden_layers_mismatch),
        cmocka_unit_test(test_small_hybrid_and_defaults),
        cmocka_unit_test(test_legacy_names_and_limits),
        cmocka_unit_test(test_eos_forms),
        cmocka_unit_test(test_mtp),
        cmocka_unit_test(test_missing_required),
        cmocka_unit_test(test_wrong_types_and_ranges),
        cmocka_unit_test(test_sliding_window),
        cmocka_unit_test(test_bad_patterns),
        cmocka_unit_test(test_intermediate_size_list),
        cmocka_unit_test(test_not_json),
        cmocka_unit_test(test_load_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
