/* flags.h - the long-option parser every subcommand shares.
 *
 * A command declares a table of flags, each bound to a variable; cn_flags_parse fills them from
 * argv (`--name value` or `--name=value`; bools take no value); cn_flags_parse_pos also collects
 * positional arguments. Unknown flags, missing values,
 * malformed numbers, repeated flags (but a list's) and missing required flags are usage errors: the parser prints
 * one line naming the problem and the command's usage to stderr and returns CN_EUSAGE. It never
 * exits and never allocates (string values point into argv).
 */
#ifndef CN_FLAGS_H
#define CN_FLAGS_H

#include <stdint.h>
#include <stdio.h>

typedef enum cn_flag_type {
    CN_FLAG_STR,   /* const char ** */
    CN_FLAG_INT,   /* int * */
    CN_FLAG_U64,   /* uint64_t * */
    CN_FLAG_FLOAT, /* float * */
    CN_FLAG_BOOL,  /* int *, set to 1 when present */
    CN_FLAG_SIZE,  /* uint64_t * bytes: "1048576", "512K", "64M", "4G", "1T" (powers of 1024) */
    CN_FLAG_LIST,  /* cn_flag_list *: every value of a flag that may be repeated, in order */
} cn_flag_type;

#define CN_FLAG_LIST_MAX 16

/* The values of a repeatable flag (more than CN_FLAG_LIST_MAX is a usage error). */
typedef struct cn_flag_list {
    const char *v[CN_FLAG_LIST_MAX];
    int n;
} cn_flag_list;

typedef struct cn_flag {
    const char *name; /* without the leading "--"; NULL ends the table */
    cn_flag_type type;
    void *dst;
    const char *metavar; /* shown in usage, e.g. "DIR" */
    const char *help;
    int required;
    int seen; /* OUT: set by the parser */
} cn_flag;

/* Parses argv[1..argc) (argv[0] is the command's name). Returns 0, 1 when --help was given (usage
 * printed to stdout), or CN_EUSAGE (message and usage printed to stderr). */
int cn_flags_parse(cn_flag *flags, int argc, char **argv, const char *synopsis);
/* The same, for commands that take positional arguments: every argument that is not an option (a
 * lone "-" included; after "--", every argument) is stored in pos[0..max_pos) in order and counted
 * in *n_pos. More than max_pos of them is a usage error; how few is too few is the caller's call. */
int cn_flags_parse_pos(cn_flag *flags, int argc, char **argv, const char *synopsis, char **pos, int max_pos,
                       int *n_pos /* OUT */);
/* Prints "usage: cairn <synopsis>" and one line per flag. */
void cn_flags_usage(const cn_flag *flags, const char *synopsis, FILE *f);

#endif
