/* log.c - stderr logger; see log.h. */
#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_level = -1; /* -1: not yet read from CAIRN_LOG */

static cn_log_level level_from_env(void) {
    const char *s = getenv("CAIRN_LOG");
    if (!s) return CN_LOG_WARN;
    if (!strcmp(s, "debug")) return CN_LOG_DEBUG;
    if (!strcmp(s, "info")) return CN_LOG_INFO;
    if (!strcmp(s, "error")) return CN_LOG_ERROR;
    if (!strcmp(s, "none")) return CN_LOG_NONE;
    return CN_LOG_WARN;
}

void cn_log_set_level(cn_log_level level) { g_level = (int)level; }

cn_log_level cn_log_get_level(void) {
    if (g_level < 0) g_level = (int)level_from_env();
    return (cn_log_level)g_level;
}

void cn_log(cn_log_level level, const char *fmt, ...) {
    static const char *tag[] = {"debug", "info", "warn", "error"};
    if (level < cn_log_get_level() || level >= CN_LOG_NONE) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cairn %s: %s\n", tag[level], line);
}
