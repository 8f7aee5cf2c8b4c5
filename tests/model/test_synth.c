/* test_synth.c - synthetic checkpoints: files, config keys, tokenizer layout, tensor names and
 * shapes, value ranges, fp8 encoding, determinism, sharding, --no-mtp, --layers and bad options.
 * Only the tiny preset is written; small and nano-shape are only described. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "base/fp.h"
#include "model/nano3_template.h"
#include "model/quantize.h"
#include "model/st_test_util.h"
#include "model/synth.h"

static void write_tiny(const char *name, char *dir, size_t n, void (*tweak)(cn_synth_opts *)) {
    tu_fresh_dir(name, dir, n);
    cn_synth_opts o;
    cn_synth_opts_init(&o);
    if (tweak) tweak(&o);
    cn_err err;
    cn_err_clear(&err);
    int rc = cn_synth_write(dir, &o, &err);
    if (rc != CN_OK) fail_msg("cn_synth_write: %s", err.msg);
}

static int json_int(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v)) fail_msg("config key %s missing or not a number", key);
    return (int)v->valuedouble;
}

static int json_bool(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsBool(v)) fail_msg("config key %s missing or not a bool", key);
    return cJSON_IsTrue(v);
}

static const char *json_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v)) fail_msg("key %s missing or not a string", key);
    return v->valuestring;
}

static void test_files_and_config(void **state) {
    (void)state;
    char dir[1024];
    write_tiny("synth_tiny", dir, sizeof dir, NULL);
    const char *files[] = {"config.json", "generation_config.json", "tokenizer.json",
                           "tokenizer_config.json", "special_tokens_map.json", "model.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) assert_true(tu_exists(dir, files[i]));
    assert_false(tu_exists(dir, "model.safetensors.index.json"));
    assert_false(tu_exists(dir, "hf_quant_config.json"));

    cJSON *c = tu_read_json(dir, "config.json");
    assert_string_equal(json_str(c, "model_type"), "nemotron_h");
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(c, "architectures"), 0)->valuestring,
                        "NemotronHForCausalLM");
    assert_string_equal(json_str(c, "hybrid_override_pattern"), "M*EM-E*M");
    assert_string_equal(json_str(c, "mamba_hidden_act"), "silu");
    assert_string_equal(json_str(c, "mlp_hidden_act"), "relu2");
    assert_string_equal(json_str(c, "mtp_hybrid_override_pattern"), "*E");
    const struct { const char *key; int v; } ints[] = {
        {"hidden_size", 64}, {"vocab_size", 512}, {"num_hidden_layers", 8},
        {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
        {"mamba_num_heads", 8}, {"mamba_head_dim", 16}, {"n_groups", 2}, {"ssm_state_size", 16},
        {"conv_kernel", 4}, {"chunk_size", 16}, {"intermediate_size", 128},
        {"moe_intermediate_size", 32}, {"moe_shared_expert_intermediate_size", 64},
        {"n_routed_experts", 8}, {"n_shared_experts", 1}, {"num_experts_per_tok", 2},
        {"n_group", 1}, {"topk_group", 1}, {"max_position_embeddings", 2048},
        {"bos_token_id", 1}, {"eos_token_id", 2}, {"pad_token_id", 0},
        {"num_nextn_predict_layers", 1},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (json_int(c, ints[i].key) != ints[i].v)
            fail_msg("%s = %d, expected %d", ints[i].key, json_int(c, ints[i].key), ints[i].v);
    const struct { const char *key; int v; } bools[] = {
        {"use_conv_bias", 1}, {"mamba_proj_bias", 0}, {"use_bias", 0}, {"attention_bias", 0},
        {"mlp_bias", 0}, {"norm_topk_prob", 1}, {"tie_word_embeddings", 0},
    };
    for (size_t i = 0; i < sizeof bools / sizeof bools[0]; i++)
        assert_int_equal(json_bool(c, bools[i].key), bools[i].v);
    assert_float_equal(cJSON_GetObjectItemCaseSensitive(c, "layer_norm_epsilon")->valuedouble, 1e-5, 1e-12);
    assert_float_equal(cJSON_GetObjectItemCaseSensitive(c, "routed_scaling_factor")->valuedouble, 2.5, 1e-12);
    cJSON_Delete(c);

    cJSON *g = tu_read_json(dir, "generation_config.json");
    cJSON *eos = cJSON_GetObjectItemCaseSensitive(g, "eos_token_id");
    assert_int_equal(cJSON_GetArraySize(eos), 2);
    assert_int_equal(cJSON_GetArrayItem(eos, 0)->valueint, 2);
    assert_int_equal(cJSON_GetArrayItem(eos, 1)->valueint, 11);
    assert_int_equal(json_int(g, "bos_token_id"), 1);
    assert_int_equal(json_int(g, "pad_token_id"), 0);
    assert_non_null(cJSON_GetObjectItemCaseSensitive(g, "temperature"));
    assert_non_null(cJSON_GetObjectItemCaseSensitive(g, "top_p"));
    cJSON_Delete(g);

    cJSON *tc = tu_read_json(dir, "tokenizer_config.json");
    assert_string_equal(json_str(tc, "bos_token"), "<s>");
    assert_string_equal(json_str(tc, "eos_token"), "<|im_end|>");
    assert_string_equal(json_str(tc, "pad_token"), "<unk>");
    assert_string_equal(json_str(tc, "unk_token"), "<unk>");
    const char *tmpl = json_str(tc, "chat_template");
    assert_int_equal(strlen(tmpl), 10504);
    assert_int_equal(cn_nano3_chat_template_len, 10504);
    assert_string_equal(tmpl, cn_nano3_chat_template);
    cJSON_Delete(tc);
}

static void test_template_matches_reference(void **state) {
    (void)state;
    /* The embedded copy is the reference file's bytes (when the reference is reachable). */
    size_t len = 0;
    unsigned char *ref = tu_read("../shared/reference/nemotron3-nano-chat-template.jinja", NULL, &len);
    if (!ref) ref = tu_read("/work/shared/reference/nemotron3-nano-chat-template.jinja", NULL, &len);
    if (!ref) skip();
    assert_int_equal(len, cn_nano3_chat_template_len);
    assert_memory_equal(ref, cn_nano3_chat_template, len);
    free(ref);
}

