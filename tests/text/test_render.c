/* test_render.c - the Nemotron 3 renderer against jinja2's goldens; /think toggles; bad input.
 *
 * tests/data/render/cases.json holds chat requests, goldens.json the prompts jinja2 rendered from
 * them (tools/reference/render_goldens.py). Every golden must come out byte-identical. When
 * python3 with jinja2 is present, the goldens are also re-rendered and compared with the
 * committed file, so a stale golden cannot hide.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/nano3_template.h"
#include "test_util.h"
#include "text/chat.h"
#include "text/pyjson.h"
#include "text/render.h"

static cJSON *load_json(const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/render/%s", tu_data_dir(), name);
    size_t len = 0;
    char *text = tu_read_file(path, &len);
    if (!text) fail_msg("cannot read %s", path);
    cJSON *v = NULL;
    cn_err err;
    int rc = cn_pyjson_parse(text, len, &v, &err);
    free(text);
    if (rc) fail_msg("%s: %s", path, err.msg);
    return v;
}

/* Renders a request given as JSON text with nemotron3; returns the prompt (caller frees) or NULL
 * with the error in *err. */
static char *render_text(const char *json, cn_err *err) {
    cn_chat chat;
    char *prompt = NULL;
    size_t len;
    cn_err_clear(err);
    if (cn_chat_parse(&chat, json, strlen(json), err) == 0)
        cn_render(cn_renderer_find("nemotron3"), &chat, &prompt, &len, err);
    cn_chat_free(&chat);
    return prompt;
}

static void report_diff(const char *name, const char *got, const char *want) {
    size_t k = 0;
    while (got[k] && got[k] == want[k]) k++;
    size_t from = k > 60 ? k - 60 : 0;
    print_error("case %s differs at byte %zu\n  got:  ...%.120s\n  want: ...%.120s\n", name, k,
                got + from, want + from);
}

static void test_goldens(void **state) {
    (void)state;
    cJSON *cases = load_json("cases.json"), *goldens = load_json("goldens.json");
    int n = cJSON_GetArraySize(cases), bad = 0;
    assert_int_equal(n, cJSON_GetArraySize(goldens));
    assert_true(n >= 40);
    const cJSON *g = goldens->child;
    for (const cJSON *c = cases->child; c; c = c->next, g = g->next) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        assert_string_equal(name, cJSON_GetObjectItem(g, "name")->valuestring);
        /* re-serialised with Python's rules, so number literals (1.0, 1E2, huge ints) survive */
        cn_strbuf req = CN_STRBUF_INIT;
        cn_py_dumps(&req, cJSON_GetObjectItem(c, "request"));
        cn_err err;
        char *got = render_text(req.p, &err);
        cn_strbuf_free(&req);
        const char *want = cJSON_GetObjectItem(g, "prompt")->valuestring;
        if (!got) {
            print_error("case %s: %s\n", name, err.msg);
            bad++;
        } else if (strcmp(got, want) != 0) {
            report_diff(name, got, want);
            bad++;
        }
        free(got);
    }
    cJSON_Delete(cases);
    cJSON_Delete(goldens);
    if (bad) fail_msg("%d of %d cases differ from the jinja2 goldens", bad, n);
}

static void test_goldens_are_current(void **state) {
    (void)state;
    if (system("python3 -c 'import jinja2' >/dev/null 2>&1") != 0) {
        print_message("[  SKIP    ] python3 with jinja2 not found: goldens not re-rendered\n");
        skip();
    }
    char *dir = tu_mkdtemp("render-goldens");
    assert_non_null(dir);
    char cmd[4096], path[2048], want_path[1024];
    snprintf(path, sizeof path, "%s/goldens.json", dir);
    snprintf(cmd, sizeof cmd,
             "python3 tools/reference/render_goldens.py --cases '%s/render/cases.json' "
             "--template '%s/render/nemotron3-nano-chat-template.jinja' --out '%s' >/dev/null",
             tu_data_dir(), tu_data_dir(), path);
    assert_int_equal(system(cmd), 0);
    snprintf(want_path, sizeof want_path, "%s/render/goldens.json", tu_data_dir());
    size_t n1 = 0, n2 = 0;
    char *got = tu_read_file(path, &n1), *want = tu_read_file(want_path, &n2);
    assert_non_null(got);
    assert_non_null(want);
    if (n1 != n2 || memcmp(got, want, n1) != 0)
        fail_msg("jinja2 renders differ from the committed %s: rerun "
                 "tools/reference/render_goldens.py and review the diff", want_path);
    free(got);
    free(want);
    tu_rmtree(dir);
    free(dir);
}

