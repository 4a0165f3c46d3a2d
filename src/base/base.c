/* base.c: errors, logging, memory helpers, buffers, arena, time, numbers.
 *
 * Owns: the log level. Everything else here is stateless.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "base.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <signal.h>

/* ---- errors ------------------------------------------------------------ */

int errf(ls_err *e, int code, const char *fmt, ...) {
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
        e->code = code;
    }
    return code;
}

int err_prefix(ls_err *e, const char *fmt, ...) {
    if (!e) return ERR_RUNTIME;
    char pre[512], old[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    /* Truncation is intended: the old message keeps what fits after "pre: " (pre < 512 chars,
     * so at least 510 of it). The precision makes that explicit; the output is unchanged. */
    int room = (int)(sizeof e->msg - 1 - strlen(pre) - 2);
    snprintf(e->msg, sizeof e->msg, "%s: %.*s", pre, room, old);
    return e->code;
}

int err_exit_code(int code) { return code == ERR_INVAL ? 2 : 1; }

void die(int exit_code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("laststand: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(exit_code);
}

void check_failed(const char *file, int line, const char *expr) {
    fprintf(stderr, "laststand: CHECK failed at %s:%d: %s\n", file, line, expr);
    abort();
}

/* ---- logging ----------------------------------------------------------- */

static int g_log_level = LOG_INFO;
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;

void log_set_level(int level) { g_log_level = level; }

int log_parse_level(const char *s) {
    if (!strcmp(s, "debug")) return LOG_DEBUG;
    if (!strcmp(s, "info")) return LOG_INFO;
    if (!strcmp(s, "warning") || !strcmp(s, "warn")) return LOG_WARN;
    if (!strcmp(s, "error")) return LOG_ERROR;
    return -1;
}

void log_msg(int level, const char *fmt, ...) {
    if (level < g_log_level) return;
    static const char *names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&g_log_mu);
    fprintf(stderr, "[%02d:%02d:%02d.%03ld %s] ", tm.tm_hour, tm.tm_min, tm.tm_sec,
            ts.tv_nsec / 1000000, names[level < 0 ? 0 : level > 3 ? 3 : level]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    pthread_mutex_unlock(&g_log_mu);
    va_end(ap);
}

/* ---- memory ------------------------------------------------------------ */

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die(1, "out of memory allocating %zu bytes", n);
    return p;
}
void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) die(1, "out of memory allocating %zu x %zu bytes", n, sz);
    return p;
}
void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) die(1, "out of memory reallocating %zu bytes", n);
    return q;
}
char *xstrdup(const char *s) {
    size_t n = strlen(s);
    char *p = xmalloc(n + 1);
    memcpy(p, s, n + 1);
    return p;
}

void buf_init(buf *b) { b->data = NULL; b->len = b->cap = 0; }
void buf_free(buf *b) { free(b->data); buf_init(b); }
void buf_reserve(buf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    b->data = xrealloc(b->data, cap);
    b->cap = cap;
}
void buf_append(buf *b, const void *p, size_t n) {
    buf_reserve(b, n);
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
}
void buf_puts(buf *b, const char *s) { buf_append(b, s, strlen(s)); }
void buf_putc(buf *b, char c) { buf_append(b, &c, 1); }
void buf_vprintf(buf *b, const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) return;
    buf_reserve(b, (size_t)n);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
}
void buf_printf(buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    buf_vprintf(b, fmt, ap);
    va_end(ap);
}
char *buf_detach(buf *b) {
    if (!b->data) buf_reserve(b, 0), b->data[0] = 0;
    char *p = b->data;
    buf_init(b);
    return p;
}

/* ---- arena ------------------------------------------------------------- */

typedef struct arena_block {
    struct arena_block *next;
    size_t used, size;
    _Alignas(16) unsigned char data[];
} arena_block;

struct arena {
    arena_block *head;
    size_t block;
};

arena *arena_new(size_t block) {
    arena *a = xcalloc(1, sizeof *a);
    a->block = block ? block : 64 * 1024;
    return a;
}

void *arena_alloc(arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->used + n > a->head->size) {
        size_t sz = n > a->block ? n : a->block;
        arena_block *b = xmalloc(sizeof *b + sz);
        b->next = a->head;
        b->used = 0;
        b->size = sz;
        a->head = b;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += n;
    memset(p, 0, n);
    return p;
}

char *arena_strndup(arena *a, const char *s, size_t n) {
    char *p = arena_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}
