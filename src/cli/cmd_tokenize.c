/* cmd_tokenize.c - `cairn tokenize` (text to ids) and `cairn detokenize` (ids to text).
 *
 * The tokenizer is --tokenizer FILE or DIR/tokenizer.json of --model DIR. TEXT `-` reads standard
 * input; the text is taken byte for byte (no newline is added or removed), and detokenize prints
 * the decoded text exactly, without a newline of its own, so that the two round-trip.
 * Exit codes: 0 ok, 1 runtime error (unreadable or unsupported tokenizer, invalid UTF-8, unknown
 * id), 2 usage error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_util.h"
#include "cli/flags.h"
#include "text/tokenizer.h"

/* Whole standard input, malloc'd; NULL on error (message printed). */
static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t k = fread(buf + n, 1, cap - n, stdin);
        n += k;
        if (n < cap) break;
        char *p = realloc(buf, cap * 2 + 1);
        if (!p) break;
        buf = p;
        cap *= 2;
    }
    if (!buf || ferror(stdin)) {
        fprintf(stderr, "cairn: cannot read standard input\n");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* Loads the tokenizer named by --model / --tokenizer: 0, 1 (runtime error) or 2 (usage). */
static int open_tokenizer(const char *model, const char *file, cn_tokenizer **t) {
    if ((model != NULL) == (file != NULL)) {
        fprintf(stderr, "cairn: give exactly one of --model DIR and --tokenizer FILE\n");
        return 2;
    }
    char path[4096];
    if (model) snprintf(path, sizeof path, "%s/tokenizer.json", model);
    else snprintf(path, sizeof path, "%s", file);
    cn_err err;
    cn_err_clear(&err);
    if (cn_tok_load(t, path, &err)) {
        fprintf(stderr, "cairn: %s\n", err.msg);
        return 1;
    }
    return 0;
}

int cn_cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    int no_special = 0, json = 0, add_special = 0;
    cn_flag flags[] = {
        {"model", CN_FLAG_STR, &model, "DIR", "model directory (its tokenizer.json)", 0, 0},
        {"tokenizer", CN_FLAG_STR, &file, "FILE", "a tokenizer.json", 0, 0},
        {"no-special", CN_FLAG_BOOL, &no_special, NULL, "special tokens written in the text are plain text", 0, 0},
        {"add-special", CN_FLAG_BOOL, &add_special, NULL, "add the post-processor's tokens (BOS/EOS)", 0, 0},
        {"json", CN_FLAG_BOOL, &json, NULL, "print a JSON array", 0, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    const char *synopsis = "tokenize (--model DIR | --tokenizer FILE) [--no-special] [--json] TEXT  (TEXT - reads stdin)";
    char *pos[1];
    int npos = 0;
    int rc = cn_flags_parse_pos(flags, argc, argv, synopsis, pos, 1, &npos);
    if (rc) return rc > 0 ? 0 : 2;
    if (npos != 1) {
        fprintf(stderr, "cairn: tokenize needs the TEXT to encode (or - for standard input)\n");
        cn_flags_usage(flags, synopsis, stderr);
        return 2;
    }
    cn_tokenizer *t = NULL;
    if ((rc = open_tokenizer(model, file, &t))) return rc;
    char *in = NULL;
    const char *text = pos[0];
    size_t len = strlen(text);
    int status = 1;
    int32_t *ids = NULL;
    size_t n = 0;
    if (!strcmp(pos[0], "-")) {
        if (!(in = read_stdin(&len))) goto done;
        text = in;
    }
    cn_err err;
    cn_err_clear(&err);
    int fl = (no_special ? 0 : CN_TOK_PARSE_SPECIAL) | (add_special ? CN_TOK_ADD_SPECIAL : 0);
    if (cn_tok_encode(t, text, len, fl, &ids, &n, &err)) {
        fprintf(stderr, "cairn: %s\n", err.msg);
        goto done;
    }
    if (json) putchar('[');
    for (size_t i = 0; i < n; i++) printf(i ? (json ? ",%d" : " %d") : "%d", ids[i]);
    puts(json ? "]" : "");
    status = fflush(stdout) == 0 ? 0 : 1;
done:
    free(ids);
    free(in);
    cn_tok_free(t);
    return status;
}

int cn_cmd_detokenize(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    int skip = 0;
    cn_flag flags[] = {
        {"model", CN_FLAG_STR, &model, "DIR", "model directory (its tokenizer.json)", 0, 0},
        {"tokenizer", CN_FLAG_STR, &file, "FILE", "a tokenizer.json", 0, 0},
        {"skip-special", CN_FLAG_BOOL, &skip, NULL, "leave special tokens out", 0, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    const char *synopsis = "detokenize (--model DIR | --tokenizer FILE) IDS  (\"1,2,3\", \"1 2 3\", [1,2,3], @FILE or -)";
    char **pos = calloc((size_t)(argc > 0 ? argc : 1), sizeof *pos);
    if (!pos) return 1;
    int npos = 0, status = 2;
    char *joined = NULL, *in = NULL;
    int32_t *ids = NULL;
    int n = 0;
    cn_tokenizer *t = NULL;
    int rc = cn_flags_parse_pos(flags, argc, argv, synopsis, pos, argc, &npos);
    if (rc) {
        status = rc > 0 ? 0 : 2;
        goto done;
    }
    if (npos == 0) {
        fprintf(stderr, "cairn: detokenize needs the IDS to decode\n");
        cn_flags_usage(flags, synopsis, stderr);
        goto done;
    }
    /* one string of ids: the arguments joined, or standard input; brackets (JSON) become spaces */
    size_t total = 1;
    for (int i = 0; i < npos; i++) total += strlen(pos[i]) + 1;
    if (npos == 1 && !strcmp(pos[0], "-")) {
        size_t len;
        if (!(in = read_stdin(&len))) {
            status = 1;
            goto done;
        }
        joined = in;
        in = NULL;
    } else if (npos == 1 && pos[0][0] == '@') {
        joined = NULL;
    } else {
        if (!(joined = malloc(total))) {
            status = 1;
            goto done;
        }
        joined[0] = '\0';
        for (int i = 0; i < npos; i++) {
            strcat(joined, i ? " " : "");
            strcat(joined, pos[i]);
        }
    }
    if (joined)
        for (char *c = joined; *c; c++)
            if (*c == '[' || *c == ']') *c = ' ';
    if ((rc = cn_cli_parse_tokens(joined ? joined : pos[0], &ids, &n))) {
        status = rc == CN_EUSAGE ? 2 : 1;
        if (rc != CN_EUSAGE) fprintf(stderr, "cairn: cannot read %s: %s\n", pos[0] + 1, cn_strerror(rc));
        goto done;
    }
    if ((status = open_tokenizer(model, file, &t))) goto done;
    status = 1;
    char *text;
    size_t len;
    cn_err err;
    cn_err_clear(&err);
    if (cn_tok_decode(t, ids, (size_t)n, skip ? CN_TOK_SKIP_SPECIAL : 0, &text, &len, &err)) {
        fprintf(stderr, "cairn: %s\n", err.msg);
        goto done;
    }
    status = fwrite(text, 1, len, stdout) == len && fflush(stdout) == 0 ? 0 : 1;
    free(text);
done:
    free(pos);
    free(joined);
    free(in);
    free(ids);
    cn_tok_free(t);
    return status;
}
