/* synth.h: random-weight checkpoints with the exact shapes and tensor layout
 * of real architectures (reference/qwen35-and-nvfp4.md section 1.2).
 *
 * Presets: demo, qwen3.5-397b-a17b, qwen3.5-122b-a10b, qwen3.5-35b-a3b,
 * qwen3-next-80b-a3b, qwen3-30b-a3b. The same (preset, layers, seed, quant)
 * always gives the same weights, whether written to disk or built in memory.
 */
#ifndef LS_SYNTH_H
#define LS_SYNTH_H

#include "base/base.h"
#include "fmt/safetensors.h"
#include <jansson.h>

typedef struct synth_opts {
    const char *preset;
    int layers;        /* <= 0: the preset's own count */
    uint64_t seed;     /* default 0 */
    const char *quant; /* "nvfp4" | "nvfp4-fp8" (ModelOpt MIXED_PRECISION: attention, GDN and shared
                          expert FP8 with a per-tensor scale, experts NVFP4) | "bf16" | NULL (preset default: nvfp4
                          for qwen3.5 presets, bf16 otherwise... see synth.c) */
    /* mtp=chain (tests, benchmarks): the hybrids' MTP head made a function of the next token
     * alone: its attention output, expert and shared-expert down projections zero, mtp.fc the
     * identity on the embedding half. Its draft after token t is then always the same token
     * f(t) (the argmax of lm_head · mtp.norm(pre_fc_norm_embedding(embed(t)))), so a forced
     * output that follows f drafts what it emits: speculative decoding with a chosen acceptance.
     * mtp=random (default): every tensor random as the others. */
    int mtp_chain;
} synth_opts;

/* Parse "NAME[,layers=N][,seed=S][,quant=Q][,mtp=random|chain]" (the part after "synth:"). */
int synth_parse_spec(const char *spec, synth_opts *o, ls_err *e);
/* Build the checkpoint in memory: the tensors and the config.json object
 * (as it would be written; includes quantization_config for nvfp4). */
int synth_build(const synth_opts *o, st_set **weights, json_t **config, ls_err *e);
/* (additive) Only the config.json object synth_build would give (no weights): cheap,
 * for a caller that must know the layer count and kinds before building. */
int synth_config(const synth_opts *o, json_t **config, ls_err *e);
/* Write the checkpoint folder: config.json, model.safetensors(.index.json),
 * hf_quant_config.json (nvfp4), generation_config.json, and for the demo
 * preset tokenizer.json, tokenizer_config.json and chat_template.jinja. */
int synth_write(const synth_opts *o, const char *out_dir, ls_err *e);

/* (additive) A checkpoint generated on demand, one part at a time, so a model far larger than
 * host memory can be loaded part by part (model.c): part -1 holds every tensor outside the
 * layers (embedding, final norm, lm_head), part l (0 <= l < layers) layer l's. A part's bytes
 * are exactly synth_build's (each tensor is seeded by (seed, name, block)), however often and in
 * whatever order it is built. config: the config.json object synth_build would give (NULL: not
 * wanted). */
typedef struct synth_src synth_src;
int synth_open(const synth_opts *o, synth_src **out, json_t **config, ls_err *e);
int synth_src_layers(const synth_src *s);
/* Every tensor's name, dtype, shape and bytes (data NULL), i in [0, synth_src_count). */
int synth_src_count(const synth_src *s);
void synth_src_info(const synth_src *s, int i, st_tensor *out);
/* The part's bytes (0 for a part that does not exist). Parts: -1 the non-layer tensors, 0 ..
 * synth_src_layers - 1 the layers, and for the hybrid presets part synth_src_layers: the MTP head
 * (mtp.*, config mtp_num_hidden_layers / num_nextn_predict_layers 1). */
size_t synth_src_part_bytes(const synth_src *s, int part);
/* The part's tensors, generated now, as a new in-memory set the caller closes; ERR_NOMEM (nothing
 * left allocated) when they do not fit in memory. A layer's tensors live in one buffer s reuses
 * for every layer (so loading layer after layer touches no fresh memory): its set is valid until
 * the next synth_src_part or synth_src_close; part -1's set owns its tensors. */
int synth_src_part(synth_src *s, int part, st_set **out, ls_err *e);
void synth_src_close(synth_src *s);

#endif
