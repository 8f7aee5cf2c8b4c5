/* test_bench_model_cli.c - `cairn bench [flags]` (the model bench) as a process on tiny sizes:
 * every key of the JSON report is present, a finite positive number, both for a preset and
 * for a --model directory converted to NVFP4; usage errors exit 2. Speeds are never asserted:
 * timing on a shared machine is noise. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <sys/wait.h>

#include "test_util.h"

static char g_tmp[512];
static char g_model[600];

/* Tiny sizes: the run takes about a second, most of it the peak probe. */
#define SMALL "--prompt 24 --prompt-short 8 --context 40 --long-context 48 --gen 5 --burst 2 --probe-mb 16 --threads 2 --json"

static cJSON *bench_json(const char *args) {
    char *out = NULL;
    int rc = tu_sh(g_tmp, 0, &out, "'%s' bench %s " SMALL, tu_cairn_bin(), args);
    if (rc != 0) {
        char path[1024];
        snprintf(path, sizeof path, "%s/err.txt", g_tmp);
        char *err = tu_read_file(path, NULL);
        fprintf(stderr, "exit %d:\n%s\n", rc, err ? err : "");
        free(err);
    }
    assert_int_equal(rc, 0);
    assert_non_null(out);
    cJSON *j = cJSON_Parse(out);
    if (!j) fprintf(stderr, "not JSON:\n%s\n", out);
    free(out);
    assert_non_null(j);
    return j;
}

static const char *const kKeys[] = {
    "prefill_tok_s",    "prefill512_tok_s",      "decode_tok_s", "decode_8k_tok_s",
    "bytes_per_token",  "mem_bw_gbs",            "decode_roofline_ratio",
    "peak_gops",        "prefill_compute_ratio", "peak_memory_bytes",
};

static void check_keys(const cJSON *j) {
    for (size_t i = 0; i < sizeof kKeys / sizeof *kKeys; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, kKeys[i]);
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || !(v->valuedouble > 0))
            fprintf(stderr, "key %s: %s\n", kKeys[i], v ? cJSON_PrintUnformatted(v) : "missing");
        assert_true(cJSON_IsNumber(v));
        assert_true(isfinite(v->valuedouble));
        assert_true(v->valuedouble > 0);
    }
    /* every timed run carries its two probes and a reliability mark */
    const cJSON *runs = cJSON_GetObjectItemCaseSensitive(j, "runs");
    static const char *const names[] = {"prefill512", "prefill", "decode", "decode_8k", "prefill_long"};
    for (int i = 0; i < 5; i++) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(runs, names[i]);
        assert_non_null(r);
        assert_true(cJSON_GetObjectItemCaseSensitive(r, "probe_before_gbs")->valuedouble > 0);
        assert_true(cJSON_GetObjectItemCaseSensitive(r, "probe_after_gbs")->valuedouble > 0);
        assert_true(cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(r, "reliable")));
        const cJSON *med = cJSON_GetObjectItemCaseSensitive(r, "median_token_tok_s");
        if (i < 2 || i == 4) assert_null(med); /* prefills: no per-token times */
        else assert_true(cJSON_IsNumber(med) && med->valuedouble > 0);
    }
    assert_true(cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j, "unreliable")));
    /* the two decode runs took turns: 5 tokens in bursts of 2, 2 and 1, each pair judged */
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(j, "decode_bursts")->valueint, 3);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(j, "decode_burst_tokens")->valueint, 2);
    for (int i = 2; i < 4; i++)
        assert_int_equal(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(runs, names[i]), "tokens")
                             ->valueint, 5);
    int agree = cJSON_GetObjectItemCaseSensitive(j, "decode_pairs_agreeing")->valueint;
    assert_true(agree >= 0 && agree <= 3);
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(j, "decode_pair_ratios");
    assert_int_equal(cJSON_GetArraySize(pr), 3);
    int marked = 0;
    for (const cJSON *v = pr->child; v; v = v->next) marked += v->valuedouble > 0;
    assert_int_equal(marked, agree); /* pairs that saw two machines are negated */
    assert_true(cJSON_GetObjectItemCaseSensitive(j, "decode_8k_over_start")->valuedouble > 0);
    assert_true(cJSON_GetObjectItemCaseSensitive(j, "decode_8k_over_start_token_median")->valuedouble > 0);
    double med = cJSON_GetObjectItemCaseSensitive(j, "decode_8k_over_start_agreeing")->valuedouble;
    assert_true(agree ? med > 0 : med == 0);
    assert_true(cJSON_GetObjectItemCaseSensitive(j, "decode_8k_over_start_cpu")->valuedouble > 0);
    /* the long-context chunk: prefill512's 8 tokens after a 48-token prefix */
    const cJSON *rl = cJSON_GetObjectItemCaseSensitive(runs, "prefill_long");
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(rl, "tokens")->valueint, 8);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(rl, "context")->valueint, 48);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(j, "prefill_long_context")->valueint, 48);
    static const char *const pos[] = {"prefill_long_tok_s", "prefill_long_over_start",
                                      "prefill_long_prefix_tok_s", "attention_peak_gops"};
    for (size_t i = 0; i < sizeof pos / sizeof *pos; i++)
        assert_true(cJSON_GetObjectItemCaseSensitive(j, pos[i])->valuedouble > 0);
    /* by difference of two timed chunks: 0 when the longer one was not slower (noise) */
    double att = cJSON_GetObjectItemCaseSensitive(j, "attention_gops")->valuedouble;
    double ratio = cJSON_GetObjectItemCaseSensitive(j, "attention_compute_ratio")->valuedouble;
    assert_true(att >= 0 && ratio >= 0 && (att > 0) == (ratio > 0));
}

