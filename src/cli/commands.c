/* commands.c - the table of subcommands. */
#include "cli/cli.h"

#include <stddef.h>

const cn_cli_command cn_cli_commands[] = {
    {"make-model", cn_cmd_make_model},
    {NULL, NULL},
};
