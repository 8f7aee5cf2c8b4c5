/* render.c - the table of chat renderers and the call that runs one. */
#include "text/render_impl.h"

#include <string.h>

static const cn_renderer renderers[] = {
    {"nemotron3", cn_render_nemotron3, "<|im_start|>"},
};

/* config.json model_type -> renderer name. NemotronH checkpoints of the Nemotron 3 family say
 * "nemotron_h". (So do the older Nemotron-H and Nano v2 models, whose template differs: telling
 * them apart needs the checkpoint's own chat template, which this table does not look at.) */
static const struct {
    const char *model_type, *renderer;
} by_model_type[] = {
    {"nemotron_h", "nemotron3"},
};

const cn_renderer *cn_renderer_find(const char *name) {
    if (!name) return NULL;
    for (size_t k = 0; k < sizeof renderers / sizeof renderers[0]; k++)
        if (strcmp(renderers[k].name, name) == 0) return &renderers[k];
    return NULL;
}

const cn_renderer *cn_renderer_for_model_type(const char *model_type) {
    if (!model_type) return NULL;
    for (size_t k = 0; k < sizeof by_model_type / sizeof by_model_type[0]; k++)
        if (strcmp(by_model_type[k].model_type, model_type) == 0)
            return cn_renderer_find(by_model_type[k].renderer);
    return NULL;
}

const char *cn_renderer_name(const cn_renderer *r) { return r->name; }

const char *cn_renderer_turn_open(const cn_renderer *r) { return r->turn_open; }

const char *cn_renderer_names(void) { return "nemotron3"; }

int cn_render(const cn_renderer *r, const cn_chat *chat, char **prompt_out, size_t *len,
              cn_err *err) {
    if (!r || !chat) return cn_err_set(err, CN_EINVAL, "cn_render: no renderer or no chat");
    if (chat->n_messages < 1)
        return cn_err_set(err, CN_EINVAL, "messages: empty (at least one message is needed)");
    cn_strbuf b = CN_STRBUF_INIT;
    int rc = r->render(chat, &b, err);
    if (rc) {
        cn_strbuf_free(&b);
        return rc;
    }
    if (cn_strbuf_take(&b, prompt_out, len))
        return cn_err_set(err, CN_ENOMEM, "out of memory rendering the prompt");
    return 0;
}
