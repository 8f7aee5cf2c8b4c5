/* test_server_units.c - the server's pieces without HTTP: the stop-string matcher under every
 * cut, the channel's order and end, and the request builders' refusals and jobs over the
 * synthetic tokenizer (nothing queued, nothing run), Anthropic's conversion included. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/synth.h"
#include "server/chan.h"
#include "server/request.h"
#include "text/stopseq.h"

#include <cjson/cJSON.h>

/* Feeds text cut at every pair of positions; the output must be the text before the first stop. */
static void check_stops(const char *text, const char *const *stops, int n_stops, const char *want,
                        int want_match) {
    size_t n = strlen(text);
    for (size_t a = 0; a <= n; a++)
        for (size_t b = a; b <= n; b++) {
            cn_stopseq m;
            memset(&m, 0, sizeof m);
            for (int i = 0; i < n_stops; i++) assert_int_equal(cn_stopseq_add(&m, stops[i]), 0);
            char got[256] = "";
            size_t gl = 0;
            size_t cuts[4] = {0, a, b, n};
            int matched = 0;
            for (int k = 0; k < 3 && !matched; k++) {
                const char *o;
                size_t ol;
                int rc = cn_stopseq_feed(&m, text + cuts[k], cuts[k + 1] - cuts[k], &o, &ol);
                assert_true(rc >= 0);
                memcpy(got + gl, o, ol);
                gl += ol;
                matched = rc == 1;
            }
            if (!matched) {
                const char *o;
                size_t ol;
                cn_stopseq_flush(&m, &o, &ol);
                memcpy(got + gl, o, ol);
                gl += ol;
            }
            got[gl] = '\0';
            assert_string_equal(got, want);
            assert_int_equal(matched, want_match);
            cn_stopseq_free(&m);
        }
}

static void test_stopseq(void **st) {
    (void)st;
    const char *s1[] = {"STOP"};
    check_stops("hello STOP world", s1, 1, "hello ", 1);
    check_stops("hello STO", s1, 1, "hello STO", 0);
    const char *s2[] = {"ab", "xyz", "bc"};
    check_stops("zzxyabc", s2, 3, "zzxy", 1);
    check_stops("xxyz", s2, 3, "x", 1);
    const char *none[] = {""};
    check_stops("plain", none, 1, "plain", 0);
    /* which: the stop string that matched first in the text, whatever its place in the list */
    cn_stopseq m;
    memset(&m, 0, sizeof m);
    for (int i = 0; i < 3; i++) assert_int_equal(cn_stopseq_add(&m, s2[i]), 0);
    const char *o;
    size_t ol;
    assert_int_equal(cn_stopseq_feed(&m, "zzxyzab", 7, &o, &ol), 1);
    assert_int_equal(m.which, 1);
    cn_stopseq_free(&m);
}

static void test_chan(void **st) {
    (void)st;
    cn_chan c;
    assert_int_equal(cn_chan_init(&c), 0);
    char buf[8];
    assert_int_equal(cn_chan_read(&c, buf, sizeof buf, 10), 0); /* timeout, nothing */
    assert_int_equal(cn_chan_puts(&c, "hello "), 0);
    assert_int_equal(cn_chan_puts(&c, "world"), 0);
    cn_chan_close(&c);
    assert_int_equal(cn_chan_puts(&c, "late"), CN_EINVAL);
    char all[32] = "";
    long n;
    size_t at = 0;
    while ((n = cn_chan_read(&c, buf, 4, 10)) > 0) {
        memcpy(all + at, buf, (size_t)n);
        at += (size_t)n;
    }
    assert_int_equal(n, -1);
    all[at] = '\0';
    assert_string_equal(all, "hello world");
    cn_chan_free(&c);
    assert_int_equal(cn_chan_init(&c), 0);
    cn_chan_abandon(&c);
    assert_int_equal(cn_chan_puts(&c, "x"), CN_ECANCELED);
    assert_int_equal(cn_chan_read(&c, buf, sizeof buf, 10), -1);
    cn_chan_free(&c);
}

static cn_text *g_text;

static int setup(void **st) {
    (void)st;
    char *json = NULL;
    cn_err err;
    if (cn_synth_tokenizer_json(1024, &json, &err)) return -1;
    int rc = cn_text_open_json(&g_text, json, strlen(json), "nemotron_h", &err);
    free(json);
    return rc;
}

static int teardown(void **st) {
    (void)st;
    cn_text_close(g_text);
    return 0;
}

typedef int (*build_fn)(const cn_api_env *, const char *, size_t, cn_job **, cn_refusal *);

/* Builds body with fn; returns the status (200 for a job) and frees the job. */
static int g_ctx = 256; /* the context the builders see; the tool tests need room for the tools */