static const char *added_content(const cJSON *added, int id) {
    const cJSON *a;
    cJSON_ArrayForEach(a, added) {
        if (cJSON_GetObjectItemCaseSensitive(a, "id")->valueint == id) return json_str(a, "content");
    }
    return NULL;
}

static void check_tokenizer(const char *text, int vocab) {
    cJSON *t = cJSON_Parse(text);
    assert_non_null(t);
    cJSON *model = cJSON_GetObjectItemCaseSensitive(t, "model");
    assert_string_equal(json_str(model, "type"), "BPE");
    cJSON *pre = cJSON_GetObjectItemCaseSensitive(t, "pre_tokenizer");
    assert_string_equal(json_str(pre, "type"), "ByteLevel");
    assert_false(json_bool(pre, "add_prefix_space"));
    assert_true(json_bool(pre, "use_regex"));
    assert_string_equal(json_str(cJSON_GetObjectItemCaseSensitive(t, "decoder"), "type"), "ByteLevel");

    cJSON *v = cJSON_GetObjectItemCaseSensitive(model, "vocab"), *added = cJSON_GetObjectItemCaseSensitive(t, "added_tokens");
    assert_int_equal(cJSON_GetArraySize(v), vocab);
    unsigned char *seen = calloc((size_t)vocab, 1);
    assert_non_null(seen);
    cJSON *e;
    cJSON_ArrayForEach(e, v) {
        int id = e->valueint;
        assert_true(id >= 0 && id < vocab);
        assert_int_equal(seen[id], 0);
        seen[id] = 1;
    }
    /* every added token is special and agrees with the vocab */
    cJSON_ArrayForEach(e, added) {
        int id = cJSON_GetObjectItemCaseSensitive(e, "id")->valueint;
        assert_true(json_bool(e, "special"));
        assert_int_equal(cJSON_GetObjectItemCaseSensitive(v, json_str(e, "content"))->valueint, id);
        assert_true(id < 20 || id >= 276);
    }
    free(seen);
    const char *named[][2] = {{"0", "<unk>"}, {"1", "<s>"}, {"2", "</s>"}, {"10", "<|im_start|>"},
                              {"11", "<|im_end|>"}, {"12", "<think>"}, {"13", "</think>"},
                              {"14", "<tool_call>"}, {"15", "</tool_call>"}, {"3", "<SPECIAL_3>"},
                              {"19", "<SPECIAL_19>"}};
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
        assert_string_equal(added_content(added, atoi(named[i][0])), named[i][1]);
    /* byte tokens: 0x00 -> U+0100, ' ' -> U+0120 (G with dot), 'A' stays */
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(v, "\xc4\x80")->valueint, 20);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(v, "\xc4\xa0")->valueint, 20 + ' ');
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(v, "A")->valueint, 20 + 'A');
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(v, "\xc3\xbf")->valueint, 20 + 255);
    /* merges: "a b" with both parts and the result in the vocab; new ids follow merge order */
    cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    int n_merges = cJSON_GetArraySize(merges);
    assert_true(vocab == 276 ? n_merges == 0 : n_merges > 0);
    int next_new = 276;
    cJSON_ArrayForEach(e, merges) {
        const char *m = e->valuestring, *sp = strchr(m, ' ');
        assert_non_null(sp);
        assert_null(strchr(sp + 1, ' '));
        char left[256], joined[512];
        snprintf(left, sizeof left, "%.*s", (int)(sp - m), m);
        snprintf(joined, sizeof joined, "%s%s", left, sp + 1);
        assert_non_null(cJSON_GetObjectItemCaseSensitive(v, left));
        assert_non_null(cJSON_GetObjectItemCaseSensitive(v, sp + 1));
        cJSON *r = cJSON_GetObjectItemCaseSensitive(v, joined);
        assert_non_null(r);
        assert_true(r->valueint <= next_new);
        if (r->valueint == next_new) next_new++;
    }
    /* the rest are reserved fillers */
    for (int id = next_new; id < vocab; id++) {
        char want[32];
        snprintf(want, sizeof want, "<|reserved_%d|>", id);
        assert_string_equal(added_content(added, id), want);
    }
    assert_int_equal(cJSON_GetArraySize(added), 20 + (vocab - next_new));
    cJSON_Delete(t);
}

