/* main.c - the `cairn` command: dispatches to one subcommand per file in src/cli/. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cn_commit.h" /* CN_COMMIT, written at build time (cmake/commit.cmake) */
#include "server/info.h"

static void usage(FILE *f) {
    fputs("usage: cairn <command> [options]\n"
          "\n"
          "commands:\n"
          "  generate    generate tokens from a model\n"
          "  logits      write all-position logits of a token sequence\n"
          "  make-model  write a synthetic NemotronH checkpoint\n"
          "  info        describe a model directory\n"
          "  serve       serve the Ollama, OpenAI and Anthropic HTTP APIs\n"
          "  run         chat with a model in the terminal (one PROMPT, or interactive)\n"
          "  parse       split generated text into thinking, content and tool calls\n"
          "  render      write the prompt of a chat request (JSON on stdin)\n"
          "  tokenize    text to token ids (tokenizer.json)\n"
          "  detokenize  token ids to text\n"
          "  bench       speed measurements (bench tokenizer)\n"
          "  cache       list the restore points a cache directory holds\n"
          "  quantize    write an NVFP4, MXFP8 or FP8 copy of a BF16/F32 checkpoint\n"
          "\n"
          "Run `cairn <command> --help` for the options of one command;\n"
          "`cairn --version` prints the version and the commit it was built from.\n",
          f);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V") || !strcmp(cmd, "version")) {
        printf("cairn %s (commit %s)\n", CN_VERSION, CN_COMMIT);
        return 0;
    }
    for (const cn_cli_command *c = cn_cli_commands; c->name; c++)
        if (!strcmp(cmd, c->name)) return c->run(argc - 1, argv + 1);
    fprintf(stderr, "cairn: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
