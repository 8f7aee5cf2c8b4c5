/* render_impl.h - what a renderer implements; only render.c and the renderers include it.
 *
 * A renderer appends the whole prompt to out and returns 0 or a negative CN_E code; render.c
 * owns the buffer and turns a failed allocation into CN_ENOMEM.
 */
#ifndef CN_RENDER_IMPL_H
#define CN_RENDER_IMPL_H

#include "text/render.h"
#include "text/strbuf.h"

struct cn_renderer {
    const char *name;
    int (*render)(const cn_chat *chat, cn_strbuf *out, cn_err *err);
    const char *turn_open; /* the text every turn of its prompts begins with */
};

/* render_nemotron.c: NVIDIA Nemotron 3 (Nano 30B-A3B) ChatML with <think> and qwen3-coder XML
 * tool calls. */
int cn_render_nemotron3(const cn_chat *chat, cn_strbuf *out, cn_err *err);

#endif