static void test_tokenizer_layout(void **state) {
    (void)state;
    char dir[1024];
    write_tiny("synth_tok", dir, sizeof dir, NULL);
    char *text = (char *)tu_read(dir, "tokenizer.json", NULL);
    assert_non_null(text);
    check_tokenizer(text, 512);
    free(text);
    /* a vocab larger than the training text can fill: reserved tokens take the rest */
    assert_int_equal(cn_synth_tokenizer_json(4096, &text, NULL), CN_OK);
    check_tokenizer(text, 4096);
    free(text);
    /* exactly the specials and bytes */
    assert_int_equal(cn_synth_tokenizer_json(276, &text, NULL), CN_OK);
    check_tokenizer(text, 276);
    free(text);
    assert_int_equal(cn_synth_tokenizer_json(275, &text, NULL), CN_EINVAL);
}

static void shape_is(const tu_st *s, const char *name, const char *dtype, const char *shape) {
    char buf[64];
    const char *dt = NULL;
    if (!tu_st_tensor(s, name, NULL, &dt)) fail_msg("missing tensor %s", name);
    if (strcmp(tu_st_shape(s, name, buf, sizeof buf), shape))
        fail_msg("%s: shape %s, expected %s", name, buf, shape);
    if (strcmp(dt, dtype)) fail_msg("%s: dtype %s, expected %s", name, dt, dtype);
}

