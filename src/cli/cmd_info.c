/* cmd_info.c - `cairn info`: layers by type, parameters, bytes by dtype, memory needed. */
#include <stdio.h>

#include "cli/cli.h"
#include "cli/cli_util.h"
#include "cli/flags.h"
#include "engine/ctx_plan.h"
#include "tensor/backend.h"

static void human(char *buf, size_t n, double bytes) {
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024 && u < 4) {
        bytes /= 1024;
        u++;
    }
    snprintf(buf, n, u ? "%.2f %s" : "%.0f %s", bytes, unit[u]);
}

int cn_cmd_info(int argc, char **argv) {
    const char *model = NULL, *backend = NULL;
    int ctx = 0;
    uint64_t cache_ram = 0, cache_gpu = CN_CLI_UNSET;
    cn_flag flags[] = {
        {"model", CN_FLAG_STR, &model, "DIR", "model directory", 1, 0},
        {"backend", CN_FLAG_STR, &backend, "NAME", "cpu, cuda or cuda:N (default: $CAIRN_BACKEND or cpu)", 0, 0},
        {"ctx", CN_FLAG_INT, &ctx, "N", "context length for the memory estimate (default: as serve plans it)", 0, 0},
        {"cache-ram", CN_FLAG_SIZE, &cache_ram, "SIZE", "host RAM for restore points, as serve's (default 4G)", 0, 0},
        {"cache-gpu", CN_FLAG_SIZE, &cache_gpu, "SIZE", CN_CLI_CACHE_GPU_HELP, 0, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int rc = cn_flags_parse(flags, argc, argv, "info --model DIR [--ctx N] [--cache-ram SIZE] [--backend NAME]");
    if (rc) return rc > 0 ? 0 : 2;
    if (ctx < 0 || (flags[2].seen && ctx == 0)) {
        fprintf(stderr, "cairn: --ctx must be positive\n");
        return 2;
    }
    cn_backend *b;
    cn_model *m;
    if (cn_cli_open_model(model, backend, 1, 1, &b, &m)) return 1;
    const cn_config *c = cn_model_config(m);
    cn_model_stats st;
    cn_model_stats_get(m, &st);
    /* the plan serve and run make (ctx_plan.h), so the estimate is theirs */
    cn_pc_opts cache = {.ram_budget = cache_ram, .dev_budget = cn_cli_dev_budget(cache_gpu, b)};
    cn_ctx_plan plan;
    if (cn_ctx_plan_make(c, ctx, cn_ctx_budget(m, &cache), &plan)) {
        cn_cli_close_model(b, m);
        return 2;
    }
    ctx = plan.ctx;
    char h1[32], h2[32], h3[32], line[400];
    printf("model:       %s (%s)\n", model, c->model_type);
    printf("backend:     %s\n", cn_backend_name(b));
    printf("layers:      %d  (%s)\n", c->n_layers, c->layers);
    printf("  mamba %d, attention %d, moe %d, mlp %d\n", cn_config_count(c, CN_BLOCK_MAMBA),
           cn_config_count(c, CN_BLOCK_ATTN), cn_config_count(c, CN_BLOCK_MOE),
           cn_config_count(c, CN_BLOCK_MLP));
    if (cn_config_count(c, CN_BLOCK_SWA))
        printf("  sliding-window attention %d (window %d)\n", cn_config_count(c, CN_BLOCK_SWA),
               c->sliding_window);
    printf("mtp:         %s\n", cn_model_has_mtp(m) ? c->mtp_layers : "none");
    printf("hidden:      %d, vocab %d\n", c->hidden_size, c->vocab_size);
    printf("parameters:  %llu (%.2fB), active per token %llu, mtp %llu\n",
           (unsigned long long)st.params, st.params / 1e9, (unsigned long long)st.active_params,
           (unsigned long long)st.params_mtp);
    uint64_t total = 0;
    for (int d = 0; d < CN_DTYPE_COUNT; d++) {
        if (!st.bytes[d]) continue;
        human(h1, sizeof h1, (double)st.bytes[d]);
        printf("  %-8s %s\n", cn_dtype_name((cn_dtype)d), h1);
        total += st.bytes[d];
    }
    human(h1, sizeof h1, (double)total);
    human(h2, sizeof h2, (double)cn_ctx_plan_bytes(&plan));
    human(h3, sizeof h3, (double)total + (double)cn_ctx_plan_bytes(&plan));
    printf("weights:     %s (memory-mapped)\n", h1);
    printf("plan:        %s\n", cn_ctx_plan_line(&plan, line, sizeof line));
    printf("state:       %s per sequence at %d tokens (%llu B/token + %llu B recurrent)\n", h2, ctx,
           (unsigned long long)plan.per_token, (unsigned long long)plan.fixed);
    printf("memory:      %s needed at %d tokens\n", h3, ctx);
    cn_cli_close_model(b, m);
    return 0;
}
