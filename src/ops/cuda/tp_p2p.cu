/* tp_p2p.cu: a one-shot all-reduce of BF16 activations over the GPUs of one process through peer
 * memory (tp_p2p.h says the protocol). Owns each device's staging buffers, flags and epochs
 * (freed by lsc_p2p_close). Kernel: one thread block per chunk of P2P_CHUNK elements (at most
 * P2P_MAX_BLOCKS), each block with its own epoch and flags, so blocks never wait on each other.
 * Memory order: every thread fences its staging stores system-wide before the block barrier
 * after which one thread per peer writes the epoch into that peer's flag slot (a volatile store
 * over NVLink); the waiting threads spin on their own device's slots (volatile loads), and the
 * peers' staging is then read with ld.global.cv (never a stale cached line).
 */
#include "ops/cuda/cu_util.h"
#include "ops/cuda/tp_p2p.h"

#define P2P_MAX_RANKS 8
#define P2P_MAX_BLOCKS 64
#define P2P_CHUNK 8192 /* elements a block */
#define P2P_THREADS 256

struct lsc_p2p {
    int n;
    int dev[P2P_MAX_RANKS];
    size_t max_elems;
    bf16 *stage[P2P_MAX_RANKS];          /* [2][max_elems] on device r */
    unsigned *flags[P2P_MAX_RANKS];      /* [P2P_MAX_RANKS (source rank)][P2P_MAX_BLOCKS] on device r */
    unsigned *epoch[P2P_MAX_RANKS];      /* [P2P_MAX_BLOCKS] on device r */
};

typedef struct p2p_args {
    bf16 *stage[P2P_MAX_RANKS];
    unsigned *flags[P2P_MAX_RANKS];
    unsigned *epoch; /* this rank's */
    int n, rank;
    size_t max_elems;
} p2p_args;

/* 8 BF16 of a (fp32 accumulation) += the 8 in v */
__device__ __forceinline__ void acc8(float *a, uint4 v) {
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 f = __bfloat1622float2(h[k]);
        a[2 * k] += f.x;
        a[2 * k + 1] += f.y;
    }
}

/* vec: x 16-byte aligned and n_elems a multiple of 8: 16-byte loads and stores (one round trip
 * over NVLink brings 8 elements); else one element at a time. */
__global__ void __launch_bounds__(P2P_THREADS) p2p_allreduce_kernel(bf16 *x, int n_elems, int vec, p2p_args a) {
    const int b = blockIdx.x, t = threadIdx.x;
    const int i0 = b * P2P_CHUNK, i1 = min(n_elems, i0 + P2P_CHUNK);
    __shared__ unsigned ep;
    if (t == 0) ep = ++a.epoch[b];
    __syncthreads();
    const unsigned e = ep;
    const size_t buf = (size_t)(e & 1u) * a.max_elems;
    bf16 *mine = a.stage[a.rank] + buf;
    if (vec) {
        for (int i = i0 + 8 * t; i < i1; i += 8 * P2P_THREADS) *(uint4 *)(mine + i) = *(const uint4 *)(x + i);
    } else {
        for (int i = i0 + t; i < i1; i += P2P_THREADS) mine[i] = x[i];
    }
    __threadfence_system();
    __syncthreads();
    if (t < a.n && t != a.rank) { /* signal peer t: our chunk b of this call is staged */
        volatile unsigned *f = a.flags[t] + a.rank * P2P_MAX_BLOCKS + b;
        *f = e;
    }
    if (t < a.n && t != a.rank) { /* wait for peer t's chunk b */
        volatile unsigned *f = a.flags[a.rank] + t * P2P_MAX_BLOCKS + b;
        while ((int)(*f - e) < 0) {
        }
    }
    __syncthreads();
    __threadfence_system();
    if (vec) {
        for (int i = i0 + 8 * t; i < i1; i += 8 * P2P_THREADS) {
            uint4 v[P2P_MAX_RANKS];
#pragma unroll
            for (int r = 0; r < P2P_MAX_RANKS; r++) /* every load in flight before the sums */
                if (r < a.n) v[r] = r == a.rank ? *(const uint4 *)(a.stage[r] + buf + i)
                                                : __ldcv((const uint4 *)(a.stage[r] + buf + i));
            float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int r = 0; r < P2P_MAX_RANKS; r++)
                if (r < a.n) acc8(acc, v[r]); /* rank order: every rank sums alike */
            uint4 o;
            __nv_bfloat162 *h = (__nv_bfloat162 *)&o;
#pragma unroll
            for (int k = 0; k < 4; k++) h[k] = __floats2bfloat162_rn(acc[2 * k], acc[2 * k + 1]);
            *(uint4 *)(x + i) = o;
        }
        return;
    }
    for (int i = i0 + t; i < i1; i += P2P_THREADS) {
        float s = 0.f;
        for (int r = 0; r < a.n; r++) {
            const unsigned short *p = (const unsigned short *)(a.stage[r] + buf) + i;
            unsigned short v = r == a.rank ? *p : __ldcv(p);
            s += __bfloat162float(__ushort_as_bfloat16(v));
        }
        x[i] = __float2bfloat16(s);
    }
}