static void test_tensor_names_and_shapes(void **state) {
    (void)state;
    char dir[1024];
    write_tiny("synth_names", dir, sizeof dir, NULL);
    tu_st s;
    tu_st_open(&s, dir, "model.safetensors");
    shape_is(&s, "backbone.embeddings.weight", "BF16", "[512,64]");
    shape_is(&s, "lm_head.weight", "BF16", "[512,64]");
    shape_is(&s, "backbone.norm_f.weight", "BF16", "[64]");
    /* M (layer 0): d_inner 128, conv_dim 128 + 2*2*16 = 192, in_proj 128 + 192 + 8 */
    shape_is(&s, "backbone.layers.0.norm.weight", "BF16", "[64]");
    shape_is(&s, "backbone.layers.0.mixer.in_proj.weight", "BF16", "[328,64]");
    shape_is(&s, "backbone.layers.0.mixer.conv1d.weight", "BF16", "[192,1,4]");
    shape_is(&s, "backbone.layers.0.mixer.conv1d.bias", "BF16", "[192]");
    shape_is(&s, "backbone.layers.0.mixer.dt_bias", "F32", "[8]");
    shape_is(&s, "backbone.layers.0.mixer.A_log", "F32", "[8]");
    shape_is(&s, "backbone.layers.0.mixer.D", "F32", "[8]");
    shape_is(&s, "backbone.layers.0.mixer.norm.weight", "BF16", "[128]");
    shape_is(&s, "backbone.layers.0.mixer.out_proj.weight", "BF16", "[64,128]");
    /* * (layer 1) */
    shape_is(&s, "backbone.layers.1.mixer.q_proj.weight", "BF16", "[64,64]");
    shape_is(&s, "backbone.layers.1.mixer.k_proj.weight", "BF16", "[32,64]");
    shape_is(&s, "backbone.layers.1.mixer.v_proj.weight", "BF16", "[32,64]");
    shape_is(&s, "backbone.layers.1.mixer.o_proj.weight", "BF16", "[64,64]");
    /* E (layer 2) */
    shape_is(&s, "backbone.layers.2.mixer.gate.weight", "F32", "[8,64]");
    shape_is(&s, "backbone.layers.2.mixer.gate.e_score_correction_bias", "F32", "[8]");
    shape_is(&s, "backbone.layers.2.mixer.experts.0.up_proj.weight", "BF16", "[32,64]");
    shape_is(&s, "backbone.layers.2.mixer.experts.7.down_proj.weight", "BF16", "[64,32]");
    shape_is(&s, "backbone.layers.2.mixer.shared_experts.up_proj.weight", "BF16", "[64,64]");
    shape_is(&s, "backbone.layers.2.mixer.shared_experts.down_proj.weight", "BF16", "[64,64]");
    assert_null(tu_st_tensor(&s, "backbone.layers.2.mixer.experts.8.up_proj.weight", NULL, NULL));
    /* - (layer 4) */
    shape_is(&s, "backbone.layers.4.mixer.up_proj.weight", "BF16", "[128,64]");
    shape_is(&s, "backbone.layers.4.mixer.down_proj.weight", "BF16", "[64,128]");
    assert_null(tu_st_tensor(&s, "backbone.layers.8.norm.weight", NULL, NULL));
    /* MTP */
    shape_is(&s, "mtp.layers.0.enorm.weight", "BF16", "[64]");
    shape_is(&s, "mtp.layers.0.hnorm.weight", "BF16", "[64]");
    shape_is(&s, "mtp.layers.0.norm.weight", "BF16", "[64]");
    shape_is(&s, "mtp.layers.0.eh_proj.weight", "BF16", "[64,128]");
    shape_is(&s, "mtp.layers.0.mixer.q_proj.weight", "BF16", "[64,64]");
    shape_is(&s, "mtp.layers.0.mixer.o_proj.weight", "BF16", "[64,64]");
    shape_is(&s, "mtp.layers.1.norm.weight", "BF16", "[64]");
    shape_is(&s, "mtp.layers.1.mixer.gate.weight", "F32", "[8,64]");
    shape_is(&s, "mtp.layers.1.mixer.gate.e_score_correction_bias", "F32", "[8]");
    shape_is(&s, "mtp.layers.1.mixer.experts.3.up_proj.weight", "BF16", "[32,64]");
    shape_is(&s, "mtp.layers.1.mixer.shared_experts.down_proj.weight", "BF16", "[64,64]");
    shape_is(&s, "mtp.layers.1.final_layernorm.weight", "BF16", "[64]");

    cn_synth_opts o;
    cn_synth_opts_init(&o);
    cn_synth_info info;
    assert_int_equal(cn_synth_describe(&o, &info, NULL), CN_OK);
    assert_int_equal(cJSON_GetArraySize(s.hdr) - 1, info.n_tensors);
    assert_int_equal(s.len - 8 - s.hlen, info.tensor_bytes);
    assert_int_equal(info.params, 343200);
    assert_int_equal(info.mtp_params, 62280);
    /* BF16 everywhere but F32 dt_bias/A_log/D (3 M layers x 3 x 8) and gates (3 E x (8x64 + 8)) */
    assert_int_equal(info.tensor_bytes, 2 * info.params + 2 * (3 * 3 * 8 + 3 * (8 * 64 + 8)));
    tu_st_close(&s);
}

static float f32_at(const unsigned char *p, uint64_t i) {
    float f;
    memcpy(&f, p + 4 * i, 4);
    return f;
}

static void set_f32(cn_synth_opts *o) { o->dtype = CN_F32; }
static void set_fp8(cn_synth_opts *o) { o->dtype = CN_F8_E4M3; }

