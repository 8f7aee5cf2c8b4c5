/* cli.h - the subcommands of `cairn`, each in its own file, and the table that names them.
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

/* NULL-terminated table, defined in commands.c. */
extern const cn_cli_command cn_cli_commands[];

int cn_cmd_generate(int argc, char **argv);   /* cmd_generate.c */
int cn_cmd_logits(int argc, char **argv);     /* cmd_logits.c */
int cn_cmd_make_model(int argc, char **argv); /* cmd_make_model.c */
int cn_cmd_info(int argc, char **argv);       /* cmd_info.c */
int cn_cmd_serve(int argc, char **argv);      /* cmd_serve.c */
int cn_cmd_run(int argc, char **argv);        /* cmd_run.c */
int cn_cmd_parse(int argc, char **argv);      /* cmd_parse.c */
int cn_cmd_render(int argc, char **argv);     /* cmd_render.c */
int cn_cmd_tokenize(int argc, char **argv);   /* cmd_tokenize.c */
int cn_cmd_detokenize(int argc, char **argv); /* cmd_tokenize.c */
int cn_cmd_bench(int argc, char **argv);      /* cmd_bench.c */
int cn_bench_speculate(int argc, char **argv); /* cmd_bench_spec.c: `bench --speculate` */
int cn_cmd_cache(int argc, char **argv);      /* cmd_cache.c */
int cn_bench_cache(int argc, char **argv);    /* bench_cache.c: `cairn bench cache` (argv[0] "cache") */
int cn_bench_serve(int argc, char **argv);    /* bench_serve.c: `cairn bench serve` (argv[0] "serve") */
int cn_bench_constraint(int argc, char **argv); /* bench_constraint.c: `cairn bench constraint` */
int cn_bench_model(int argc, char **argv);    /* bench_model.c: `cairn bench [flags]` (argv[0] "bench") */
int cn_cmd_quantize(int argc, char **argv);   /* cmd_quantize.c */

#endif
