/* demo_tok.h: the demo model's tokenizer files, generated from code in the
 * repository (no download, nothing from ../shared): a byte-level BPE whose
 * merges are learned at synth time from an embedded sample text, the Qwen3.5
 * added tokens, tokenizer_config.json and a Qwen3.5-behaviour chat template.
 * Private to src/model (synth.c). */
#ifndef LS_DEMO_TOK_H
#define LS_DEMO_TOK_H

#include "base/base.h"
#include <stdint.h>

/* Total vocabulary: 256 bytes + learned merges + 33 added tokens. */
#define DEMO_TOK_VOCAB 4096

extern const char demo_tok_corpus[];

int demo_tok_vocab_size(void);
/* Id of an added token ("<|im_end|>", ...); -1 if it is not one. */
int32_t demo_tok_id(const char *content);
/* Write tokenizer.json, tokenizer_config.json and chat_template.jinja into dir. */
int demo_tok_write(const char *dir, ls_err *e);

#endif
