/* test_default_model.c - the committed default model (models/cobble) answers held-out conversations
 * exactly, through the whole text path: chat request -> renderer -> tokenizer -> engine (greedy,
 * with and without MTP speculation) -> detokenizer.
 *
 * tests/data/default_model/heldout.json holds the first held-out conversation of seven (task, thinking)
 * pairs of tools/train/data.py (seed 1), never seen in training, each with the completion the
 * chat template expects after the generation prompt, up to its closing `<|im_end|>`. A change to the
 * forward pass, the MTP head, the tokenizer, the renderer or the weights shows up here as a
 * different answer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>

#include "engine/engine.h"
#include "model/model.h"
#include "test_util.h"
#include "text/chat.h"
#include "text/render.h"
#include "text/text.h"

typedef struct fixture {
    cn_backend *b;
    cn_model *m;
    cn_text *t;
    cJSON *cases;
} fixture;

static fixture g_f;

static int setup(void **state) {
    (void)state;
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/../../models/cobble", tu_data_dir());
    g_f.b = tu_backend(0);
    if (!g_f.b) return -1;
    cn_err err;
    cn_err_clear(&err);
    cn_model_opts o = {0};
    if (cn_model_open(&g_f.m, dir, g_f.b, &o, &err)) {
        fprintf(stderr, "open %s: %s\n", dir, err.msg);
        return -1;
    }
    if (cn_text_open(&g_f.t, dir, cn_model_config(g_f.m)->model_type, &err)) {
        fprintf(stderr, "text %s: %s\n", dir, err.msg);
        return -1;
    }
    snprintf(path, sizeof path, "%s/default_model/heldout.json", tu_data_dir());
    char *s = tu_read_file(path, NULL);
    if (!s) return -1;
    g_f.cases = cJSON_Parse(s);
    free(s);
    return g_f.cases && cJSON_GetArraySize(g_f.cases) > 0 ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    cJSON_Delete(g_f.cases);
    cn_text_close(g_f.t);
    cn_model_close(g_f.m);
    cn_backend_free(g_f.b);
    return 0;
}

/* The completion for one case's request, special tokens kept; caller frees. */
static char *answer(cn_engine *e, const cJSON *request, cn_stop *stop) {
    char *req = cJSON_PrintUnformatted(request), *prompt = NULL, *text = NULL;
    size_t plen = 0, tlen = 0;
    cn_chat chat;
    cn_err err;
    cn_err_clear(&err);
    assert_int_equal(cn_chat_parse(&chat, req, strlen(req), &err), 0);
    assert_int_equal(cn_render(cn_text_renderer(g_f.t), &chat, &prompt, &plen, &err), 0);
    int32_t *ids = NULL;
    int n = 0;
    assert_int_equal(cn_text_encode(g_f.t, prompt, plen, &ids, &n, &err), 0);
    cn_request r = {.tokens = ids, .n_tokens = n, .max_tokens = 256};
    cn_sampler_params_default(&r.sampling);
    r.sampling.temperature = 0;
    cn_result res;
    assert_int_equal(cn_engine_generate(e, &r, &res), 0);
    *stop = res.stop;
    assert_int_equal(cn_tok_decode(cn_text_tokenizer(g_f.t), res.tokens, (size_t)res.eval_count, 0, &text,
                                   &tlen, &err), 0);
    free(res.tokens);
    free(ids);
    free(prompt);
    cn_chat_free(&chat);
    free(req);
    return text;
}

/* Every case with speculation (the default), the first `max_cases` of them plainly too: plain
 * decoding is the reference the engine's own tests hold speculation to, so a few cases suffice
 * and the sanitizer build stays quick. */
static void check_all(int no_speculate, int max_cases) {
    cn_engine *e;
    cn_err err;
    cn_err_clear(&err);
    cn_engine_opts o = {.no_speculate = no_speculate};
    assert_int_equal(cn_engine_open(&e, g_f.m, &o, &err), 0);
    const cJSON *c;
    int done = 0;
    cJSON_ArrayForEach(c, g_f.cases) {
        if (done++ == max_cases) break;
        /* the engine stops on <|im_end|> without returning it: compare what comes before */
        const char *completion = cJSON_GetObjectItem(c, "completion")->valuestring;
        size_t wn = strlen(completion), en = strlen("<|im_end|>");
        assert_true(wn >= en && !strcmp(completion + wn - en, "<|im_end|>"));
        char *want = strndup(completion, wn - en);
        assert_non_null(want);
        cn_stop stop;
        char *got = answer(e, cJSON_GetObjectItem(c, "request"), &stop);
        if (strcmp(got, want))
            fprintf(stderr, "case %d (%s): got\n%s\nwant\n%s\n", cJSON_GetObjectItem(c, "index")->valueint,
                    cJSON_GetObjectItem(c, "kind")->valuestring, got, want);
        assert_string_equal(got, want);
        assert_int_equal(stop, CN_STOP_EOS); /* ended on <|im_end|>, not on the token limit */
        free(got);
        free(want);
    }
    cn_engine_close(e);
}

static void test_heldout_answers_speculative(void **state) {
    (void)state;
    check_all(0, 1000);
}

static void test_heldout_answers_plain(void **state) {
    (void)state;
    check_all(1, 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_heldout_answers_speculative),
        cmocka_unit_test(test_heldout_answers_plain),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
