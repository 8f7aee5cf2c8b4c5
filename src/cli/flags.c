/* flags.c - long-option parsing; see flags.h. */
#include "cli/flags.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

void cn_flags_usage(const cn_flag *flags, const char *synopsis, FILE *f) {
    fprintf(f, "usage: cairn %s\n\noptions:\n", synopsis);
    for (const cn_flag *fl = flags; fl->name; fl++) {
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", fl->name, fl->metavar ? " " : "",
                 fl->metavar ? fl->metavar : "");
        fprintf(f, "  %-24s %s%s\n", left, fl->help ? fl->help : "", fl->required ? " (required)" : "");
    }
}

static int set_value(cn_flag *fl, const char *v) {
    char *end = NULL;
    errno = 0;
    switch (fl->type) {
    case CN_FLAG_STR:
        *(const char **)fl->dst = v;
        return 0;
    case CN_FLAG_INT: {
        long x = strtol(v, &end, 10);
        if (errno || end == v || *end || x < -2147483647L || x > 2147483647L) return -1;
        *(int *)fl->dst = (int)x;
        return 0;
    }
    case CN_FLAG_U64: {
        if (*v == '-') return -1;
        unsigned long long x = strtoull(v, &end, 10);
        if (errno || end == v || *end) return -1;
        *(uint64_t *)fl->dst = (uint64_t)x;
        return 0;
    }
    case CN_FLAG_FLOAT: {
        float x = strtof(v, &end);
        if (errno || end == v || *end || !isfinite(x)) return -1;
        *(float *)fl->dst = x;
        return 0;
    }
    case CN_FLAG_BOOL:
        return -1;
    case CN_FLAG_LIST: {
        cn_flag_list *l = fl->dst;
        if (l->n >= CN_FLAG_LIST_MAX) return -1;
        l->v[l->n++] = v;
        return 0;
    }
    case CN_FLAG_SIZE: {
        if (*v == '-') return -1;
        double x = strtod(v, &end);
        if (errno || end == v || !(x >= 0)) return -1;
        double mul = 1;
        switch (*end) {
        case 'k': case 'K': mul = 1024.0; end++; break;
        case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
        case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
        case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
        default: break;
        }
        if ((*end == 'i' || *end == 'I') && mul > 1) end++;
        if (*end == 'b' || *end == 'B') end++;
        if (*end || x * mul > 1.8e19) return -1;
        *(uint64_t *)fl->dst = (uint64_t)(x * mul);
        return 0;
    }
    }
    return -1;
}

static int usage_error(const cn_flag *flags, const char *synopsis, const char *fmt, const char *a,
                       const char *b) {
    fputs("cairn: ", stderr);
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    cn_flags_usage(flags, synopsis, stderr);
    return CN_EUSAGE;
}

/* pos == NULL: every argument must be an option (cn_flags_parse). Otherwise arguments that are
 * not options (a lone "-" included, and everything after "--") go to pos[0..max_pos). */
static int parse(cn_flag *flags, int argc, char **argv, const char *synopsis, char **pos, int max_pos,
                 int *n_pos) {
    for (cn_flag *fl = flags; fl->name; fl++) fl->seen = 0;
    if (n_pos) *n_pos = 0;
    int only_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!only_pos && (!strcmp(arg, "-h") || !strcmp(arg, "--help"))) {
            cn_flags_usage(flags, synopsis, stdout);
            return 1;
        }
        if (pos && !only_pos && !strcmp(arg, "--")) {
            only_pos = 1;
            continue;
        }
        if (pos && (only_pos || strncmp(arg, "--", 2) != 0)) {
            if (*n_pos >= max_pos) return usage_error(flags, synopsis, "unexpected argument '%s'%s", arg, "");
            pos[(*n_pos)++] = argv[i];
            continue;
        }
        if (strncmp(arg, "--", 2) != 0 || !arg[2])
            return usage_error(flags, synopsis, "unexpected argument '%s'%s", arg, "");
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        cn_flag *fl = flags;
        while (fl->name && !(strlen(fl->name) == len && !strncmp(fl->name, name, len))) fl++;
        if (!fl->name) return usage_error(flags, synopsis, "unknown option '%s'%s", arg, "");
        if (fl->seen && fl->type != CN_FLAG_LIST)
            return usage_error(flags, synopsis, "option --%s given twice%s", fl->name, "");
        fl->seen = 1;
        if (fl->type == CN_FLAG_BOOL) {
            if (eq) return usage_error(flags, synopsis, "option --%s takes no value%s", fl->name, "");
            *(int *)fl->dst = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!v) {
            if (i + 1 >= argc) return usage_error(flags, synopsis, "option --%s needs a value%s", fl->name, "");
            v = argv[++i];
        }
        if (fl->type == CN_FLAG_LIST && ((cn_flag_list *)fl->dst)->n >= CN_FLAG_LIST_MAX)
            return usage_error(flags, synopsis, "option --%s given more than 16 times%s", fl->name, "");
        if (set_value(fl, v) != 0)
            return usage_error(flags, synopsis, "invalid value '%s' for --%s", v, fl->name);
    }
    for (cn_flag *fl = flags; fl->name; fl++)
        if (fl->required && !fl->seen)
            return usage_error(flags, synopsis, "missing required option --%s%s", fl->name, "");
    return 0;
}

int cn_flags_parse(cn_flag *flags, int argc, char **argv, const char *synopsis) {
    return parse(flags, argc, argv, synopsis, NULL, 0, NULL);
}

int cn_flags_parse_pos(cn_flag *flags, int argc, char **argv, const char *synopsis, char **pos, int max_pos,
                       int *n_pos) {
    return parse(flags, argc, argv, synopsis, pos, max_pos, n_pos);
}
