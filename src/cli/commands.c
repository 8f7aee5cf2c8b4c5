/* commands.c - the table of subcommands. */
#include "cli/cli.h"

#include <stddef.h>

const cn_cli_command cn_cli_commands[] = {
    {"generate", cn_cmd_generate},
    {"logits", cn_cmd_logits},
    {"make-model", cn_cmd_make_model},
    {"info", cn_cmd_info},
    {"serve", cn_cmd_serve},
    {"run", cn_cmd_run},
    {"parse", cn_cmd_parse},
    {"render", cn_cmd_render},
    {"tokenize", cn_cmd_tokenize},
    {"detokenize", cn_cmd_detokenize},
    {"bench", cn_cmd_bench},
    {"cache", cn_cmd_cache},
    {"quantize", cn_cmd_quantize},
    {NULL, NULL},
};