static void test_value_ranges(void **state) {
    (void)state;
    char dir[1024];
    write_tiny("synth_f32", dir, sizeof dir, set_f32);
    tu_st s;
    tu_st_open(&s, dir, "model.safetensors");
    uint64_t nb;
    const char *dt;
    const unsigned char *p = tu_st_tensor(&s, "backbone.layers.3.mixer.A_log", &nb, &dt);
    for (uint64_t i = 0; i < nb / 4; i++) {
        float a = f32_at(p, i);
        assert_true(a >= 0.0f && a <= logf(16.0f) + 1e-6f);
    }
    p = tu_st_tensor(&s, "backbone.layers.3.mixer.dt_bias", &nb, &dt);
    for (uint64_t i = 0; i < nb / 4; i++) {
        float sp = log1pf(expf(f32_at(p, i)));
        assert_true(sp >= 0.00099f && sp <= 0.1001f);
    }
    p = tu_st_tensor(&s, "backbone.layers.3.mixer.D", &nb, &dt);
    for (uint64_t i = 0; i < nb / 4; i++) assert_true(fabsf(f32_at(p, i) - 1.0f) <= 0.1001f);
    p = tu_st_tensor(&s, "backbone.layers.3.norm.weight", &nb, &dt);
    assert_string_equal(dt, "F32");
    for (uint64_t i = 0; i < nb / 4; i++) assert_true(fabsf(f32_at(p, i) - 1.0f) <= 0.1001f);
    /* a projection: mean ~0, std ~1/sqrt(fan_in) = 1/8 */
    p = tu_st_tensor(&s, "backbone.layers.1.mixer.q_proj.weight", &nb, &dt);
    double sum = 0, sq = 0;
    uint64_t n = nb / 4;
    for (uint64_t i = 0; i < n; i++) {
        sum += f32_at(p, i);
        sq += (double)f32_at(p, i) * f32_at(p, i);
    }
    double mean = sum / (double)n, std = sqrt(sq / (double)n - mean * mean);
    assert_true(fabs(mean) < 0.01);
    assert_true(fabs(std - 0.125) < 0.01);
    /* values differ between tensors of the same shape (keyed by name) */
    const unsigned char *a = tu_st_tensor(&s, "backbone.layers.1.mixer.k_proj.weight", &nb, NULL);
    const unsigned char *b = tu_st_tensor(&s, "backbone.layers.1.mixer.v_proj.weight", NULL, NULL);
    assert_memory_not_equal(a, b, nb);
    tu_st_close(&s);
}

/* The fp8 model stores e4m3(v / scale) of the same v the f32 model stores. */
static void test_fp8(void **state) {
    (void)state;
    char d32[1024], d8[1024];
    write_tiny("synth_fp8_ref", d32, sizeof d32, set_f32);
    write_tiny("synth_fp8", d8, sizeof d8, set_fp8);
    assert_true(tu_exists(d8, "hf_quant_config.json"));
    cJSON *c = tu_read_json(d8, "config.json");
    cJSON *q = cJSON_GetObjectItemCaseSensitive(c, "quantization_config");
    assert_non_null(q);
    assert_string_equal(json_str(q, "quant_algo"), "FP8");
    cJSON_Delete(c);
    tu_st s32, s8;
    tu_st_open(&s32, d32, "model.safetensors");
    tu_st_open(&s8, d8, "model.safetensors");
    shape_is(&s8, "backbone.embeddings.weight", "BF16", "[512,64]");
    shape_is(&s8, "lm_head.weight", "BF16", "[512,64]");
    shape_is(&s8, "backbone.layers.2.mixer.gate.weight", "F32", "[8,64]");
    shape_is(&s8, "backbone.layers.0.mixer.A_log", "F32", "[8]");
    shape_is(&s8, "backbone.layers.0.mixer.conv1d.weight", "BF16", "[192,1,4]");
    const char *linears[] = {"backbone.layers.0.mixer.in_proj.weight",
                             "backbone.layers.1.mixer.o_proj.weight",
                             "backbone.layers.2.mixer.experts.5.down_proj.weight",
                             "backbone.layers.4.mixer.up_proj.weight",
                             "mtp.layers.0.eh_proj.weight"};
    for (size_t k = 0; k < sizeof linears / sizeof linears[0]; k++) {
        char sname[128];
        snprintf(sname, sizeof sname, "%s_scale", linears[k]);
        shape_is(&s8, sname, "F32", "[]");
        uint64_t n8, n32;
        const char *dt;
        const unsigned char *codes = tu_st_tensor(&s8, linears[k], &n8, &dt);
        assert_string_equal(dt, "F8_E4M3");
        const unsigned char *ref = tu_st_tensor(&s32, linears[k], &n32, NULL);
        assert_int_equal(n32, 4 * n8);
        float scale = f32_at(tu_st_tensor(&s8, sname, NULL, NULL), 0);
        assert_true(scale > 0.0f);
        int nonzero = 0;
        for (uint64_t i = 0; i < n8; i++) {
            uint8_t want = cn_f32_to_e4m3(f32_at(ref, i) / scale);
            if (codes[i] != want)
                fail_msg("%s[%llu]: code %02x, expected %02x", linears[k], (unsigned long long)i,
                         codes[i], want);
            nonzero += (codes[i] & 0x7f) != 0;
        }
        assert_true(nonzero > (int)(n8 * 9 / 10));
    }
    tu_st_close(&s32);
    tu_st_close(&s8);
}

