/* info.c - the read-only endpoints' bodies; see info.h. */
#include "server/info.h"

#include <stdio.h>
#include <time.h>

static void iso_time(int64_t t, char *buf, size_t n) {
    time_t tt = (time_t)t;
    struct tm tm;
    gmtime_r(&tt, &tm);
    strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static void param_size(uint64_t p, char *buf, size_t n) {
    if (p >= 1000000000ull) snprintf(buf, n, "%.1fB", p / 1e9);
    else if (p >= 1000000ull) snprintf(buf, n, "%.1fM", p / 1e6);
    else snprintf(buf, n, "%.1fK", p / 1e3);
}

static cJSON *details(const cn_model_card *c) {
    char ps[32];
    param_size(c->params, ps, sizeof ps);
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "parent_model", "");
    cJSON_AddStringToObject(d, "format", "safetensors");
    cJSON_AddStringToObject(d, "family", c->family);
    cJSON *fs = cJSON_AddArrayToObject(d, "families");
    cJSON_AddItemToArray(fs, cJSON_CreateString(c->family));
    cJSON_AddStringToObject(d, "parameter_size", ps);
    cJSON_AddStringToObject(d, "quantization_level", c->quantization);
    return d;
}

/* One entry of /api/tags and /api/ps. */
static cJSON *entry(const cn_model_card *c) {
    char t[40], digest[80];
    iso_time(c->modified, t, sizeof t);
    /* not a content hash: a stable name-and-size tag, which is all clients compare */
    snprintf(digest, sizeof digest, "%016llx%016llx", (unsigned long long)c->size_bytes,
             (unsigned long long)c->params);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "name", c->name);
    cJSON_AddStringToObject(m, "model", c->name);
    cJSON_AddStringToObject(m, "modified_at", t);
    cJSON_AddNumberToObject(m, "size", (double)c->size_bytes);
    cJSON_AddStringToObject(m, "digest", digest);
    cJSON_AddItemToObject(m, "details", details(c));
    return m;
}

cJSON *cn_info_version(void) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "version", CN_VERSION);
    return o;
}

cJSON *cn_info_tags(const cn_model_card *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "models"), entry(c));
    return o;
}

cJSON *cn_info_ps(const cn_model_card *c, int busy, int waiting) {
    cJSON *o = cJSON_CreateObject();
    cJSON *m = entry(c);
    char t[40];
    iso_time((int64_t)time(NULL) + 100 * 365 * 86400LL, t, sizeof t); /* loaded for the server's life */
    cJSON_AddStringToObject(m, "expires_at", t);
    cJSON_AddNumberToObject(m, "size_vram", 0);
    cJSON_AddNumberToObject(m, "context_length", c->ctx);
    cJSON_AddNumberToObject(m, "running", busy);
    cJSON_AddNumberToObject(m, "queued", waiting);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "models"), m);
    return o;
}

cJSON *cn_info_show(const cn_model_card *c) {
    char t[40], key[96];
    iso_time(c->modified, t, sizeof t);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "modelfile", "");
    cJSON_AddStringToObject(o, "parameters", "");
    cJSON_AddStringToObject(o, "template", "");
    cJSON_AddItemToObject(o, "details", details(c));
    cJSON *mi = cJSON_AddObjectToObject(o, "model_info");
    cJSON_AddStringToObject(mi, "general.architecture", c->family);
    cJSON_AddNumberToObject(mi, "general.parameter_count", (double)c->params);
    snprintf(key, sizeof key, "%s.context_length", c->family);
    cJSON_AddNumberToObject(mi, key, c->max_ctx > 0 ? c->max_ctx : c->ctx);
    cJSON *caps = cJSON_AddArrayToObject(o, "capabilities");
    cJSON_AddItemToArray(caps, cJSON_CreateString("completion"));
    cJSON_AddItemToArray(caps, cJSON_CreateString("tools"));
    cJSON_AddItemToArray(caps, cJSON_CreateString("thinking"));
    cJSON_AddStringToObject(o, "modified_at", t);
    return o;
}

cJSON *cn_info_model(const cn_model_card *c) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", c->name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)c->modified);
    cJSON_AddStringToObject(m, "owned_by", "cairn");
    return m;
}

cJSON *cn_info_models(const cn_model_card *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), cn_info_model(c));
    return o;
}
