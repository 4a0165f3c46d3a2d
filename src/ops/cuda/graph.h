/* graph.h: the C surface of the CUDA graph helpers (graph.cu), device-side
 * sampling (sample.cu) and attention's device planning (attention.cu), for
 * src/model (which includes it only in CUDA builds, LS_HAVE_CUDA).
 *
 * A graph is captured from the forward pass's own stream (thread-local
 * capture mode: another thread's CUDA calls are not disturbed), instantiated
 * once and replayed with one launch. Every function returns 0 or a negative
 * ERR_* with e filled.
 */
#ifndef LS_CUDA_GRAPH_H
#define LS_CUDA_GRAPH_H

#include "ops/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Start capturing stream s. */
int cug_begin(ls_stream s, ls_err *e);
/* Stop capturing s. ok: instantiate the recording into *exec; !ok (the pass
 * failed): discard it and clear the error state, *exec = NULL. A capture that
 * the runtime invalidated is ERR_UNSUPPORTED with the runtime's reason. */
int cug_end(ls_stream s, int ok, void **exec, ls_err *e);
/* A stream of the model's own for capture (the legacy default stream cannot
 * be captured). Created blocking: it still orders with work that other code
 * puts on the legacy stream, as the model's eager passes always did. */
int cug_stream_new(ls_stream *s, ls_err *e);
void cug_stream_free(ls_stream s);
/* Replay on s. */
int cug_launch(void *exec, ls_stream s, ls_err *e);
void cug_destroy(void *exec);

/* Device scratch that cuda_flash_decode / cuda_naive need under device
 * planning (attn_args.ctx_cap > 0) for n_tok tokens (the current device). */
size_t attn_cuda_scratch_bytes(int n_tok, int n_heads, int n_kv_heads, int head_dim, int ctx_cap);

/* The sampler on CUDA (sample.cu): sample_cuda is the engine's (the form LASTSTAND_SAMPLE_WIDE
 * picks); the forms by name, for tests and timing. */
extern const sample_impl sample_cuda;
extern const sample_impl sample_cuda_block; /* one block a row (the radix descent) */
extern const sample_impl sample_cuda_wide;  /* a cluster a row, as LASTSTAND_SAMPLE_LB / _SM pick (both on) */
extern const sample_impl sample_cuda_fast;  /* a cluster a row, wide-digit top_k / top_p, the row in global memory */
extern const sample_impl sample_cuda_fast_lb; /* the same, top_k / top logprobs bounded by the widen's warp maxima */
extern const sample_impl sample_cuda_fast_sm; /* each block's share of the row in its shared memory (else an error) */
extern const sample_impl sample_cuda_fast_smlb; /* the same, with the bound */
/* (test-only) One launch of sample_cuda_fast_sm (lb: _smlb) with rank 0's phase stamps (clock64 of
 * its SM, sample.cu SMS_STAMP: start, widen, edits / max / Z, top_k, top_p, draw sums, pick, Z,
 * top logprobs, end; 0 = not reached) in stamps[0 .. n); synchronises s. The stamps written, or
 * < 0. */
int sample_cuda_profile(const sample_args *a, ls_stream s, int lb, long long *stamps, int n, ls_err *e);

#ifdef __cplusplus
}
#endif
#endif
