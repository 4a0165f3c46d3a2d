/* cutrace.c: a CUDA injection library that writes every kernel the process runs, CUDA graph
 * nodes included, as one CSV line (start ns, duration ns, grid, block, graph id, name): the GPU
 * timeline nsys would show, for GPU machines without nsys. A benchmark tool, not part of laststand.
 *
 *   gcc -shared -fPIC -O2 -I$CUDA/include bench/tools/cutrace.c -L$CUDA/lib64 -lcupti \
 *       -Wl,-rpath,'$ORIGIN' -o libcutrace.so        (libcupti.so.13 beside it or on the path)
 *   CUDA_INJECTION64_PATH=/abs/libcutrace.so LS_CUTRACE_OUT=trace.csv ./program ...
 *
 * The driver calls InitializeInjection at CUDA initialisation; CUPTI's activity API
 * (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, which does not serialize kernels) hands completed
 * buffers to buffer_done; the rest is flushed at exit. LS_CUTRACE_SKIP=N drops the first N
 * kernels (start-up), LS_CUTRACE_MAX=N keeps at most N. */
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define BUF_SIZE (8u << 20)

static FILE *out;
static unsigned long long seen, skip, keep = ~0ull;

static void CUPTIAPI buffer_request(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, BUF_SIZE);
    *size = *buffer ? BUF_SIZE : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_done(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    CUpti_Activity *r = NULL;
    while (out && cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && r->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
        seen++;
        if (seen <= skip || seen - skip > keep) continue;
        fprintf(out, "%llu,%llu,%d,%d,%d,%d,%u,%u,%s\n", (unsigned long long)k->start,
                (unsigned long long)(k->end - k->start), k->gridX, k->gridY, k->gridZ, k->blockX, k->graphId,
                k->streamId, k->name ? k->name : "?");
    }
    free(buffer);
}

static void flush_at_exit(void) {
    cuptiActivityFlushAll(1);
    if (out) fclose(out);
    out = NULL;
}

int InitializeInjection(void) {
    const char *path = getenv("LS_CUTRACE_OUT");
    if (!path) path = "cutrace.csv";
    if (getenv("LS_CUTRACE_SKIP")) skip = strtoull(getenv("LS_CUTRACE_SKIP"), NULL, 10);
    if (getenv("LS_CUTRACE_MAX")) keep = strtoull(getenv("LS_CUTRACE_MAX"), NULL, 10);
    out = fopen(path, "w");
    if (!out) {
        fprintf(stderr, "cutrace: cannot write %s\n", path);
        return 1;
    }
    fprintf(out, "start_ns,dur_ns,gx,gy,gz,bx,graph,stream,name\n");
    if (cuptiActivityRegisterCallbacks(buffer_request, buffer_done) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "cutrace: CUPTI activity API refused\n");
        return 1;
    }
    atexit(flush_at_exit);
    return 1;
}