char *arena_strdup(arena *a, const char *s) { return arena_strndup(a, s, strlen(s)); }

void arena_free(arena *a) {
    if (!a) return;
    arena_block *b = a->head;
    while (b) {
        arena_block *n = b->next;
        free(b);
        b = n;
    }
    free(a);
}

/* ---- time -------------------------------------------------------------- */

double now_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- numbers ----------------------------------------------------------- */

float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0) {
        if (m == 0) u = s;
        else { /* subnormal */
            float f = ldexpf((float)m, -24);
            return s ? -f : f;
        }
    } else if (e == 31) u = s | 0x7f800000u | (m << 13);
    else u = s | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t s = (u >> 16) & 0x8000;
    if (isnan(f)) return (uint16_t)(s | 0x7e00);
    float a = fabsf(f);
    if (a >= 65520.0f) return (uint16_t)(s | 0x7c00);
    if (a < 6.103515625e-05f) { /* subnormal: multiples of 2^-24 */
        uint32_t m = (uint32_t)lrintf(a * 16777216.0f);
        return (uint16_t)(s | m);
    }
    int e;
    float fr = frexpf(a, &e); /* a = fr * 2^e, fr in [0.5,1) */
    uint32_t m = (uint32_t)lrintf((fr * 2.0f - 1.0f) * 1024.0f);
    int ee = e - 1 + 15;
    if (m == 1024) { m = 0; ee++; }
    if (ee >= 31) return (uint16_t)(s | 0x7c00);
    return (uint16_t)(s | ((uint32_t)ee << 10) | m);
}

float fp8_e4m3_to_f32(uint8_t v) {
    int s = v >> 7, e = (v >> 3) & 0xf, m = v & 7;
    if (e == 15 && m == 7) return NAN;
    float f = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + m / 8.0f, e - 7);
    return s ? -f : f;
}

uint8_t f32_to_fp8_e4m3(float f) {
    if (isnan(f)) return 0x7f;
    const uint8_t s = signbit(f) ? 0x80 : 0;
    const float a = fabsf(f);
    if (!(a < 448.0f)) return s | 0x7e;
    if (a < 0x1p-6f) return s | (uint8_t)lrintf(a * 512.0f); /* subnormals: k·2^-9; k = 8 is 2^-6 */
    int ex;
    const float m = frexpf(a, &ex); /* a = m·2^ex, m in [0.5, 1) */
    int q = (int)lrintf(m * 16.0f); /* 8..16 = the significand with 3 fraction bits, times 8 */
    if (q == 16) q = 8, ex++;
    const int be = ex + 6;          /* biased exponent (bias 7) of (q / 8)·2^(ex - 1) */
    if (be > 15 || (be == 15 && q > 14)) return s | 0x7e;
    return s | (uint8_t)((be << 3) | (q - 8)); /* lrintf ties to even q, i.e. to the even code */
}

float fp8_e5m2_to_f32(uint8_t v) {
    uint16_t h = (uint16_t)v << 8;
    return f16_to_f32(h);
}

const float E2M1_LUT[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                            -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

int parse_int_list(const char *s, int32_t **out) {
    *out = NULL;
    if (!s) return -1;
    int n = 0, cap = 16;
    int32_t *v = xmalloc(sizeof(int32_t) * cap);
    const char *p = s;
    while (*p == ' ') p++;
    if (!*p) { *out = v; return 0; }
    for (;;) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < INT32_MIN || x > INT32_MAX) { free(v); return -1; }
        if (n == cap) v = xrealloc(v, sizeof(int32_t) * (cap *= 2));
        v[n++] = (int32_t)x;
        p = end;
        while (*p == ' ') p++;
        if (!*p) break;
        if (*p != ',') { free(v); return -1; }
        p++;
    }
    *out = v;
    return n;
}

char *read_file(const char *path, size_t *len, ls_err *e) {
    FILE *f = fopen(path, "rb");
    if (!f) { errf(e, errno == ENOENT ? ERR_INVAL : ERR_IO, "%s: %s", path, strerror(errno)); return NULL; }
    buf b;
    buf_init(&b);
    char tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) buf_append(&b, tmp, n);
    int bad = ferror(f);
    fclose(f);
    if (bad) { buf_free(&b); errf(e, ERR_IO, "%s: read error", path); return NULL; }
    if (len) *len = b.len;
    return buf_detach(&b);
}

const char *sig_name(int sig) {
    switch (sig) {
    case SIGABRT: return "SIGABRT";
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    default: return "signal";
    }
}
