/* cli_util.h - helpers the subcommands share: token lists, model opening on a named backend.
 *
 * Errors are printed to stderr as "cairn: <message>" and returned; nothing here exits.
 */
#ifndef CN_CLI_UTIL_H
#define CN_CLI_UTIL_H

#include <stdint.h>

#include "model/model.h"

/* Parses "1,2,3" or "@FILE" (ids separated by commas or whitespace) into a malloc'd array.
 * Returns 0 or CN_EUSAGE (bad id, empty list; message printed), CN_ENOENT/CN_EIO for the file. */
int cn_cli_parse_tokens(const char *arg, int32_t **out, int *n);

/* The backend named `backend` ("cpu", "cuda", "cuda:N"; NULL = $CAIRN_BACKEND or "cpu") and the
 * model in dir on it; on error prints the message and cleans up. `threads` is for the CPU backend. */
int cn_cli_open_model(const char *dir, const char *backend, int threads, int ubatch, cn_backend **b,
                      cn_model **m);
void cn_cli_close_model(cn_backend *b, cn_model *m);

#endif
