/* constraint.h - constrained decoding at the token level: which tokens may come next so that the
 * output stays valid JSON (optionally for a schema) or one forced tool call.
 *
 * A request's constraint is built on the connection thread (a bad schema is the client's error,
 * named) and then used by the engine worker only, through two calls the engine's logits-mask hook
 * makes: apply() before each sample, accept() after each token taken. It promises:
 *   (1) After apply(), a token keeps a finite logit only if its bytes (token_bytes.h) are taken by
 *       the recogniser (json_constraint.h or toolcall_constraint.h) from the current state;
 *       special tokens count as text only where the recogniser allows markup (a tool call's tags).
 *   (2) The flags say when the output may end (the value or call is complete) and when it must end
 *       (nothing may follow): with them the engine lets end-of-sequence through or stops.
 *   (3) With after_think, nothing is constrained until the output has written `</think>` except
 *       that it may not end there; the bytes after it are the constrained value (Ollama applies a
 *       format after thinking too). So an output ends complete or at the length budget.
 *   (4) Greedy and sampled decoding both only choose among the tokens left, so the output is a
 *       valid prefix at every step, and complete when it ended by (2).
 * apply() costs one recogniser check per token whose first byte is allowed (inside a JSON string
 * or a raw tool value, tokens of plain text are taken by a table look-up), never allocates and
 * never fails.
 */
#ifndef CN_TEXT_CONSTRAINT_H
#define CN_TEXT_CONSTRAINT_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "base/error.h"
#include "text/token_bytes.h"

enum {
    CN_CONSTRAINT_EOS_OK = 1,   /* the output may end here */
    CN_CONSTRAINT_ONLY_EOS = 2, /* the output must end here */
};

typedef struct cn_constraint cn_constraint; /* layout: constraint.c */

/* JSON output: schema NULL is any JSON object. Returns 0, CN_ENOMEM, or CN_EINVAL /
 * CN_EUNSUPPORTED with err naming the schema's problem. tb is not owned and must outlive c. */
int cn_constraint_json(cn_constraint **out, const cn_token_bytes *tb, const cJSON *schema,
                       int after_think, cn_err *err);
/* One forced tool call among tools (an OpenAI tools array), or only the one named. Same returns. */
int cn_constraint_tool(cn_constraint **out, const cn_token_bytes *tb, const cJSON *tools,
                       const char *only, int after_think, cn_err *err);
void cn_constraint_free(cn_constraint *c);

/* Masks logits[0, n_vocab) to -INFINITY where a token may not come next; ids past the table are
 * masked too. Returns CN_CONSTRAINT_* flags. */
int cn_constraint_apply(cn_constraint *c, float *logits, int n_vocab);
/* Advances past a token the engine took. A token apply() masked is refused and leaves c as it was
 * (returns CN_EINVAL); otherwise 0. */
int cn_constraint_accept(cn_constraint *c, int32_t token);
/* 1 once the constrained output is complete. */
int cn_constraint_complete(const cn_constraint *c);

#endif
