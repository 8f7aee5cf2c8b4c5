/* render.h - chat renderers: a parsed chat request in, the model's prompt text out.
 *
 * One renderer per model family, each hand-written C that follows its published chat template
 * and is held to that template by goldens rendered with jinja2 (tests/data/render/). The table is
 * tiny and fixed: renderers are looked up by name (`cairn render --renderer`) or by a config's
 * model_type. This module promises:
 *   (1) A renderer's output is byte-identical to jinja2 rendering its template with Hugging Face's
 *       settings over the request mapped as chat.h describes.
 *   (2) An unknown name or model_type gives NULL, never a guess; the caller reports it.
 *   (3) Rendering never modifies the chat and keeps no state: one renderer serves any number of
 *       threads.
 * It knows nothing of tokens or tensors: the prompt is text, tokenized elsewhere.
 */
#ifndef CN_RENDER_H
#define CN_RENDER_H

#include <stddef.h>

#include "base/error.h"
#include "text/chat.h"

typedef struct cn_renderer cn_renderer; /* layout: render.c */

/* The renderer called name ("nemotron3"), or NULL. */
const cn_renderer *cn_renderer_find(const char *name);
/* The renderer for a config.json model_type ("nemotron_h" -> nemotron3), or NULL. */
const cn_renderer *cn_renderer_for_model_type(const char *model_type);
/* Its name. */
const char *cn_renderer_name(const cn_renderer *r);
/* The text every turn of its prompts begins with ("<|im_start|>"): where a conversation's next
 * request may differ from this one, so where a restore point is worth having. */
const char *cn_renderer_turn_open(const cn_renderer *r);
/* The known renderer names, comma-separated, for messages ("nemotron3"). */
const char *cn_renderer_names(void);

/* Renders chat into *prompt_out (malloc'd, NUL-terminated; caller frees) and *len (bytes; may be
 * NULL). Returns 0, CN_EINVAL (the chat is something the template cannot render, e.g. no
 * messages; the message names it) or CN_ENOMEM; on error *prompt_out is untouched. */
int cn_render(const cn_renderer *r, const cn_chat *chat, char **prompt_out, size_t *len,
              cn_err *err);

#endif
