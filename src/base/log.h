/* log.h - the logger: the one piece of global mutable state cairn allows.
 *
 * Messages at or above the current level go to stderr with a level tag. The level is set once at
 * startup (cn_log_set_level) or from the CAIRN_LOG environment variable (error|warn|info|debug).
 * Logging never fails and never allocates.
 */
#ifndef CN_LOG_H
#define CN_LOG_H

typedef enum { CN_LOG_DEBUG = 0, CN_LOG_INFO, CN_LOG_WARN, CN_LOG_ERROR, CN_LOG_NONE } cn_log_level;

void cn_log_set_level(cn_log_level level);
cn_log_level cn_log_get_level(void);
void cn_log(cn_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define cn_debug(...) cn_log(CN_LOG_DEBUG, __VA_ARGS__)
#define cn_info(...) cn_log(CN_LOG_INFO, __VA_ARGS__)
#define cn_warn(...) cn_log(CN_LOG_WARN, __VA_ARGS__)
#define cn_error(...) cn_log(CN_LOG_ERROR, __VA_ARGS__)

#endif
