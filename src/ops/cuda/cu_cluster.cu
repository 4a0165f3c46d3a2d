/* cu_cluster.cu: cu_cluster.h (the cluster-GEMV launch helpers of gemv.cu and fp8_gemm.cu). */
#include "ops/cuda/cu_cluster.h"

#include <pthread.h>
#include <string.h>

enum { CC_MAX_DEV = 16, CC_FNS = 32, CC_OCC = 256 };

typedef struct cc_occ {
    const void *fn;
    int dev, S;
    size_t smem;
    int groups;
} cc_occ;

static pthread_mutex_t cc_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    const void *fn;
    int dev;
} cc_attr[CC_FNS]; /* (fn, device) pairs whose shared memory limit is raised: a function
                      attribute applies to the current device only (tensor-parallel ranks run
                      on other GPUs) */
static int cc_n_attr;
static cc_occ cc_cache[CC_OCC];
static int cc_n_occ;

void cu_cluster_config(cudaLaunchConfig_t *cfg, cudaLaunchAttribute *at, int S, int G, int threads, size_t smem,
                       cudaStream_t st) {
    memset(cfg, 0, sizeof *cfg);
    cfg->gridDim = dim3(S, G, 1);
    cfg->blockDim = dim3(threads, 1, 1);
    cfg->dynamicSmemBytes = smem;
    cfg->stream = st;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = S;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg->attrs = at;
    cfg->numAttrs = 1;
}

int cu_cluster_resident(const void *fn, int threads, int S, size_t smem, size_t smem_attr, int n_sm, const char *who,
                        ls_err *e) {
    int dev = 0;
    cudaError_t c = cudaGetDevice(&dev);
    if (c != cudaSuccess) return cu_fail(e, c, who);
    if (dev < 0 || dev >= CC_MAX_DEV)
        return errf(e, ERR_UNSUPPORTED, "%s: device %d out of range (at most %d devices)", who, dev, CC_MAX_DEV);
    int groups = 0, raised = 0;
    const char *what = "cudaFuncSetAttribute";
    pthread_mutex_lock(&cc_mu);
    for (int i = 0; i < cc_n_occ && !groups; i++)
        if (cc_cache[i].fn == fn && cc_cache[i].dev == dev && cc_cache[i].S == S && cc_cache[i].smem == smem)
            groups = cc_cache[i].groups;
    for (int i = 0; i < cc_n_attr && !raised; i++) raised = cc_attr[i].fn == fn && cc_attr[i].dev == dev;
    if (!raised) {
        c = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_attr);
        if (c == cudaSuccess && cc_n_attr < CC_FNS) {
            cc_attr[cc_n_attr].fn = fn;
            cc_attr[cc_n_attr].dev = dev;
            cc_n_attr++;
        }
    }
    if (!groups && c == cudaSuccess) {
        if (S == 1) {
            int bps = 0;
            what = "cudaOccupancyMaxActiveBlocksPerMultiprocessor";
            c = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, fn, threads, smem);
            groups = bps * n_sm;
        } else {
            cudaLaunchConfig_t cfg;
            cudaLaunchAttribute at[1];
            cu_cluster_config(&cfg, at, S, 1, threads, smem, 0);
            what = "cudaOccupancyMaxActiveClusters";
            c = cudaOccupancyMaxActiveClusters(&groups, fn, &cfg);
        }
        if (c == cudaSuccess && groups > 0 && cc_n_occ < CC_OCC) cc_cache[cc_n_occ++] = (cc_occ){fn, dev, S, smem, groups};
    }
    pthread_mutex_unlock(&cc_mu);
    if (c != cudaSuccess) {
        char w[160];
        snprintf(w, sizeof w, "%s: %s", who, what);
        return cu_fail(e, c, w);
    }
    if (groups <= 0)
        return errf(e, ERR_UNSUPPORTED, "%s: no cluster of %d blocks with %zu B of shared memory fits", who, S, smem);
    return groups;
}