static void set_nvfp4(cn_synth_opts *o) { o->dtype = CN_NVFP4; }

/* The nvfp4 model stores, row by row, what cn_quantize_nvfp4_row makes of the values the f32 model
 * stores, with the global scale written beside them; attention and the Mamba layers feeding
 * attention stay BF16, as in NVIDIA's NVFP4 release. */
static void test_nvfp4(void **state) {
    (void)state;
    char d32[1024], d4[1024];
    write_tiny("synth_nvfp4_ref", d32, sizeof d32, set_f32);
    write_tiny("synth_nvfp4", d4, sizeof d4, set_nvfp4);
    cJSON *c = tu_read_json(d4, "config.json");
    cJSON *q = cJSON_GetObjectItemCaseSensitive(c, "quantization_config");
    assert_non_null(q);
    assert_string_equal(json_str(q, "quant_algo"), "NVFP4");
    cJSON_Delete(c);
    c = tu_read_json(d4, "hf_quant_config.json");
    q = cJSON_GetObjectItemCaseSensitive(c, "quantization");
    assert_non_null(q);
    assert_string_equal(json_str(q, "quant_algo"), "NVFP4");
    cJSON_Delete(c);
    cn_synth_opts o;
    cn_synth_opts_init(&o);
    cn_synth_info i16, i4;
    cn_err err;
    assert_int_equal(cn_synth_describe(&o, &i16, &err), 0);
    set_nvfp4(&o);
    assert_int_equal(cn_synth_describe(&o, &i4, &err), 0);
    assert_int_equal(i4.params, i16.params);
    assert_int_equal(i4.mtp_params, i16.mtp_params);
    tu_st s32, s4;
    tu_st_open(&s32, d32, "model.safetensors");
    tu_st_open(&s4, d4, "model.safetensors");
    shape_is(&s4, "backbone.layers.1.mixer.q_proj.weight", "BF16", "[64,64]");
    shape_is(&s4, "backbone.layers.0.mixer.in_proj.weight", "BF16", "[328,64]"); /* feeds '*' */
    shape_is(&s4, "backbone.layers.3.mixer.out_proj.weight", "BF16", "[64,128]"); /* via E, - */
    shape_is(&s4, "backbone.layers.2.mixer.gate.weight", "F32", "[8,64]");
    shape_is(&s4, "lm_head.weight", "BF16", "[512,64]");
    const char *linears[] = {"backbone.layers.7.mixer.in_proj.weight",
                             "backbone.layers.2.mixer.experts.5.down_proj.weight",
                             "backbone.layers.2.mixer.shared_experts.up_proj.weight",
                             "backbone.layers.4.mixer.up_proj.weight",
                             "mtp.layers.0.eh_proj.weight"};
    for (size_t k = 0; k < sizeof linears / sizeof linears[0]; k++) {
        char sname[128], s2name[128];
        snprintf(sname, sizeof sname, "%s_scale", linears[k]);
        snprintf(s2name, sizeof s2name, "%s_scale_2", linears[k]);
        shape_is(&s4, s2name, "F32", "[]");
        uint64_t n4, ns, n32;
        const char *dt;
        const unsigned char *codes = tu_st_tensor(&s4, linears[k], &n4, &dt);
        assert_string_equal(dt, "U8");
        const unsigned char *scales = tu_st_tensor(&s4, sname, &ns, &dt);
        assert_string_equal(dt, "F8_E4M3");
        const unsigned char *ref = tu_st_tensor(&s32, linears[k], &n32, NULL);
        assert_int_equal(n32, 8 * n4);
        assert_int_equal(n4, 8 * ns);
        const float g = f32_at(tu_st_tensor(&s4, s2name, NULL, NULL), 0);
        assert_true(g > 0.0f);
        char buf[64];
        int64_t N = 0, Kd = 0;
        sscanf(tu_st_shape(&s4, sname, buf, sizeof buf), "[%lld,%lld]", (long long *)&N, (long long *)&Kd);
        const int64_t KK = 16 * Kd;
        uint8_t *pc = malloc((size_t)(KK / 2)), *ps = malloc((size_t)(KK / 16));
        float *row = malloc((size_t)KK * sizeof *row);
        assert_true(pc && ps && row);
        for (int64_t r = 0; r < N; r++) {
            for (int64_t kk = 0; kk < KK; kk++) row[kk] = f32_at(ref, (uint64_t)(r * KK + kk));
            cn_quantize_nvfp4_row(row, KK, g, pc, ps);
            if (memcmp(pc, codes + r * (KK / 2), (size_t)(KK / 2)) ||
                memcmp(ps, scales + r * (KK / 16), (size_t)(KK / 16)))
                fail_msg("%s row %lld: not cn_quantize_nvfp4_row of the f32 model's row", linears[k],
                         (long long)r);
        }
        free(pc);
        free(ps);
        free(row);
    }
    tu_st_close(&s32);
    tu_st_close(&s4);
}