/* The goldens' template is the one cairn ships (src/model/nano3_template.c). */
static void test_template_is_the_shipped_one(void **state) {
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/render/nemotron3-nano-chat-template.jinja", tu_data_dir());
    size_t len = 0;
    char *t = tu_read_file(path, &len);
    assert_non_null(t);
    assert_int_equal(len, cn_nano3_chat_template_len);
    assert_memory_equal(t, cn_nano3_chat_template, len);
    free(t);
}

#define SYS_EMPTY "<|im_start|>system\n<|im_end|>\n"
#define GEN_THINK "<|im_start|>assistant\n<think>\n"
#define GEN_NOTHINK "<|im_start|>assistant\n<think></think>"

static void expect(const char *json, const char *want) {
    cn_err err;
    char *got = render_text(json, &err);
    if (!got) fail_msg("%s: %s", json, err.msg);
    if (strcmp(got, want) != 0) {
        print_error("request: %s\n", json);
        report_diff("hand-written", got, want);
        free(got);
        fail();
    }
    free(got);
}

/* cairn's extension: the template knows no /think or /no_think, so these are written by hand. */
static void test_think_toggles(void **state) {
    (void)state;
    expect("{\"messages\": [{\"role\": \"user\", \"content\": \"Hi /no_think\"}]}",
           SYS_EMPTY "<|im_start|>user\nHi<|im_end|>\n" GEN_NOTHINK);
    expect("{\"messages\": [{\"role\": \"user\", \"content\": \"/no_think Hi\"}]}",
           SYS_EMPTY "<|im_start|>user\nHi<|im_end|>\n" GEN_NOTHINK);
    /* in the system message; the user's later /think wins */
    expect("{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief. /no_think\"},"
           " {\"role\": \"user\", \"content\": \"Explain.\\n/think\\n\"}]}",
           "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nExplain.\n<|im_end|>\n"
           GEN_THINK);
    /* the last one in the text wins; both are removed; the middle keeps one space */
    expect("{\"messages\": [{\"role\": \"user\", \"content\": \"a /think b /no_think\"}]}",
           SYS_EMPTY "<|im_start|>user\na b<|im_end|>\n" GEN_NOTHINK);
    /* the toggle beats enable_thinking and think */
    expect("{\"think\": false, \"chat_template_kwargs\": {\"enable_thinking\": false},"
           " \"messages\": [{\"role\": \"user\", \"content\": \"/think\"}]}",
           SYS_EMPTY "<|im_start|>user\n<|im_end|>\n" GEN_THINK);
    /* not a toggle: glued to other text, in a path, or a longer word; left alone */
    expect("{\"messages\": [{\"role\": \"user\", \"content\": \"x/think /thinking /no_think! "
           "see a/no_think\"}]}",
           SYS_EMPTY "<|im_start|>user\nx/think /thinking /no_think! see a/no_think<|im_end|>\n"
           GEN_THINK);
    /* assistant and tool text are not scanned */
    expect("{\"messages\": [{\"role\": \"user\", \"content\": \"q\"},"
           " {\"role\": \"assistant\", \"content\": \"ok /no_think\"},"
           " {\"role\": \"tool\", \"content\": \"/no_think\"}]}",
           SYS_EMPTY "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think></think>ok "
           "/no_think<|im_end|>\n<|im_start|>user\n<tool_response>\n/no_think\n</tool_response>\n"
           "<|im_end|>\n" GEN_THINK);
    /* tabs and CRLF around it; a later message's toggle wins over an earlier one */
    expect("{\"messages\": [{\"role\": \"user\", \"content\": \"one\\t/no_think\\r\\n\"},"
           " {\"role\": \"assistant\", \"content\": \"r\"},"
           " {\"role\": \"user\", \"content\": \"/think\\ttwo\"}]}",
           SYS_EMPTY "<|im_start|>user\none\r\n<|im_end|>\n<|im_start|>assistant\n<think></think>r"
           "<|im_end|>\n<|im_start|>user\ntwo<|im_end|>\n" GEN_THINK);
}

