/* main.c: dispatches `laststand <command> [flags]` to src/cli/cmd_<command>.c. */
#include "cli/cli.h"
#include "base/base.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} cmds[] = {
    {"serve", cmd_serve, "OpenAI-compatible server"},
    {"logits", cmd_logits, "one forward pass, logits of every position as JSON"},
    {"generate", cmd_generate, "greedy or sampled generation through the KV cache"},
    {"tokenize", cmd_tokenize, "encode text with the model's tokenizer.json"},
    {"detokenize", cmd_detokenize, "decode ids"},
    {"chat-template", cmd_chat_template, "render the model's chat template"},
    {"doctor", cmd_doctor, "find the last backend standing"},
    {"bench", cmd_bench, "serving benchmark against any OpenAI-compatible server"},
    {"sweep", cmd_sweep, "launch a server per grid point, smoke-test, bench"},
    {"synth", cmd_synth, "write a random-weight checkpoint of a real architecture"},
    {"quantize", cmd_quantize, "BF16 -> NVFP4 (ModelOpt layout)"},
    {"grammar", cmd_grammar, "constrained decoding: token masks of a JSON Schema (tests, bench)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: laststand <command> [flags]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        fprintf(f, "  %-14s %s\n", cmds[i].name, cmds[i].help);
    fprintf(f, "\n`laststand <command> --help` lists a command's flags.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(argv[1], cmds[i].name)) return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "laststand: error: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
