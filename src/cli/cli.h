/* cli.h: the subcommands of build/laststand (DESIGN.md section 2).
 * Each lives in its own file src/cli/cmd_<name>.c and returns the exit code:
 * 0 success, 1 runtime failure, 2 bad input. JSON goes to stdout, text to stderr. */
#ifndef LS_CLI_H
#define LS_CLI_H

int cmd_serve(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_chat_template(int argc, char **argv);
int cmd_doctor(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_sweep(int argc, char **argv);
int cmd_grammar(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_quantize(int argc, char **argv);

#endif