static void test_options_by_hand(void **state) {
    (void)state;
    /* Ollama think false; chat_template_kwargs wins over think */
    expect("{\"think\": false, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
           SYS_EMPTY "<|im_start|>user\nx<|im_end|>\n" GEN_NOTHINK);
    expect("{\"think\": false, \"chat_template_kwargs\": {\"enable_thinking\": true},"
           " \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
           SYS_EMPTY "<|im_start|>user\nx<|im_end|>\n" GEN_THINK);
    expect("{\"add_generation_prompt\": false, \"messages\": [{\"role\": \"user\", \"content\": "
           "\"x\"}]}",
           SYS_EMPTY "<|im_start|>user\nx<|im_end|>\n");
}

static void expect_error(const char *json, int code, const char *needle) {
    cn_err err;
    char *got = render_text(json, &err);
    if (got) fail_msg("accepted %s: %s", json, got);
    if (err.code != code || !strstr(err.msg, needle))
        fail_msg("%s: got code %d \"%s\", want %d with \"%s\"", json, err.code, err.msg, code,
                 needle);
}

static void test_bad_input(void **state) {
    (void)state;
    expect_error("", CN_EFORMAT, "expected a value");
    expect_error("{\"messages\": [", CN_EFORMAT, "end of the input");
    expect_error("{\"messages\": []} x", CN_EFORMAT, "extra data");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"a\",}]}", CN_EFORMAT,
                 "string key");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\"}]}", CN_EFORMAT,
                 "not valid UTF-8");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"\xed\xa0\x80\"}]}",
                 CN_EFORMAT, "UTF-8"); /* an encoded surrogate */
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"\xc0\xaf\"}]}", CN_EFORMAT,
                 "UTF-8"); /* overlong */
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"\\ud800\"}]}", CN_EFORMAT,
                 "lone surrogate");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"a\\u0000b\"}]}", CN_EINVAL,
                 "\\u0000");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"tab\tinside\"}]}",
                 CN_EFORMAT, "control character");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": 01}]}", CN_EFORMAT,
                 "leading zero");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": NaN}]}", CN_EFORMAT,
                 "expected a value");
    expect_error("[1, 2]", CN_EINVAL, "must be a JSON object");
    expect_error("{}", CN_EINVAL, "messages: missing");
    expect_error("{\"messages\": {}}", CN_EINVAL, "messages: expected an array");
    expect_error("{\"messages\": []}", CN_EINVAL, "messages: empty");
    expect_error("{\"messages\": [\"hi\"]}", CN_EINVAL, "messages[0]: expected an object");
    expect_error("{\"messages\": [{\"content\": \"x\"}]}", CN_EINVAL, "messages[0]: missing role");
    expect_error("{\"messages\": [{\"role\": 1, \"content\": \"x\"}]}", CN_EINVAL,
                 "messages[0].role: expected a string, got a number");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"},"
                 " {\"role\": \"developer\", \"content\": \"x\"}]}",
                 CN_EINVAL, "messages[1].role: unknown role \"developer\"");
    expect_error("{\"messages\": [{\"role\": \"user\"}]}", CN_EINVAL,
                 "messages[0]: missing content");
    expect_error("{\"messages\": [{\"role\": \"tool\", \"content\": null}]}", CN_EINVAL,
                 "missing content (required for tool messages)");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", CN_EINVAL,
                 "messages[0].content: expected a string or an array of text parts, got a number");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\","
                 " \"image_url\": {\"url\": \"x\"}}]}]}",
                 CN_EINVAL, "\"image_url\" are not supported");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]}",
                 CN_EINVAL, "messages[0].content[0].text: expected a string");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"x\","
                 " \"images\": [\"aGk=\"]}]}",
                 CN_EINVAL, "images are not supported");
    expect_error("{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\","
                 " \"reasoning_content\": 3}]}",
                 CN_EINVAL, "messages[0].reasoning_content: expected a string");
    expect_error("{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": {}}]}", CN_EINVAL,
                 "messages[0].tool_calls: expected an array");
    expect_error("{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"function\":"
                 " {\"arguments\": {}}}]}]}",
                 CN_EINVAL,
                 "messages[0].tool_calls[0].function.name: expected a string, got nothing");
    expect_error("{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"function\":"
                 " {\"name\": \"f\", \"arguments\": \"[1, 2]\"}}]}]}",
                 CN_EINVAL, "holds an array, not an object");
    expect_error("{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"function\":"
                 " {\"name\": \"f\", \"arguments\": 7}}]}]}",
                 CN_EINVAL, "arguments: expected an object or a JSON string, got a number");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": {}}",
                 CN_EINVAL, "tools: expected an array");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\":"
                 " \"function\", \"function\": {\"description\": \"d\"}}]}",
                 CN_EINVAL, "tools[0].function.name: expected a string");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [3]}",
                 CN_EINVAL, "tools[0]: expected an object");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
                 " \"add_generation_prompt\": \"yes\"}",
                 CN_EINVAL, "add_generation_prompt: expected true or false, got a string");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
                 " \"chat_template_kwargs\": {\"enable_thinking\": 0}}",
                 CN_EINVAL, "chat_template_kwargs.enable_thinking: expected true or false");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
                 " \"chat_template_kwargs\": []}",
                 CN_EINVAL, "chat_template_kwargs: expected an object");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"think\": \"max\"}",
                 CN_EINVAL, "think: expected true, false");
}

