/* cli_util.h - helpers the subcommands share: token lists, model opening with a CPU backend.
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

/* A CPU backend and the model in dir; on error prints the message and cleans up. */
int cn_cli_open_model(const char *dir, int threads, int ubatch, cn_backend **b, cn_model **m);
void cn_cli_close_model(cn_backend *b, cn_model *m);

#endif
