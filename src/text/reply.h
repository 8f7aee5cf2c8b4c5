/* reply.h - a generated reply's text pipeline: token ids in, thinking / content / tool-call
 * events out.
 *
 *     token id --[cn_detok]--> bytes --[cn_stopseq]--> text --[cn_parser, when parse]--> events
 *
 * The server's jobs and `cairn run` both stream a reply through it, so the two never disagree on
 * what a generation says. It promises:
 *   (1) Events are exactly what the parser (parser.h) gives for the decoded text cut at the first
 *       stop string; without parse, every piece of text is one CONTENT event (text, len set).
 *   (2) After a stop string matched, `stopped` is 1 and no text decoded later is emitted;
 *       cn_reply_finish still flushes what the parser held from before the stop.
 *   (3) The callback's nonzero code stops the feed and is returned as is.
 * It never allocates per token beyond what its pieces do, and never exits.
 */
#ifndef CN_TEXT_REPLY_H
#define CN_TEXT_REPLY_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "base/error.h"
#include "text/parser.h"
#include "text/stopseq.h"
#include "text/text.h"

/* Caller-allocated; fill with cn_reply_init, release with cn_reply_free. */
typedef struct cn_reply {
    /* read-only */
    int stopped; /* a stop string matched */

    /* private */
    cn_detok detok;
    cn_stopseq *stops; /* (optional) not owned */
    cn_parser parser;
    int parse, parser_ready;
    cn_parse_event_fn cb;
    void *ctx;
} cn_reply;

/* Prepares one reply. stops: stop strings (may be NULL; not owned, must outlive r). parse: run the
 * "nemotron3" reasoning/tool-call parser with thinking (the prompt opened <think>) and tools (an
 * OpenAI tools array or NULL, read and not copied). Every event goes to cb(ev, ctx). Returns 0,
 * CN_ENOMEM, or CN_EINVAL (tools malformed; err names it); r is safe to cn_reply_free either way. */
int cn_reply_init(cn_reply *r, const cn_text *t, cn_stopseq *stops, int parse, int thinking,
                  const cJSON *tools, cn_parse_event_fn cb, void *ctx, cn_err *err);
/* Decodes one generated token and emits what became certain. Returns 0, the callback's code,
 * CN_EINVAL (id outside the vocabulary), CN_EFORMAT or CN_ENOMEM. */
int cn_reply_token(cn_reply *r, int32_t id);
/* Feeds already-decoded text (the server's canned test output). Same returns. */
int cn_reply_text(cn_reply *r, const char *s, size_t n);
/* Ends the stream: the decoder's, the stop matcher's and the parser's held bytes go out. */
int cn_reply_finish(cn_reply *r);
void cn_reply_free(cn_reply *r);

#endif