static int files_equal(const char *d1, const char *d2, const char *name) {
    size_t l1, l2;
    unsigned char *a = tu_read(d1, name, &l1), *b = tu_read(d2, name, &l2);
    assert_non_null(a);
    assert_non_null(b);
    int eq = l1 == l2 && !memcmp(a, b, l1);
    free(a);
    free(b);
    return eq;
}

static void set_seed1(cn_synth_opts *o) { o->seed = 1; }

static void test_determinism(void **state) {
    (void)state;
    char a[1024], b[1024], c[1024];
    write_tiny("synth_det_a", a, sizeof a, NULL);
    write_tiny("synth_det_b", b, sizeof b, NULL);
    write_tiny("synth_det_c", c, sizeof c, set_seed1);
    const char *files[] = {"model.safetensors", "config.json", "tokenizer.json",
                           "tokenizer_config.json", "generation_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        if (!files_equal(a, b, files[i])) fail_msg("%s differs for the same seed", files[i]);
    assert_false(files_equal(a, c, "model.safetensors"));
    assert_true(files_equal(a, c, "tokenizer.json"));
    /* same layout, every large tensor different */
    tu_st sa, sc;
    tu_st_open(&sa, a, "model.safetensors");
    tu_st_open(&sc, c, "model.safetensors");
    assert_int_equal(sa.len, sc.len);
    assert_memory_equal(sa.buf, sc.buf, 8 + sa.hlen);
    uint64_t n;
    const unsigned char *x = tu_st_tensor(&sa, "backbone.embeddings.weight", &n, NULL);
    const unsigned char *y = tu_st_tensor(&sc, "backbone.embeddings.weight", NULL, NULL);
    assert_memory_not_equal(x, y, n);
    tu_st_close(&sa);
    tu_st_close(&sc);
}

static void set_shards(cn_synth_opts *o) { o->shard_bytes = 100000; }

/* Sharding changes files, never values. */
static void test_sharded_same_bytes(void **state) {
    (void)state;
    char one[1024], many[1024];
    write_tiny("synth_one", one, sizeof one, NULL);
    write_tiny("synth_shards", many, sizeof many, set_shards);
    cn_synth_opts o;
    cn_synth_opts_init(&o);
    set_shards(&o);
    cn_synth_info info;
    assert_int_equal(cn_synth_describe(&o, &info, NULL), CN_OK);
    assert_true(info.n_files > 2);
    assert_false(tu_exists(many, "model.safetensors"));
    cJSON *idx = tu_read_json(many, "model.safetensors.index.json");
    cJSON *map = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
    assert_int_equal(cJSON_GetArraySize(map), info.n_tensors);
    tu_st s1;
    tu_st_open(&s1, one, "model.safetensors");
    for (int f = 1; f <= info.n_files; f++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", f, info.n_files);
        tu_st sf;
        tu_st_open(&sf, many, name);
        cJSON *t;
        cJSON_ArrayForEach(t, sf.hdr) {
            if (!strcmp(t->string, "__metadata__")) continue;
            assert_string_equal(cJSON_GetObjectItemCaseSensitive(map, t->string)->valuestring, name);
            uint64_t n1, n2;
            const unsigned char *p1 = tu_st_tensor(&s1, t->string, &n1, NULL);
            const unsigned char *p2 = tu_st_tensor(&sf, t->string, &n2, NULL);
            assert_int_equal(n1, n2);
            assert_memory_equal(p1, p2, n1);
        }
        tu_st_close(&sf);
    }
    tu_st_close(&s1);
    cJSON_Delete(idx);
}

static void set_no_mtp(cn_synth_opts *o) { o->mtp = 0; }
static void set_layers3(cn_synth_opts *o) { o->layers = 3; }

static void test_no_mtp_and_layers(void **state) {
    (void)state;
    char dir[1024];
    write_tiny("synth_nomtp", dir, sizeof dir, set_no_mtp);
    tu_st s;
    tu_st_open(&s, dir, "model.safetensors");
    cJSON *t;
    cJSON_ArrayForEach(t, s.hdr) assert_true(strncmp(t->string, "mtp.", 4) != 0);
    tu_st_close(&s);
    cJSON *c = tu_read_json(dir, "config.json");
    assert_int_equal(json_int(c, "num_nextn_predict_layers"), 0);
    assert_null(cJSON_GetObjectItemCaseSensitive(c, "mtp_hybrid_override_pattern"));
    cJSON_Delete(c);

    write_tiny("synth_layers", dir, sizeof dir, set_layers3);
    c = tu_read_json(dir, "config.json");
    assert_string_equal(json_str(c, "hybrid_override_pattern"), "M*E");
    assert_int_equal(json_int(c, "num_hidden_layers"), 3);
    cJSON_Delete(c);
    tu_st_open(&s, dir, "model.safetensors");
    assert_non_null(tu_st_tensor(&s, "backbone.layers.2.mixer.gate.weight", NULL, NULL));
    assert_null(tu_st_tensor(&s, "backbone.layers.3.norm.weight", NULL, NULL));
    assert_non_null(tu_st_tensor(&s, "mtp.layers.1.final_layernorm.weight", NULL, NULL));
    tu_st_close(&s);
}

static void test_describe_presets_and_errors(void **state) {
    (void)state;
    cn_synth_opts o;
    cn_synth_info info;
    cn_err err;
    cn_synth_opts_init(&o);
    o.preset = "small";
    assert_int_equal(cn_synth_describe(&o, &info, NULL), CN_OK);
    assert_string_equal(info.pattern, "MEM*EMEM-EMEM*EM");
    assert_int_equal(info.params - info.mtp_params, 102986256ull);
    assert_int_equal(info.mtp_params, 10111520ull);
    o.preset = "nano-shape";
    assert_int_equal(cn_synth_describe(&o, &info, NULL), CN_OK);
    assert_int_equal(info.n_layers, 52);
    assert_int_equal(info.hidden_size, 2688);
    assert_int_equal(info.vocab_size, 131072);
    assert_int_equal(info.params - info.mtp_params, 31577940288ull);
    assert_int_equal(info.mtp_params, 1335325952ull);
    o.layers = 6;
    o.mtp = 0;
    assert_int_equal(cn_synth_describe(&o, &info, NULL), CN_OK);
    assert_string_equal(info.pattern, "MEMEM*");

    cn_synth_opts_init(&o);
    o.preset = "huge";
    assert_int_equal(cn_synth_describe(&o, &info, &err), CN_EINVAL);
    assert_non_null(strstr(err.msg, "huge"));
    cn_synth_opts_init(&o);
    o.layers = 9;
    assert_int_equal(cn_synth_describe(&o, &info, &err), CN_EINVAL);
    assert_non_null(strstr(err.msg, "layers"));
    cn_synth_opts_init(&o);
    o.dtype = CN_F16;
    assert_int_equal(cn_synth_describe(&o, &info, &err), CN_EINVAL);
    char dir[1024];
    tu_fresh_dir("synth_bad", dir, sizeof dir);
    assert_int_equal(cn_synth_write(dir, &o, &err), CN_EINVAL);
    assert_false(tu_exists(dir, "config.json"));
}

static void test_unwritable_dir(void **state) {
    (void)state;
    char dir[1024], sub[1100];
    tu_fresh_dir("synth_unwritable", dir, sizeof dir);
    snprintf(sub, sizeof sub, "%s/file", dir);
    FILE *f = fopen(sub, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(sub, sizeof sub, "%s/file/model", dir); /* a directory under a regular file */
    cn_synth_opts o;
    cn_synth_opts_init(&o);
    cn_err err;
    cn_err_clear(&err);
    assert_int_equal(cn_synth_write(sub, &o, &err), CN_EIO);
    assert_non_null(strstr(err.msg, dir));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_files_and_config),
        cmocka_unit_test(test_template_matches_reference),
        cmocka_unit_test(test_tokenizer_layout),
        cmocka_unit_test(test_tensor_names_and_shapes),
        cmocka_unit_test(test_value_ranges),
        cmocka_unit_test(test_fp8),
        cmocka_unit_test(test_nvfp4),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_sharded_same_bytes),
        cmocka_unit_test(test_no_mtp_and_layers),
        cmocka_unit_test(test_describe_presets_and_errors),
        cmocka_unit_test(test_unwritable_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