static void test_preset_every_key(void **st) {
    (void)st;
    cJSON *j = bench_json("--preset tiny");
    check_keys(j);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "weights")->valuestring, "bf16");
    /* bytes per token: the weights dominate, state and KV are added on top */
    double bpt = cJSON_GetObjectItemCaseSensitive(j, "bytes_per_token")->valuedouble;
    double w = cJSON_GetObjectItemCaseSensitive(j, "weight_bytes_per_token")->valuedouble;
    double b8k = cJSON_GetObjectItemCaseSensitive(j, "bytes_per_token_8k")->valuedouble;
    assert_true(w > 0 && bpt >= w && b8k > bpt);
    cJSON_Delete(j);
}

static void test_model_dir_nvfp4(void **st) {
    (void)st;
    char args[1024];
    snprintf(args, sizeof args, "--model '%s' --weights nvfp4", g_model);
    cJSON *j = bench_json(args);
    check_keys(j);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "weights")->valuestring, "nvfp4");
    /* the default quantization keeps some modules BF16: the peak weighs both tiles */
    double P = cJSON_GetObjectItemCaseSensitive(j, "prefill_params")->valuedouble;
    double P4 = cJSON_GetObjectItemCaseSensitive(j, "prefill_params_nvfp4")->valuedouble;
    assert_true(P4 > 0 && P4 < P);
    assert_true(cJSON_GetObjectItemCaseSensitive(j, "peak_gops")->valuedouble > 0);
    cJSON_Delete(j);
}

/* A slice of a preset holding every layer type of it adds the projection to the whole preset. */
static void test_slice_projects(void **st) {
    (void)st;
    cJSON *j = bench_json("--preset tiny --layers 6");
    check_keys(j);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, "full_model_projected");
    assert_non_null(f);
    assert_true(cJSON_GetObjectItemCaseSensitive(f, "bytes_per_token")->valuedouble >
                cJSON_GetObjectItemCaseSensitive(j, "weight_bytes_per_token")->valuedouble);
    cJSON_Delete(j);
}

static void test_usage_errors(void **st) {
    (void)st;
    const char *bad[] = {
        "",                                      /* neither --model nor --preset */
        "--preset tiny --model x",               /* both */
        "--model x --layers 2",                  /* --layers without --preset */
        "--preset tiny --weights int4",          /* unknown format */
        "--preset tiny --prompt 0",              /* sizes */
        "--preset tiny --gen -1",
        "--preset tiny --probe-mb 0",
        "--preset tiny --burst 0",
        "--preset tiny --long-context -1",
        "--preset tiny --no-such-flag",
        "--preset",                              /* missing value */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = tu_sh(g_tmp, 0, NULL, "'%s' bench %s", tu_cairn_bin(), bad[i]);
        if (rc != 2) fprintf(stderr, "cairn bench %s: exit %d\n", bad[i], rc);
        assert_int_equal(rc, 2);
    }
    assert_int_equal(tu_sh(g_tmp, 0, NULL, "'%s' bench --help", tu_cairn_bin()), 0);
    assert_int_equal(tu_sh(g_tmp, 0, NULL, "'%s' bench nonsense", tu_cairn_bin()), 2);
    /* the subcommands still dispatch */
    assert_int_equal(tu_sh(g_tmp, 0, NULL, "'%s' bench cache --help", tu_cairn_bin()), 0);
    assert_int_equal(tu_sh(g_tmp, 0, NULL, "'%s' bench tokenizer --help", tu_cairn_bin()), 0);
}

static int setup(void **st) {
    (void)st;
    char *d = tu_mkdtemp("bench-model");
    if (!d) return -1;
    snprintf(g_tmp, sizeof g_tmp, "%s", d);
    free(d);
    snprintf(g_model, sizeof g_model, "%s/tiny", g_tmp);
    return tu_sh(g_tmp, 0, NULL, "'%s' make-model --preset tiny --no-mtp --out '%s'", tu_cairn_bin(), g_model) == 0 ? 0 : -1;
}

static int teardown(void **st) {
    (void)st;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_preset_every_key),
        cmocka_unit_test(test_model_dir_nvfp4),
        cmocka_unit_test(test_slice_projects),
        cmocka_unit_test(test_usage_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
