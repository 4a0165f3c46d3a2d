/* tp_p2p.h: the C surface of a one-shot all-reduce over the GPUs of one process through peer
 * (NVLink) memory (tp_p2p.cu), for src/model/model_tp.c's small all-reduces (decode steps), in
 * CUDA builds only (LS_HAVE_CUDA). Opt-in: LASTSTAND_TP_P2P=1 (model_tp.c); NCCL stays the
 * default and takes every all-reduce larger than lsc_p2p_max_elems.
 *
 * Each rank copies its x into its own staging buffer (one of two, alternating call by call),
 * signals every peer by writing the call's epoch into the peer's flag slot (per thread block),
 * waits for every peer's signal, then sums the ranks' staging buffers in rank order (fp32
 * accumulation, so every rank gets bit-identical results) into x. One barrier a call: a rank
 * reuses a staging buffer two calls later, after the peers' signal of the call in between, which
 * they give only once the call that read it has finished (stream order). Every rank must make
 * the same sequence of calls (same sizes), as with NCCL; the calls may be captured in CUDA graphs
 * (the epochs live in device memory). Every function returns 0 or a negative ERR_* with e filled.
 */
#ifndef LS_CUDA_TP_P2P_H
#define LS_CUDA_TP_P2P_H

#include "ops/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lsc_p2p lsc_p2p;

/* Peer access between every pair of devs[0..n) (ERR_UNSUPPORTED when a pair has none), and on
 * each device its staging buffers (2 x max_elems BF16), flags and epochs. Leaves the calling
 * thread on devs[0]. */
int lsc_p2p_open(int n, const int *devs, size_t max_elems, lsc_p2p **out, ls_err *e);
size_t lsc_p2p_max_elems(const lsc_p2p *p);
/* x [n_elems] BF16 on rank's device (the calling thread bound to it) = the sum over the ranks,
 * ordered on stream s. n_elems <= lsc_p2p_max_elems. */
int lsc_p2p_allreduce(lsc_p2p *p, int rank, void *x, size_t n_elems, ls_stream s, ls_err *e);
void lsc_p2p_close(lsc_p2p *p);

#ifdef __cplusplus
}
#endif

#endif
