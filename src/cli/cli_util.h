/* cli_util.h - helpers the subcommands share: token lists, model opening on a named backend, the
 * loading progress line.
 *
 * Errors are printed to stderr as "cairn: <message>" and returned; nothing here exits.
 */
#ifndef CN_CLI_UTIL_H
#define CN_CLI_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

/* Parses "1,2,3" or "@FILE" (ids separated by commas or whitespace) into a malloc'd array.
 * Returns 0 or CN_EUSAGE (bad id, empty list; message printed), CN_ENOENT/CN_EIO for the file. */
int cn_cli_parse_tokens(const char *arg, int32_t **out, int *n);

/* Model loading progress for `serve` and `run`: one line on stderr, rewritten in place as the
 * stages go by ("cairn: loading tiny: binding 1.2 GB of weights..."), then "cairn: loaded tiny
 * (1.2 GB, 3.9B params) in 0.84 s". Shown only when enabled and stderr is a terminal, so scripts
 * and logs see nothing new; every call is a no-op otherwise. */
typedef struct cn_cli_progress {
    int show;         /* 1: stderr is a terminal and the caller wants the line */
    int drawn;        /* a line without its newline is on the terminal */
    const char *name; /* the model's name as shown; not owned */
    uint64_t bytes;   /* tensor bytes mapped, once known */
    double t0;        /* monotonic ms at begin */
} cn_cli_progress;

/* Starts timing; want: 0 for --quiet (the line is never shown). */
void cn_cli_progress_begin(cn_cli_progress *p, const char *name, int want);
/* Shows "loading NAME: what..." (printf-style). */
void cn_cli_progress_stage(cn_cli_progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Replaces the line with "loaded NAME (SIZE, N params) in T s" and a newline. */
void cn_cli_progress_done(cn_cli_progress *p, uint64_t params);
/* Erases the line (before an error message). */
void cn_cli_progress_clear(cn_cli_progress *p);
/* Milliseconds since cn_cli_progress_begin. */
double cn_cli_progress_ms(const cn_cli_progress *p);
/* "1.2 GB", "640 KB": bytes for people. */
void cn_cli_human_bytes(uint64_t bytes, char *buf, size_t n);

/* The backend named `backend` ("cpu", "cuda", "cuda:N"; NULL = $CAIRN_BACKEND or "cpu") and the
 * model in dir on it; on error prints the message and cleans up. `threads` is for the CPU backend. */
int cn_cli_open_model(const char *dir, const char *backend, int threads, int ubatch, cn_backend **b,
                      cn_model **m);
/* The same, reporting its stages through p (may be NULL). */
int cn_cli_open_model_progress(const char *dir, const char *backend, int threads, int ubatch,
                               cn_cli_progress *p, cn_backend **b, cn_model **m);
void cn_cli_close_model(cn_backend *b, cn_model *m);

/* --cache-gpu: the device tier's budget for the prefix cache. `flag` is what the user gave, or
 * CN_CLI_UNSET: then CN_PC_DEV_BUDGET on a backend with device memory, none on the CPU. */
#define CN_CLI_UNSET UINT64_MAX
#define CN_CLI_CACHE_GPU_HELP "device memory for restore points (default 1G on a GPU, none on the CPU)"
uint64_t cn_cli_dev_budget(uint64_t flag, const cn_backend *b);

/* The model `run` and `serve` open when --model is not given, into buf[0..n):
 *   1. $CAIRN_MODEL, when set and non-empty (used as it is, even if missing: the open names it);
 *   2. models/cobble under the current directory, when it holds a config.json;
 *   3. models/cobble beside the folder of the running binary (build/cairn -> ../models/cobble),
 *      so the repository's own binary finds it from any directory.
 * Returns 0 with buf set, or CN_ENOENT after saying on stderr where it looked. */
#define CN_CLI_DEFAULT_MODEL "models/cobble"
int cn_cli_default_model(char *buf, size_t n);

#endif
