/* fuzz_request.c - libFuzzer target for the server's request parsers: the six request builders
 * (Ollama chat and generate, OpenAI chat, completions and responses, Anthropic messages) and
 * /api/show's model check, over the synthetic tokenizer. The first byte picks the parser, the rest
 * is the body. A builder must
 * return a job or a refusal with a 4xx/5xx status and a message, never crash or leak.
 * Built with clang only: cmake -DCMAKE_C_COMPILER=clang -DCAIRN_FUZZ=ON (see CMakeLists.txt). */
#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/synth.h"
#include "server/request.h"

static cn_text *g_text; /* built once: loading the tokenizer per input would drown the search */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char *json = NULL;
    cn_err err;
    if (cn_synth_tokenizer_json(1024, &json, &err)) abort();
    if (cn_text_open_json(&g_text, json, strlen(json), "nemotron_h", &err)) abort();
    free(json);
    return 0;
}

typedef int (*build_fn)(const cn_api_env *, const char *, size_t, cn_job **, cn_refusal *);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const build_fn fns[] = {cn_ollama_chat_request, cn_ollama_generate_request,
                                   cn_openai_chat_request, cn_openai_completions_request, NULL,
                                   cn_responses_request, cn_anthropic_messages_request};
    static const char *const aliases[] = {"claude-*"};
    cn_api_env env = {.model_name = "tiny", .text = g_text, .ctx = 512, .aliases = aliases, .n_aliases = 1};
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    if (data[0] % 7 == 4) { /* /api/show: JSON object + model check */
        cn_refusal r;
        cJSON *root = NULL;
        if (!cn_req_parse_json(body, len, &root, &r)) {
            (void)cn_req_check_model(&env, root, &r);
            cJSON_Delete(root);
        }
        return 0;
    }
    cn_job *j = NULL;
    cn_refusal r;
    memset(&r, 0, sizeof r);
    int rc = fns[data[0] % 7](&env, body, len, &j, &r);
    if (rc == 0) {
        /* a job to run, or one its builder answered already (a streamed Responses request past
         * the context: response.failed written, the channel closed) */
        assert(j);
        if (cn_job_get_state(j) != CN_JOB_DONE)
            assert(j->n_prompt > 0 && j->n_prompt < env.ctx && j->max_tokens >= 0);
        cn_job_unref(j);
    } else {
        assert(!j && r.status >= 400 && r.msg[0]);
    }
    return 0;
}