static int status_of(build_fn fn, const char *body, const char *want_msg) {
    cn_api_env env = {.model_name = "tiny", .text = g_text, .ctx = g_ctx};
    cn_job *j = NULL;
    cn_refusal r;
    memset(&r, 0, sizeof r);
    int rc = fn(&env, body, strlen(body), &j, &r);
    if (!rc) {
        assert_non_null(j);
        assert_true(j->n_prompt > 0 && j->max_tokens > 0 && j->n_prompt + j->max_tokens <= g_ctx);
        cn_job_unref(j);
        return 200;
    }
    assert_null(j);
    if (want_msg && !strstr(r.msg, want_msg)) fail_msg("'%s' lacks '%s'", r.msg, want_msg);
    return r.status;
}

static void test_builders(void **st) {
    (void)st;
    const char *msgs = "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]";
    char b[1024];
    snprintf(b, sizeof b, "{\"model\":\"tiny\",%s}", msgs);
    assert_int_equal(status_of(cn_ollama_chat_request, b, NULL), 200);
    assert_int_equal(status_of(cn_openai_chat_request, b, NULL), 200);
    snprintf(b, sizeof b, "{\"model\":\"tiny:latest\",%s,\"options\":{\"num_predict\":5,\"stop\":[\"a\"]}}", msgs);
    assert_int_equal(status_of(cn_ollama_chat_request, b, NULL), 200);
    assert_int_equal(status_of(cn_ollama_generate_request, "{\"model\":\"tiny\",\"prompt\":\"x\"}", NULL), 200);
    /* options.speculate: a bool per request, false decodes plainly */
    assert_int_equal(status_of(cn_ollama_generate_request, "{\"model\":\"tiny\",\"prompt\":\"x\",\"options\":{\"speculate\":false}}", NULL), 200);
    assert_int_equal(status_of(cn_ollama_generate_request, "{\"model\":\"tiny\",\"prompt\":\"x\",\"options\":{\"speculate\":1}}", "speculate"), 400);
    {
        cn_api_env env = {.model_name = "tiny", .text = g_text, .ctx = 256};
        cn_job *j = NULL;
        cn_refusal rf;
        memset(&rf, 0, sizeof rf);
        const char *body = "{\"model\":\"tiny\",\"prompt\":\"x\",\"options\":{\"speculate\":false}}";
        assert_int_equal(cn_ollama_generate_request(&env, body, strlen(body), &j, &rf), 0);
        assert_int_equal(j->no_speculate, 1);
        cn_job_unref(j);
        body = "{\"model\":\"tiny\",\"prompt\":\"x\"}";
        assert_int_equal(cn_ollama_generate_request(&env, body, strlen(body), &j, &rf), 0);
        assert_int_equal(j->no_speculate, 0);
        cn_job_unref(j);
    }
    assert_int_equal(status_of(cn_openai_completions_request, "{\"model\":\"tiny\",\"prompt\":[\"x\"]}", NULL), 200);
    /* refusals */
    assert_int_equal(status_of(cn_ollama_chat_request, "{", "not valid JSON"), 400);
    assert_int_equal(status_of(cn_ollama_chat_request, "\"x\"", "JSON object"), 400);
    assert_int_equal(status_of(cn_ollama_chat_request, "{} {}", "after the JSON"), 400);
    assert_int_equal(status_of(cn_ollama_chat_request, "{\"messages\":[]}", "model is required"), 400);
    snprintf(b, sizeof b, "{\"model\":\"other\",%s}", msgs);
    assert_int_equal(status_of(cn_openai_chat_request, b, "not found"), 404);
    assert_int_equal(status_of(cn_ollama_chat_request, "{\"model\":\"tiny\",\"messages\":7}", NULL), 400);
    snprintf(b, sizeof b, "{\"model\":\"tiny\",%s,\"options\":{\"top_p\":2}}", msgs);
    assert_int_equal(status_of(cn_ollama_chat_request, b, "top_p"), 400);
    snprintf(b, sizeof b, "{\"model\":\"tiny\",%s,\"stop\":[1]}", msgs);
    assert_int_equal(status_of(cn_openai_chat_request, b, "stop"), 400);
    snprintf(b, sizeof b, "{\"model\":\"tiny\",%s,\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", msgs);
    assert_int_equal(status_of(cn_openai_chat_request, b, "at most 4"), 400);
    snprintf(b, sizeof b, "{\"model\":\"tiny\",%s,\"logprobs\":true}", msgs);
    assert_int_equal(status_of(cn_openai_chat_request, b, "logprobs"), 400);
    /* structured output and forced calls: accepted, or refused naming what cannot be held to */
    snprintf(b, sizeof b, "{\"model\":\"tiny\",%s,\"response_format\":{\"type\":\"json_object\"}}", msgs);
    assert_int_equal(status_of(cn_openai_chat_request, b, NULL), 200);
    snprintf(b, sizeof b, "{\"model\":\"tiny\",%s,\"response_format\":{\"type\":\"json_schema\","
             "\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}}}}}}", msgs);
    assert_int_equal(status_of(cn_openai_chat_request, b, NULL), 200);
    snprintf(b, sizeof b, "{\"model\":\"tiny\",%s,\"response_format\":{\"type\":\"json_schema\","
             "\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"string\",\"pattern\":\"a+\"}}}}", msgs);
    assert_int_equal(status_of(cn_openai_chat_request, b, "pattern"), 400);
    snprintf(b, sizeof b, "{\"model\":\"tiny\",%s,\"response_format\":{\"type\":\"json_schema\"}}", msgs);
    assert_int_equal(status_of(cn_openai_chat_request, b, "json_schema.schema"), 400);
    snprintf(b, sizeof b, "{\"model\":\"tiny\",%s,\"response_format\":{\"type\":\"yaml\"}}", msgs);
    assert_int_equal(status_of(cn_openai_chat_request, b, "response_format.type"), 400);
    snprintf(b, sizeof b, "{\"model\":\"tiny\",%s,\"format\":\"json\"}", msgs);
    assert_int_equal(status_of(cn_ollama_chat_request, b, NULL), 200);
    snprintf(b, sizeof b, "{\"model\":\"tiny\",%s,\"format\":\"xml\"}", msgs);
    assert_int_equal(status_of(cn_ollama_chat_request, b, "format"), 400);
    snprintf(b, sizeof b, "{\"model\":\"tiny\",%s,\"format\":{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}}}}", msgs);
    assert_int_equal(status_of(cn_ollama_chat_request, b, "$ref"), 400);
    assert_int_equal(status_of(cn_ollama_generate_request, "{\"model\":\"tiny\",\"prompt\":\"x\",\"format\":{\"type\":\"array\"}}", NULL), 200);
    const char *tools = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}}}}}]";
    g_ctx = 4096;
    snprintf(b, sizeof b, "{\"model\":\"tiny\",%s,%s,\"tool_choice\":\"required\"}", msgs, tools);
    assert_int_equal(status_of(cn_openai_chat_request, b, NULL), 200);
    snprintf(b, sizeof b, "{\"model\":\"tiny\",%s,%s,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}", msgs, tools);
    assert_int_equal(status_of(cn_openai_chat_request, b, NULL), 200);
    snprintf(b, sizeof b, "{\"model\":\"tiny\",%s,%s,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}", msgs, tools);
    assert_int_equal(status_of(cn_openai_chat_request, b, "no tool named \"g\""), 400);
    snprintf(b, sizeof b, "{\"model\":\"tiny\",%s,\"tool_choice\":\"required\"}", msgs);
    assert_int_equal(status_of(cn_openai_chat_request, b, "no tools"), 400);
    snprintf(b, sizeof b, "{\"model\":\"tiny\",%s,%s,\"tool_choice\":\"sometimes\"}", msgs, tools);
    assert_int_equal(status_of(cn_openai_chat_request, b, "tool_choice"), 400);
    snprintf(b, sizeof b, "{\"model\":\"tiny\",%s,%s,\"tool_choice\":\"required\",\"response_format\":{\"type\":\"json_object\"}}", msgs, tools);
    assert_int_equal(status_of(cn_openai_chat_request, b, "forced tool call"), 400);
    g_ctx = 256;
    assert_int_equal(status_of(cn_openai_completions_request, "{\"model\":\"tiny\",\"prompt\":\"x\",\"echo\":true}", "echo"), 400);
    assert_int_equal(status_of(cn_ollama_generate_request, "{\"model\":\"tiny\",\"prompt\":\"x\",\"images\":[\"AA==\"]}", "images"), 400);
    assert_int_equal(status_of(cn_ollama_generate_request, "{\"model\":\"tiny\",\"prompt\":\"x\",\"raw\":true,\"system\":\"s\"}", "raw"), 400);
    assert_int_equal(status_of(cn_ollama_generate_request, "{\"model\":\"tiny\",\"prompt\":\"\",\"raw\":true}", "empty"), 400);
    /* past the context: both numbers named */
    char *big = malloc(8192);
    strcpy(big, "{\"model\":\"tiny\",\"prompt\":\"");
    for (int i = 0; i < 600; i++) strcat(big, "zq ");
    strcat(big, "\"}");
    assert_int_equal(status_of(cn_openai_completions_request, big, "past the context of 256 tokens"), 400);
    /* ... naming the flag that sets it, with OpenAI's code */
    cn_api_env env = {.model_name = "tiny", .text = g_text, .ctx = g_ctx};
    cn_job *j = NULL;
    cn_refusal r;
    memset(&r, 0, sizeof r);
    assert_int_equal(cn_openai_completions_request(&env, big, strlen(big), &j, &r), CN_EINVAL);
    assert_null(j);
    assert_non_null(strstr(r.msg, "cairn serve --ctx N"));
    assert_non_null(r.code);
    assert_string_equal(r.code, "context_length_exceeded");
    free(big);
    const char bad_utf8[] = "{\"model\":\"tiny\",\"prompt\":\"\xC3\x28\"}";
    assert_int_equal(status_of(cn_ollama_generate_request, bad_utf8, "UTF-8"), 400);
}