static void p2p_free_dev(lsc_p2p *p) {
    for (int r = 0; r < p->n; r++) {
        cudaSetDevice(p->dev[r]);
        if (p->stage[r]) cudaFree(p->stage[r]);
        if (p->flags[r]) cudaFree(p->flags[r]);
        if (p->epoch[r]) cudaFree(p->epoch[r]);
        p->stage[r] = NULL;
        p->flags[r] = NULL;
        p->epoch[r] = NULL;
    }
}

extern "C" int lsc_p2p_open(int n, const int *devs, size_t max_elems, lsc_p2p **out, ls_err *e) {
    *out = NULL;
    if (n < 2 || n > P2P_MAX_RANKS) return errf(e, ERR_UNSUPPORTED, "peer all-reduce: %d ranks (2..%d)", n, P2P_MAX_RANKS);
    if (max_elems > (size_t)P2P_MAX_BLOCKS * P2P_CHUNK) max_elems = (size_t)P2P_MAX_BLOCKS * P2P_CHUNK;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            if (i == j) continue;
            int can = 0;
            CU_TRY(e, cudaDeviceCanAccessPeer(&can, devs[i], devs[j]), "cudaDeviceCanAccessPeer");
            if (!can) return errf(e, ERR_UNSUPPORTED, "peer all-reduce: GPU %d cannot access GPU %d's memory", devs[i], devs[j]);
        }
    lsc_p2p *p = (lsc_p2p *)calloc(1, sizeof *p);
    p->n = n;
    p->max_elems = max_elems;
    int rc = 0;
    for (int r = 0; r < n && !rc; r++) {
        p->dev[r] = devs[r];
        cudaError_t c = cudaSetDevice(devs[r]);
        for (int j = 0; j < n && c == cudaSuccess; j++) {
            if (j == r) continue;
            c = cudaDeviceEnablePeerAccess(devs[j], 0);
            if (c == cudaErrorPeerAccessAlreadyEnabled) {
                cudaGetLastError();
                c = cudaSuccess;
            }
        }
        if (c == cudaSuccess) c = cudaMalloc(&p->stage[r], 2 * max_elems * sizeof(bf16));
        if (c == cudaSuccess) c = cudaMalloc(&p->flags[r], P2P_MAX_RANKS * P2P_MAX_BLOCKS * sizeof(unsigned));
        if (c == cudaSuccess) c = cudaMalloc(&p->epoch[r], P2P_MAX_BLOCKS * sizeof(unsigned));
        if (c == cudaSuccess) c = cudaMemset(p->flags[r], 0, P2P_MAX_RANKS * P2P_MAX_BLOCKS * sizeof(unsigned));
        if (c == cudaSuccess) c = cudaMemset(p->epoch[r], 0, P2P_MAX_BLOCKS * sizeof(unsigned));
        if (c == cudaSuccess) c = cudaDeviceSynchronize();
        if (c != cudaSuccess) rc = cu_fail(e, c, "peer all-reduce: set-up");
    }
    if (rc) {
        p2p_free_dev(p);
        free(p);
        cudaSetDevice(devs[0]);
        return rc;
    }
    cudaSetDevice(devs[0]);
    *out = p;
    return 0;
}

extern "C" size_t lsc_p2p_max_elems(const lsc_p2p *p) { return p ? p->max_elems : 0; }

extern "C" int lsc_p2p_allreduce(lsc_p2p *p, int rank, void *x, size_t n_elems, ls_stream s, ls_err *e) {
    if (!n_elems) return 0;
    if (n_elems > p->max_elems || rank < 0 || rank >= p->n)
        return errf(e, ERR_INVAL, "peer all-reduce: %zu elements on rank %d (at most %zu, %d ranks)", n_elems, rank,
                    p->max_elems, p->n);
    p2p_args a;
    memset(&a, 0, sizeof a);
    for (int r = 0; r < p->n; r++) {
        a.stage[r] = p->stage[r];
        a.flags[r] = p->flags[r];
    }
    a.epoch = p->epoch[rank];
    a.n = p->n;
    a.rank = rank;
    a.max_elems = p->max_elems;
    const int blocks = (int)((n_elems + P2P_CHUNK - 1) / P2P_CHUNK);
    const int vec = n_elems % 8 == 0 && ((uintptr_t)x & 15) == 0;
    p2p_allreduce_kernel<<<blocks, P2P_THREADS, 0, (cudaStream_t)s>>>((bf16 *)x, (int)n_elems, vec, a);
    CU_LAUNCHED(e, "peer all-reduce");
    return 0;
}

extern "C" void lsc_p2p_close(lsc_p2p *p) {
    if (!p) return;
    int cur = 0;
    cudaGetDevice(&cur);
    p2p_free_dev(p);
    cudaSetDevice(cur);
    free(p);
}
