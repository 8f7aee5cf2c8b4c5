/* lineedit.h - the input lines of `cairn run`'s chat: edited on a terminal, read plainly otherwise.
 *
 * On a terminal, libedit (BSD-licensed, Debian's libedit-dev) gives the prompt emacs-style editing,
 * arrow keys and a history of the lines typed (Up/Down, Ctrl-R), kept in $HOME/.cairn/history
 * across runs (1000 lines; without a HOME, for this run only). Anywhere else (a pipe, a file:
 * what the tests feed), lines are read with getline and no prompt is written, so scripted input
 * never meets the editor. It never interprets a line: the chat joins lines into
 * messages (`\` and `"""`) and decides what enters the history. A Ctrl-C at the prompt ends the
 * read like end of input (the caller's SIGINT handler still runs; libedit restores the terminal).
 */
#ifndef CN_CLI_LINEEDIT_H
#define CN_CLI_LINEEDIT_H

#include <stddef.h>

typedef struct cn_lineedit cn_lineedit; /* layout: lineedit.c */

/* tty: stdin and stdout are a terminal (then libedit is used). Returns 0 or CN_ENOMEM. */
int cn_lineedit_open(cn_lineedit **out, int tty);
/* Reads one line, without its line end, into *line (owned by le, valid until the next call);
 * *len its bytes. prompt is shown on a terminal only. Returns 1, or 0 at end of input, on error
 * or when a signal interrupted the read. */
int cn_lineedit_read(cn_lineedit *le, const char *prompt, const char **line, size_t *len);
/* Adds a line to the line history, saved to $HOME/.cairn/history at once (terminal only; empty
 * lines and repeats of the last one are skipped). */
void cn_lineedit_remember(cn_lineedit *le, const char *line);
void cn_lineedit_close(cn_lineedit *le);

#endif