/* Builds body with fn into a job (the test fails on a refusal). */
static cn_job *build(build_fn fn, const char *body) {
    cn_api_env env = {.model_name = "tiny", .text = g_text, .ctx = g_ctx};
    cn_job *j = NULL;
    cn_refusal r;
    memset(&r, 0, sizeof r);
    if (fn(&env, body, strlen(body), &j, &r)) fail_msg("refused (%d): %s", r.status, r.msg);
    return j;
}

/* A Responses request renders the prompt the same conversation gives as a chat request. */
static void same_prompt(const char *responses_body, const char *chat_body) {
    cn_job *a = build(cn_responses_request, responses_body), *b = build(cn_openai_chat_request, chat_body);
    assert_int_equal(a->n_prompt, b->n_prompt);
    assert_memory_equal(a->prompt, b->prompt, (size_t)a->n_prompt * sizeof *a->prompt);
    assert_int_equal(a->thinking, b->thinking);
    assert_int_equal(a->tools != NULL, b->tools != NULL);
    cn_job_unref(a);
    cn_job_unref(b);
}

static void test_responses(void **st) {
    (void)st;
    g_ctx = 4096;
    build_fn fn = cn_responses_request;
    assert_int_equal(status_of(fn, "{\"model\":\"tiny\",\"input\":\"hi\"}", NULL), 200);
    /* Codex's probe: no input at all */
    assert_int_equal(status_of(fn, "{\"model\":\"tiny\",\"input\":[],\"max_output_tokens\":1}", NULL), 200);
    assert_int_equal(status_of(fn, "{\"model\":\"tiny\"}", NULL), 200);
    /* the conversation, item by item, as the chat request with the same turns */
    same_prompt("{\"model\":\"tiny\",\"instructions\":\"Be brief.\",\"input\":\"hi\"}",
                "{\"model\":\"tiny\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                "{\"role\":\"user\",\"content\":\"hi\"}]}");
    same_prompt("{\"model\":\"tiny\",\"input\":[]}",
                "{\"model\":\"tiny\",\"messages\":[{\"role\":\"system\",\"content\":\"\"}]}");
    same_prompt("{\"model\":\"tiny\",\"store\":false,\"include\":[\"reasoning.encrypted_content\"],\"prompt_cache_key\":\"k\","
                "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"description\":\"F.\",\"strict\":false,"
                "\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\",\"minimum\":1.0}}}},"
                "{\"type\":\"web_search\"},{\"type\":\"namespace\",\"name\":\"n\",\"tools\":[]}],"
                "\"input\":[{\"type\":\"message\",\"role\":\"developer\",\"content\":[{\"type\":\"input_text\",\"text\":\"sys\"},"
                "{\"type\":\"input_text\",\"text\":\"more\"}]},"
                "{\"role\":\"user\",\"content\":\"go\"},"
                "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[],\"content\":[{\"type\":\"reasoning_text\",\"text\":\"think\"}],"
                "\"encrypted_content\":\"zz\"},"
                "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"ok\",\"annotations\":[]}]},"
                "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{\\\"x\\\":2}\"},"
                "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"42\"},"
                "{\"type\":\"reasoning\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"s\"}]},"
                "{\"type\":\"message\",\"role\":\"assistant\",\"content\":\"done\"},"
                "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"again\"}]}]}",
                "{\"model\":\"tiny\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"F.\","
                "\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\",\"minimum\":1.0}}}}}],"
                "\"messages\":[{\"role\":\"system\",\"content\":\"sys\\nmore\"},{\"role\":\"user\",\"content\":\"go\"},"
                "{\"role\":\"assistant\",\"content\":\"ok\",\"reasoning_content\":\"think\",\"tool_calls\":[{\"id\":\"c1\","
                "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":2}\"}}]},"
                "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"},"
                "{\"role\":\"assistant\",\"content\":\"done\",\"reasoning_content\":\"s\"},"
                "{\"role\":\"user\",\"content\":\"again\"}]}");
    /* reasoning.effort: none and minimal turn thinking off */
    same_prompt("{\"model\":\"tiny\",\"input\":\"hi\",\"reasoning\":{\"effort\":\"minimal\"}}",
                "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                "\"chat_template_kwargs\":{\"enable_thinking\":false}}");
    cn_job *j = build(fn, "{\"model\":\"tiny\",\"input\":\"hi\",\"reasoning\":{\"effort\":\"none\"}}");
    assert_int_equal(j->thinking, 0);
    cn_job_unref(j);
    j = build(fn, "{\"model\":\"tiny\",\"input\":\"hi\",\"reasoning\":{\"effort\":\"high\"},\"max_output_tokens\":7,"
                  "\"temperature\":0.5,\"stream\":true}");
    assert_int_equal(j->thinking, 1);
    assert_int_equal(j->max_tokens, 7);
    assert_true(j->stream && j->sampling.temperature == 0.5f);
    char buf[4096];
    long n = cn_chan_read(&j->chan, buf, sizeof buf - 1, 10); /* the stream opened at build time */
    assert_true(n > 0);
    buf[n] = '\0';
    assert_non_null(strstr(buf, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0"));
    assert_non_null(strstr(buf, "event: response.in_progress"));
    assert_int_equal(cn_job_get_state(j), CN_JOB_QUEUED);
    cn_job_unref(j);
    /* the function tools only, in the chat shape */
    j = build(fn, "{\"model\":\"tiny\",\"input\":\"hi\",\"tools\":[{\"type\":\"custom\",\"name\":\"apply_patch\"},"
                  "{\"type\":\"function\",\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}],"
                  "\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"}}");
    assert_int_equal(cJSON_GetArraySize(j->tools), 1);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(j->tools, 0), "function"), "name")->valuestring, "f");
    assert_non_null(j->constraint);
    cn_job_unref(j);
    j = build(fn, "{\"model\":\"tiny\",\"input\":\"hi\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"tool_choice\":\"none\"}");
    assert_null(j->tools);
    cn_job_unref(j);
    j = build(fn, "{\"model\":\"tiny\",\"input\":\"hi\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"p\",\"strict\":true,"
                  "\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}}}}}}");
    assert_non_null(j->constraint);
    cn_job_unref(j);
    /* refusals, each naming its field */
    assert_int_equal(status_of(fn, "{\"model\":\"tiny\",\"input\":\"hi\",\"previous_response_id\":\"resp_1\"}",
                               "previous_response_id is not supported"), 400);
    assert_int_equal(status_of(fn, "{\"model\":\"tiny\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\","
                                   "\"image_url\":\"data:x\"}]}]}", "input[0].content[0]: input_image"), 400);
    assert_int_equal(status_of(fn, "{\"model\":\"tiny\",\"input\":[{\"role\":\"critic\",\"content\":\"x\"}]}", "critic"), 400);
    assert_int_equal(status_of(fn, "{\"model\":\"tiny\",\"input\":[{\"type\":\"item_reference\",\"id\":\"x\"}]}", "item_reference"), 400);
    assert_int_equal(status_of(fn, "{\"model\":\"tiny\",\"input\":[{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":7}]}",
                               "input[0].arguments"), 400);
    assert_int_equal(status_of(fn, "{\"model\":\"tiny\",\"input\":[{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":\"[1]\"}]}",
                               "not an object"), 400);
    assert_int_equal(status_of(fn, "{\"model\":\"tiny\",\"input\":7}", "input must be"), 400);
    assert_int_equal(status_of(fn, "{\"model\":\"tiny\",\"input\":\"x\",\"reasoning\":{\"effort\":\"max\"}}", "reasoning.effort"), 400);
    assert_int_equal(status_of(fn, "{\"model\":\"tiny\",\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\"}}}", "text.format"), 400);
    assert_int_equal(status_of(fn, "{\"model\":\"tiny\",\"input\":\"x\",\"tool_choice\":\"required\"}", "no tools"), 400);
    assert_int_equal(status_of(fn, "{\"model\":\"other\",\"input\":\"x\"}", "not found"), 404);
    /* past the context: 400 with OpenAI's code, or, streaming, response.failed without the engine */
    g_ctx = 256;
    char *big = malloc(8192);
    strcpy(big, "{\"model\":\"tiny\",\"input\":\"");
    for (int i = 0; i < 600; i++) strcat(big, "zq ");
    strcat(big, "\"}");
    cn_api_env env = {.model_name = "tiny", .text = g_text, .ctx = g_ctx};
    cn_refusal r;
    memset(&r, 0, sizeof r);
    j = NULL;
    assert_int_equal(fn(&env, big, strlen(big), &j, &r), CN_EINVAL);
    assert_null(j);
    assert_string_equal(r.code, "context_length_exceeded");
    assert_string_equal(r.param, "input");
    big[strlen(big) - 1] = '\0';
    strcat(big, ",\"stream\":true}");
    assert_int_equal(fn(&env, big, strlen(big), &j, &r), 0);
    assert_int_equal(cn_job_get_state(j), CN_JOB_DONE);
    char all[16384];
    size_t at = 0;
    while ((n = cn_chan_read(&j->chan, all + at, sizeof all - 1 - at, 10)) > 0) at += (size_t)n;
    assert_int_equal(n, -1); /* closed */
    all[at] = '\0';
    assert_non_null(strstr(all, "event: response.created"));
    assert_non_null(strstr(all, "event: response.failed\ndata: {\"type\":\"response.failed\",\"sequence_number\":2"));
    assert_non_null(strstr(all, "\"error\":{\"code\":\"context_length_exceeded\",\"message\":\"the prompt is"));
    cn_job_unref(j);
    free(big);
}

