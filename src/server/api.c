/* api.c - helpers shared by the dialects' frame writers; see api.h. */
#include "server/api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const cn_api_ops *cn_api_ops_for(cn_api api) {
    switch (api) {
    case CN_API_OLLAMA_CHAT: return &cn_ollama_chat_ops;
    case CN_API_OLLAMA_GENERATE: return &cn_ollama_generate_ops;
    case CN_API_OPENAI_CHAT: return &cn_openai_chat_ops;
    case CN_API_OPENAI_COMPLETIONS: return &cn_openai_completions_ops;
    case CN_API_RESPONSES: return &cn_responses_ops;
    case CN_API_ANTHROPIC: return &cn_anthropic_ops;
    }
    return &cn_ollama_chat_ops;
}

int cn_api_send(cn_job *j, const char *prefix, cJSON *o, const char *suffix) {
    if (!o) return CN_ENOMEM;
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) return CN_ENOMEM;
    size_t pl = strlen(prefix), sl = strlen(s), xl = strlen(suffix);
    char *frame = malloc(pl + sl + xl + 1);
    if (!frame) {
        free(s);
        return CN_ENOMEM;
    }
    memcpy(frame, prefix, pl);
    memcpy(frame + pl, s, sl);
    memcpy(frame + pl + sl, suffix, xl + 1);
    free(s);
    int rc = cn_chan_write(&j->chan, frame, pl + sl + xl); /* one write: frames never interleave */
    free(frame);
    return rc;
}

int cn_api_send_event(cn_job *j, const char *name, cJSON *o) {
    char prefix[128];
    snprintf(prefix, sizeof prefix, "event: %s\ndata: ", name);
    return cn_api_send(j, prefix, o, "\n\n");
}

const char *cn_api_finish_reason(const cn_job *j, int openai) {
    if (openai && j->n_calls > 0) return "tool_calls";
    if (j->res.stop == CN_STOP_LENGTH) return "length";
    return "stop";
}

void cn_api_rfc3339_now(char *buf, size_t n) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char base[32];
    strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, n, "%s.%09ldZ", base, ts.tv_nsec);
}