/* Tool-call arguments that are not JSON are kept raw in the chat and render as no parameters. */
static void test_raw_arguments_kept(void **state) {
    (void)state;
    const char *json = "{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"function\":"
                       " {\"name\": \"f\", \"arguments\": \"{oops\"}}]}]}";
    cn_chat chat;
    cn_err err;
    assert_int_equal(cn_chat_parse(&chat, json, strlen(json), &err), 0);
    assert_int_equal(chat.messages[0].n_tool_calls, 1);
    assert_null(chat.messages[0].tool_calls[0].arguments);
    assert_string_equal(chat.messages[0].tool_calls[0].arguments_raw, "{oops");
    assert_string_equal(chat.messages[0].content, "");
    cn_chat_free(&chat);
}

static void test_renderer_lookup(void **state) {
    (void)state;
    const cn_renderer *r = cn_renderer_find("nemotron3");
    assert_non_null(r);
    assert_string_equal(cn_renderer_name(r), "nemotron3");
    assert_ptr_equal(cn_renderer_for_model_type("nemotron_h"), r);
    assert_null(cn_renderer_for_model_type("llama"));
    assert_null(cn_renderer_for_model_type(NULL));
    assert_null(cn_renderer_find("chatml"));
    cn_chat empty;
    memset(&empty, 0, sizeof empty);
    char *p = NULL;
    cn_err err;
    assert_int_equal(cn_render(r, &empty, &p, NULL, &err), CN_EINVAL);
    assert_null(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_goldens),
        cmocka_unit_test(test_goldens_are_current),
        cmocka_unit_test(test_template_is_the_shipped_one),
        cmocka_unit_test(test_think_toggles),
        cmocka_unit_test(test_options_by_hand),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_raw_arguments_kept),
        cmocka_unit_test(test_renderer_lookup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