/* Builds body with the Anthropic builder; returns the job (caller unrefs) or NULL. */
static cn_job *anthropic_job(const cn_api_env *env, const char *body) {
    cn_job *j = NULL;
    cn_refusal r;
    memset(&r, 0, sizeof r);
    if (cn_anthropic_messages_request(env, body, strlen(body), &j, &r)) fail_msg("refused: %s", r.msg);
    return j;
}

static void assert_same_prompt(const cn_job *a, const cn_job *b) {
    assert_int_equal(a->n_prompt, b->n_prompt);
    assert_memory_equal(a->prompt, b->prompt, (size_t)a->n_prompt * sizeof *a->prompt);
}

/* A chat's job marks where its last turns begin (the renderer's turn token), for the engine to
 * keep restore points there; a raw completion marks nothing. */
static void test_turn_marks(void **st) {
    (void)st;
    g_ctx = 4096;
    int32_t turn = cn_text_turn_token(g_text);
    assert_true(turn >= 0);
    cn_job *j = build(cn_openai_chat_request,
                      "{\"model\":\"tiny\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
                      "{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\"},"
                      "{\"role\":\"user\",\"content\":\"c\"}]}");
    int want = 0;
    for (int i = 1; i < j->n_prompt; i++) want += j->prompt[i] == turn;
    if (want > CN_JOB_MARKS / 2) want = CN_JOB_MARKS / 2;
    assert_true(want >= 3); /* user, assistant, user, and the generation prompt's */
    assert_int_equal(j->n_marks, want);
    for (int i = 0; i < j->n_marks; i++) {
        assert_int_equal(j->prompt[j->marks[i]], turn);
        if (i) assert_true(j->marks[i] > j->marks[i - 1]);
    }
    assert_int_equal(j->prompt[0], turn); /* the first turn's start is not marked: offset 0 */
    cn_job_unref(j);
    j = build(cn_openai_completions_request, "{\"model\":\"tiny\",\"prompt\":\"<|im_start|>user x <|im_start|>\"}");
    assert_int_equal(j->n_marks, 0);
    cn_job_unref(j);
    /* qwen-code's pattern: the next request drops the last text part of this user message (a
     * reminder) and sends it in a new one; this request marks where that part began, and the
     * next request's prompt is the same up to the mark */
    cn_job *a = build(cn_openai_chat_request,
                      "{\"model\":\"tiny\",\"messages\":[{\"role\":\"system\",\"content\":\"sys\"},"
                      "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"<r>first context</r>\"},"
                      "{\"type\":\"text\",\"text\":\"<r>the date is today</r>\"},{\"type\":\"text\",\"text\":\"say hi\"}]}]}");
    cn_job *b = build(cn_openai_chat_request,
                      "{\"model\":\"tiny\",\"messages\":[{\"role\":\"system\",\"content\":\"sys\"},"
                      "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"<r>first context</r>\"},"
                      "{\"type\":\"text\",\"text\":\"say hi\"}]},{\"role\":\"assistant\",\"content\":\"hi\"},"
                      "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"<r>the date is today</r>\"},"
                      "{\"type\":\"text\",\"text\":\"again\"}]}]}");
    int common = 0;
    while (common < a->n_prompt && common < b->n_prompt && a->prompt[common] == b->prompt[common]) common++;
    int best = 0; /* the deepest mark of a's that b shares */
    for (int i = 0; i < a->n_marks; i++)
        if (a->marks[i] <= common && a->marks[i] > best) best = a->marks[i];
    int user_start = 0; /* the turn token that opens a's user message */
    for (int i = 1; i < a->n_prompt && !user_start; i++) user_start = a->prompt[i] == turn ? i : 0;
    assert_true(user_start > 0);
    assert_true(best > user_start + 2); /* past "<r>first context</r>", not at the turn's start */
    assert_true(common - best <= 3);    /* within a token or two of where the prompts part */
    cn_job_unref(a);
    cn_job_unref(b);
    g_ctx = 256;
}

