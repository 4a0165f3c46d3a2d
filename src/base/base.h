/* base.h: errors, logging, checks, small utilities shared by every module.
 *
 * Owns: the process-wide log level (the only global besides op registries).
 * Invariants: functions that can fail return 0 or a negative ERR_* and fill an
 * ls_err with a one-line human message naming the thing at fault.
 */
#ifndef LS_BASE_H
#define LS_BASE_H

#include <stddef.h>
#include <stdint.h>
#include <stdarg.h>

/* ---- errors ------------------------------------------------------------ */
enum {
    ERR_OK = 0,
    ERR_INVAL = -1,       /* bad input: flag, file, model, request (exit 2) */
    ERR_IO = -2,          /* OS-level failure reading/writing */
    ERR_NOMEM = -3,
    ERR_UNSUPPORTED = -4, /* valid input we cannot handle on this device */
    ERR_RUNTIME = -5,     /* anything else at run time (exit 1) */
    ERR_CANCELLED = -6,
};

typedef struct ls_err {
    int code;
    char msg[1024];
} ls_err;

/* Fill e (may be NULL) and return code. */
int errf(ls_err *e, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Prefix an existing message: "ctx: old message". Returns e->code. */
int err_prefix(ls_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Exit code for an error: 2 for ERR_INVAL, 1 otherwise. */
int err_exit_code(int code);

/* Fatal start-up errors only (bad flags, unloadable model). */
_Noreturn void die(int exit_code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Always-on invariant: prints file:line and aborts. Never compiled out. */
#define CHECK(x) do { if (!(x)) check_failed(__FILE__, __LINE__, #x); } while (0)
_Noreturn void check_failed(const char *file, int line, const char *expr);

/* ---- logging (stderr) ---------------------------------------------------- */
enum { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 };
void log_set_level(int level);
int log_parse_level(const char *s); /* "debug"|"info"|"warning"|"error" -> level, -1 if bad */
void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)

/* ---- memory ------------------------------------------------------------ */
void *xmalloc(size_t n);            /* aborts on OOM */
void *xcalloc(size_t n, size_t sz);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);

/* Growable byte buffer, always NUL-terminated. */
typedef struct buf {
    char *data;
    size_t len, cap;
} buf;
void buf_init(buf *b);
void buf_free(buf *b);
void buf_reserve(buf *b, size_t extra);
void buf_append(buf *b, const void *p, size_t n);
void buf_puts(buf *b, const char *s);
void buf_putc(buf *b, char c);
void buf_printf(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void buf_vprintf(buf *b, const char *fmt, va_list ap);
char *buf_detach(buf *b); /* caller frees; b is reset */

/* Bump allocator: everything freed at once (per request). */
typedef struct arena arena;
arena *arena_new(size_t block);
void *arena_alloc(arena *a, size_t n); /* 16-byte aligned, zeroed */
char *arena_strdup(arena *a, const char *s);
char *arena_strndup(arena *a, const char *s, size_t n);
void arena_free(arena *a);

/* ---- time -------------------------------------------------------------- */
double now_sec(void); /* monotonic seconds */
/* (additive) "SIGABRT", "SIGSEGV", ... for the signals a crashing child dies of; "signal"
 * for others. Used in "killed by SIGABRT (6)" verdicts (doctor trials, serve's smoke test). */
const char *sig_name(int sig);

/* ---- thread pool ------------------------------------------------------- */
/* A process-wide pool of worker threads for data-parallel loops.
 * pool_for splits [0, n) into contiguous chunks and runs fn(ctx, i0, i1) on
 * the workers and the caller; returns when all chunks are done. Nested
 * calls from inside a worker run serially. Thread count: LS_THREADS env,
 * else the number of online CPUs. */
typedef void (*pool_fn)(void *ctx, int64_t i0, int64_t i1);
void pool_for(int64_t n, int64_t min_chunk, pool_fn fn, void *ctx);
int pool_threads(void);
void pool_set_threads(int n); /* before first use */

/* ---- numbers ----------------------------------------------------------- */
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f); /* round to nearest even, NaN preserved */
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float fp8_e4m3_to_f32(uint8_t v);
uint8_t f32_to_fp8_e4m3(float f); /* saturating, round to nearest even */
float fp8_e5m2_to_f32(uint8_t v);
extern const float E2M1_LUT[16]; /* NVFP4 code -> value */

/* Parse "1,2,3" into a malloc'd int array; returns count or -1 on bad input. */
int parse_int_list(const char *s, int32_t **out);

/* Read a whole file (NUL-terminated); NULL + err on failure. */
char *read_file(const char *path, size_t *len, ls_err *e);

#endif
