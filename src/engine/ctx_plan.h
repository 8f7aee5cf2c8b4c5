/* ctx_plan.h - how many tokens of context a sequence gets when the user does not say: the model's
 * max_position_embeddings, lowered to what memory holds beside the weights and the cache budgets.
 *
 * One sequence's state (state.h) is a KV row per token in every full-attention layer, the MTP
 * head's draft cache included (the engine keeps one where the head has no recurrent layer), plus
 * the prefix cache's key per token; and, whatever the length, the Mamba layers' conv tails and SSM
 * states and the sliding-window rings. cn_ctx_plan_make is a pure function of the config and the
 * bytes that state may take, so a test can hand it any budget; cn_ctx_budget measures those bytes
 * for a loaded model on its backend. Neither allocates any state.
 *
 * Invariants:
 *  (1) Asked for a length (asked > 0), the plan is that length: the user's word is not lowered.
 *  (2) Otherwise ctx <= max_position_embeddings, and ctx < max_position_embeddings only when the
 *      budget is known and too small; then ctx is the most tokens that fit, rounded down to a
 *      multiple of CN_CTX_ROUND, and never below CN_CTX_MIN (nor above the maximum).
 */
#ifndef CN_CTX_PLAN_H
#define CN_CTX_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "cache/prefix_cache.h"
#include "model/config.h"
#include "model/model.h"

#define CN_CTX_UNKNOWN UINT64_MAX /* a budget nobody could measure: the plan is not lowered */
#define CN_CTX_MIN 512            /* fewer tokens would not hold a chat template and an answer */
#define CN_CTX_ROUND 256

typedef enum cn_ctx_why {
    CN_CTX_ASKED = 0, /* --ctx */
    CN_CTX_MAX_POS,   /* the config's max_position_embeddings */
    CN_CTX_MEMORY,    /* lowered to fit the budget */
} cn_ctx_why;

typedef struct cn_ctx_plan {
    int ctx;              /* tokens per sequence */
    cn_ctx_why why;
    int max_pos;          /* the config's max_position_embeddings */
    uint64_t per_token;   /* bytes of state each token adds */
    uint64_t fixed;       /* bytes of state whatever the length */
    uint64_t budget;      /* bytes the state may take, or CN_CTX_UNKNOWN */
} cn_ctx_plan;

/* Bytes of one sequence's state: *per_token for each token, *fixed whatever the length. */
void cn_ctx_state_bytes(const cn_config *c, uint64_t *per_token, uint64_t *fixed);
/* The plan for a config, a length asked for (0: none) and a budget in bytes (CN_CTX_UNKNOWN when
 * not measured). Returns 0, or CN_EINVAL for asked < 0 (out untouched). */
int cn_ctx_plan_make(const cn_config *c, int asked, uint64_t budget, cn_ctx_plan *out);
/* Bytes of state plan->ctx tokens take. */
uint64_t cn_ctx_plan_bytes(const cn_ctx_plan *p);
/* The bytes m's state may take on its backend with these cache options: a device's free memory
 * less the device tier's budget, or (computing in host memory) the host's available memory less
 * the weights (mapped, so they need room to stay resident) and the RAM tier's budget; both less
 * a sixteenth of the memory's size for scratch and everything else. CN_CTX_UNKNOWN when the
 * backend cannot tell. Never fails. */
uint64_t cn_ctx_budget(const cn_model *m, const cn_pc_opts *cache);
/* One line for people: "context 262144 tokens (max_position_embeddings), 3.0 KiB of state a
 * token, 768.0 MiB" (lowered: why, and the budget). Truncated to n bytes; returns buf. */
char *cn_ctx_plan_line(const cn_ctx_plan *p, char *buf, size_t n);

#endif