static void test_anthropic(void **st) {
    (void)st;
    g_ctx = 4096;
    cn_api_env env = {.model_name = "tiny", .text = g_text, .ctx = g_ctx};
    /* a conversation with thinking, a call and its result renders as the same chat in OpenAI's
     * shape does: the conversion loses nothing the template reads */
    const char *an =
        "{\"model\":\"tiny\",\"max_tokens\":64,\"system\":[{\"type\":\"text\",\"text\":\"Be brief.\"}],"
        "\"tools\":[{\"name\":\"f\",\"description\":\"d\",\"input_schema\":{\"type\":\"object\","
        "\"properties\":{\"x\":{\"type\":\"number\"}}}},{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}],"
        "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hmm\",\"signature\":\"s\"},"
        "{\"type\":\"text\",\"text\":\"calling\"},{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"f\",\"input\":{\"x\":1.0}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":\"42\"},"
        "{\"type\":\"text\",\"text\":\"and?\",\"cache_control\":{\"type\":\"ephemeral\"}}]}]}";
    const char *oa =
        "{\"model\":\"tiny\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
        "{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"calling\","
        "\"reasoning_content\":\"hmm\",\"tool_calls\":[{\"id\":\"toolu_1\",\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"arguments\":{\"x\":1.0}}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"toolu_1\",\"content\":\"42\"},{\"role\":\"user\",\"content\":\"and?\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"}}}}}]}";
    cn_job *a = anthropic_job(&env, an), *o = NULL;
    cn_refusal r;
    memset(&r, 0, sizeof r);
    assert_int_equal(cn_openai_chat_request(&env, oa, strlen(oa), &o, &r), 0);
    assert_same_prompt(a, o);
    assert_int_equal(a->api, CN_API_ANTHROPIC);
    assert_int_equal(a->max_tokens, 64);
    assert_int_equal(a->room_bound, 0);
    assert_int_equal(cJSON_GetArraySize(a->tools), 1); /* the server tool is left out */
    cn_job_unref(a);
    cn_job_unref(o);

    /* the billing header's changing values never reach the prompt */
    const char *fmt = "{\"model\":\"tiny\",\"system\":[%s{\"type\":\"text\",\"text\":\"S\"}],"
                      "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}]}";
    char b1[512], b2[512], b3[512];
    snprintf(b1, sizeof b1, fmt, "{\"type\":\"text\",\"text\":\"x-anthropic-billing-header: cc_version=2.1; cch=a1b2c;\"},");
    snprintf(b2, sizeof b2, fmt, "{\"type\":\"text\",\"text\":\"x-anthropic-billing-header: cc_version=2.2; cch=zzzzz;\"},");
    snprintf(b3, sizeof b3, fmt, "");
    cn_job *j1 = anthropic_job(&env, b1), *j2 = anthropic_job(&env, b2), *j3 = anthropic_job(&env, b3);
    assert_same_prompt(j1, j2);
    assert_same_prompt(j1, j3);
    assert_int_equal(j1->max_tokens, g_ctx - j1->n_prompt); /* 4096 by default, cut to the room */
    assert_int_equal(j1->room_bound, 1);
    cn_job_unref(j1);
    cn_job_unref(j2);
    cn_job_unref(j3);

    /* thinking: enabled/adaptive open the think block, disabled does not */
    const char *th = "{\"model\":\"tiny\",\"thinking\":{\"type\":\"%s\"},\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    const char *kinds[] = {"enabled", "adaptive", "disabled"};
    for (int i = 0; i < 3; i++) {
        snprintf(b1, sizeof b1, th, kinds[i]);
        cn_job *j = anthropic_job(&env, b1);
        assert_int_equal(j->thinking, i < 2);
        cn_job_unref(j);
    }

    /* count_tokens: the same prompt, and a count even past the context */
    int n = 0;
    assert_int_equal(cn_anthropic_count_tokens(&env, b3, strlen(b3), &n, &r), 0);
    j3 = anthropic_job(&env, b3);
    assert_int_equal(n, j3->n_prompt);
    cn_job_unref(j3);
    cn_api_env small = env;
    small.ctx = 8;
    assert_int_equal(cn_anthropic_count_tokens(&small, b3, strlen(b3), &n, &r), 0);
    assert_true(n > 8);

    /* a tool_result's blocks: text and tool references joined, is_error marked; the same prompt
     * as a string result saying so */
    const char *rb = "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
                     "\"is_error\":true,\"content\":%s}]}]}";
    snprintf(b1, sizeof b1, rb, "[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"tool_reference\",\"tool_name\":\"Bash\"}]");
    snprintf(b2, sizeof b2, rb, "\"a\\nBash\"");
    snprintf(b3, sizeof b3, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"tool\",\"content\":\"Error: a\\nBash\"}]}");
    j1 = anthropic_job(&env, b1), j2 = anthropic_job(&env, b2);
    assert_same_prompt(j1, j2);
    assert_int_equal(cn_openai_chat_request(&env, b3, strlen(b3), &o, &r), 0);
    assert_same_prompt(j1, o);
    cn_job_unref(j1);
    cn_job_unref(j2);
    cn_job_unref(o);

    /* aliases: served and echoed; other names 404 naming what is there */
    const char *pats[] = {"claude-*"};
    cn_api_env al = env;
    al.aliases = pats, al.n_aliases = 1;
    cn_job *j = anthropic_job(&al, "{\"model\":\"claude-haiku-4-5\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    assert_string_equal(j->model, "claude-haiku-4-5");
    assert_memory_equal(j->id, "msg_", 4);
    cn_job_unref(j);
    j = anthropic_job(&al, "{\"model\":\"tiny:latest\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    assert_string_equal(j->model, "tiny");
    cn_job_unref(j);
    assert_int_equal(cn_req_model_served(&al, "claude-"), 2);
    assert_int_equal(cn_req_model_served(&al, "xclaude-a"), 0);
    assert_int_equal(cn_req_model_served(&env, "claude-a"), 0);

    /* refusals name the field or block */
    struct { const char *body, *msg; int status; } bad[] = {
        {"{\"model\":\"tiny\"}", "messages is required", 400},
        {"{\"model\":\"tiny\",\"messages\":[]}", "at least one", 400},
        {"{\"model\":\"nope\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "not found", 404},
        {"{\"model\":\"tiny\",\"messages\":[{\"role\":\"robot\",\"content\":\"hi\"}]}", "messages[0].role", 400},
        {"{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{}}]}]}", "image blocks", 400},
        {"{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"content\":[{\"type\":\"image\"}]}]}]}", "content[0].content[0]: image", 400},
        {"{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"hologram\"}]}]}", "\"hologram\"", 400},
        {"{\"model\":\"tiny\",\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"name\":\"f\",\"input\":[1]}]}]}", "object input", 400},
        {"{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":7}]}", "messages[0].content", 400},
        {"{\"model\":\"tiny\",\"system\":7,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "system", 400},
        {"{\"model\":\"tiny\",\"thinking\":{\"type\":\"deep\"},\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "thinking", 400},
        {"{\"model\":\"tiny\",\"tool_choice\":{\"type\":\"some\"},\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "tool_choice", 400},
        {"{\"model\":\"tiny\",\"tool_choice\":{\"type\":\"any\"},\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "no tools", 400},
        {"{\"model\":\"tiny\",\"temperature\":1.5,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "temperature", 400},
        {"{\"model\":\"tiny\",\"max_tokens\":0,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "max_tokens", 400},
        {"{\"model\":\"tiny\",\"stop_sequences\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "stop_sequences", 400},
        {"{\"model\":\"tiny\",\"tools\":[{\"description\":\"no name\"}],\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "tools[0]", 400},
        {"{\"model\":\"tiny\",\"stream\":\"yes\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "stream", 400},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(status_of(cn_anthropic_messages_request, bad[i].body, bad[i].msg), bad[i].status);
    g_ctx = 256;
}

static char *read_data(const char *rel) {
    const char *dir = getenv("CAIRN_DATA");
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir ? dir : "tests/data", rel);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    b[n] = '\0';
    fclose(f);
    return b;
}

/* Two turns Claude Code sent (a Bash call, then its result): both render, and the second
 * prompt starts with the first one (its mid-conversation system message went from blocks to a
 * string in between), so the prefix cache covers all but the generation prompt. */
static void test_anthropic_claude_code(void **st) {
    (void)st;
    cn_api_env env = {.model_name = "tiny", .text = g_text, .ctx = 1 << 20};
    const char *pats[] = {"claude-*"};
    env.aliases = pats, env.n_aliases = 1;
    char *b1 = read_data("server/claude-code/turn1.json"), *b2 = read_data("server/claude-code/turn2.json");
    cn_job *j1 = anthropic_job(&env, b1), *j2 = anthropic_job(&env, b2);
    assert_int_equal(j1->stream, 1);
    assert_int_equal(j1->thinking, 1); /* thinking adaptive */
    assert_string_equal(j1->model, "claude-opus-5-5");
    assert_int_equal(cJSON_GetArraySize(j1->tools), 12);
    assert_true(j2->n_prompt > j1->n_prompt);
    int common = 0;
    while (common < j1->n_prompt && j1->prompt[common] == j2->prompt[common]) common++;
    /* what differs is the generation prompt's "<think>\n" against the turn's "<think></think>" */
    assert_true(common >= j1->n_prompt - 4);
    cn_job_unref(j1);
    cn_job_unref(j2);
    free(b1);
    free(b2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stopseq),
        cmocka_unit_test(test_chan),
        cmocka_unit_test(test_builders),
        cmocka_unit_test(test_responses),
        cmocka_unit_test(test_turn_marks),
        cmocka_unit_test(test_anthropic),
        cmocka_unit_test(test_anthropic_claude_code),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
