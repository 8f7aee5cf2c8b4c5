/* lineedit.c - libedit on a terminal, getline elsewhere; see lineedit.h. */
#include "cli/lineedit.h"

#include <errno.h>

#include <histedit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"

#define HISTORY_LINES 1000

struct cn_lineedit {
    EditLine *el;      /* NULL: plain reads */
    History *hist;
    const char *prompt; /* what the prompt callback shows */
    char *buf;          /* the last line read */
    size_t cap;
    char *last;         /* the last line remembered, to skip repeats */
    char *file;         /* where the history persists ($HOME/.cairn/history), or NULL */
};

/* $HOME/.cairn/history, its folder made if missing; NULL without a HOME or a folder. */
static char *history_file(void) {
    const char *home = getenv("HOME");
    if (!home || !*home) return NULL;
    size_t n = strlen(home) + sizeof "/.cairn/history";
    char *p = malloc(n);
    if (!p) return NULL;
    snprintf(p, n, "%s/.cairn", home);
    if (mkdir(p, 0700) && errno != EEXIST) {
        free(p);
        return NULL;
    }
    snprintf(p, n, "%s/.cairn/history", home);
    return p;
}

static char *prompt_cb(EditLine *el) {
    cn_lineedit *le = NULL;
    el_get(el, EL_CLIENTDATA, &le);
    return (char *)(le && le->prompt ? le->prompt : "");
}

int cn_lineedit_open(cn_lineedit **out, int tty) {
    cn_lineedit *le = calloc(1, sizeof *le);
    if (!le) return CN_ENOMEM;
    if (tty) {
        HistEvent ev;
        le->el = el_init("cairn", stdin, stdout, stderr);
        le->hist = history_init();
        if (!le->el || !le->hist) {
            cn_lineedit_close(le);
            return CN_ENOMEM;
        }
        history(le->hist, &ev, H_SETSIZE, HISTORY_LINES);
        el_set(le->el, EL_CLIENTDATA, le);
        el_set(le->el, EL_PROMPT, prompt_cb);
        el_set(le->el, EL_EDITOR, "emacs");
        el_set(le->el, EL_HIST, history, le->hist);
        el_set(le->el, EL_SIGNAL, 1); /* the terminal is restored before our handlers run */
        el_source(le->el, NULL);      /* ~/.editrc, as every libedit program reads it */
        if ((le->file = history_file())) history(le->hist, &ev, H_LOAD, le->file); /* may not exist */
    }
    *out = le;
    return CN_OK;
}

int cn_lineedit_read(cn_lineedit *le, const char *prompt, const char **line, size_t *len) {
    const char *s;
    size_t n;
    if (le->el) {
        int count = 0;
        le->prompt = prompt;
        s = el_gets(le->el, &count);
        if (!s || count <= 0) return 0;
        n = (size_t)count;
    } else {
        if (prompt) { /* stdin is a terminal but stdout is not: the prompt still tells the user */
            fputs(prompt, stdout);
            fflush(stdout);
        }
        ssize_t got = getline(&le->buf, &le->cap, stdin);
        if (got < 0) return 0;
        s = le->buf;
        n = (size_t)got;
    }
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r')) n--;
    if (s != le->buf) { /* libedit's buffer is its own: copy, so that the caller may keep it */
        if (n + 1 > le->cap) {
            char *nb = realloc(le->buf, n + 1);
            if (!nb) return 0;
            le->buf = nb;
            le->cap = n + 1;
        }
        memcpy(le->buf, s, n);
    }
    le->buf[n] = '\0';
    *line = le->buf;
    *len = n;
    return 1;
}

void cn_lineedit_remember(cn_lineedit *le, const char *line) {
    if (!le->hist || !*line || (le->last && !strcmp(le->last, line))) return;
    char *copy = strdup(line);
    if (!copy) return; /* the history is a convenience: without memory it just misses a line */
    HistEvent ev;
    history(le->hist, &ev, H_ENTER, line);
    free(le->last);
    le->last = copy;
    if (le->file) history(le->hist, &ev, H_SAVE, le->file); /* each line at once: a crash loses none */
}

void cn_lineedit_close(cn_lineedit *le) {
    if (!le) return;
    if (le->el) el_end(le->el);
    if (le->hist) history_end(le->hist);
    free(le->buf);
    free(le->last);
    free(le->file);
    free(le);
}
