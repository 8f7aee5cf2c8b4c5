/* cli.h - the subcommands of `cairn`, each in its own file, and the flag parser they share.
 *
 * A subcommand is `int run(int argc, char **argv)` with argv[0] its own name; it returns the
 * process exit code (0 ok, 1 runtime error, 2 usage error) and never calls exit().
 */
#ifndef CN_CLI_H
#define CN_CLI_H

typedef struct cn_cli_command {
    const char *name;
    int (*run)(int argc, char **argv);
} cn_cli_command;

/* `cairn make-model`: writes a synthetic NemotronH checkpoint (cmd_make_model.c). */
int cn_cmd_make_model(int argc, char **argv);

/* NULL-terminated table, defined in commands.c. */
extern const cn_cli_command cn_cli_commands[];

#endif
