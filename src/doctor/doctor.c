/* doctor.c: the parent side of the doctor: for each family, shape and
 * backend, run the trial children (trial.c), turn what they report (or how
 * they died) into verdicts, choose the fastest correct backend per bucket,
 * print the matrix, write the JSON report and the cache file.
 *
 * Owns: the children it forks (each waited for; a hung one is killed after
 * the per-job timeout), a temporary shapes file and per-child stderr logs
 * (removed at the end).
 * Invariants: the parent never runs a backend itself, so no backend can take
 * it down; the reference backend of a family is tried first so the other
 * backends' large jobs know whether its output can be trusted; test-only
 * backends (the deliberately broken ones, unproven ones) are tried and shown
 * but never chosen.
 */
#include "doctor/doctor.h"
#include "doctor/trial.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef LS_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

void doctor_default_ms(doctor_opts *o) {
    static const int k[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 3072, 4096, 8192};
    o->n_ms = (int)(sizeof k / sizeof k[0]);
    memcpy(o->ms, k, sizeof k);
}

/* ---- one backend's trials ------------------------------------------------------ */

typedef struct cell {
    char status[16];
    char detail[512];
    double ms, bytes, flops, rel, max;
    char ref[64];
    double wall_s; /* the job's wall time in its child, BEGIN to RESULT (set-up, check, timing) */
    double put_s, time_s; /* of it: device allocations + uploads, and the timed calls */
} cell;

static void tail_of(const char *path, char *out, size_t n) {
    out[0] = 0;
    size_t len;
    ls_err e;
    char *t = read_file(path, &len, &e);
    if (!t) return;
    /* the last three non-empty lines, joined with " | " */
    const char *lines[3] = {0};
    size_t lens[3] = {0};
    int got = 0;
    char *end = t + len;
    while (end > t && got < 3) {
        while (end > t && (end[-1] == '\n' || end[-1] == '\r')) end--;
        if (end == t) break;
        char *b = end;
        while (b > t && b[-1] != '\n') b--;
        lines[2 - got] = b;
        lens[2 - got] = (size_t)(end - b);
        got++;
        end = b;
    }
    size_t o = 0;
    for (int i = 3 - got; i < 3; i++) {
        int w = snprintf(out + o, n - o, "%s%.*s", o ? " | " : "", (int)lens[i], lines[i]);
        if (w < 0 || (size_t)w >= n - o) break;
        o += (size_t)w;
    }
    free(t);
}

static void parse_result(const char *js, cell *c) {
    json_error_t je;
    json_t *o = json_loads(js, 0, &je);
    memset(c, 0, sizeof *c);
    c->rel = c->max = NAN;
    if (!o) {
        snprintf(c->status, sizeof c->status, "crash");
        snprintf(c->detail, sizeof c->detail, "unreadable trial result: %s", je.text);
        return;
    }
    const char *st = json_string_value(json_object_get(o, "status"));
    const char *d = json_string_value(json_object_get(o, "detail"));
    const char *r = json_string_value(json_object_get(o, "ref"));
    snprintf(c->status, sizeof c->status, "%s", st ? st : "crash");
    snprintf(c->detail, sizeof c->detail, "%s", d ? d : "");
    snprintf(c->ref, sizeof c->ref, "%s", r ? r : "");
    c->ms = json_number_value(json_object_get(o, "ms"));
    c->bytes = json_number_value(json_object_get(o, "bytes"));
    c->flops = json_number_value(json_object_get(o, "flops"));
    json_t *v;
    if ((v = json_object_get(o, "rel"))) c->rel = json_number_value(v);
    if ((v = json_object_get(o, "max"))) c->max = json_number_value(v);
    c->put_s = json_number_value(json_object_get(o, "put_s"));
    c->time_s = json_number_value(json_object_get(o, "time_s"));
    json_decref(o);
}

typedef struct trial_spec {
    const doctor_opts *o;
    const char *family, *backend, *shapes_file, *ms_list;
    int n_jobs, gpu_ref_ok;
    char log_path[256];
    double startup_s; /* out: the children's start-up (fork to their first BEGIN), summed */
} trial_spec;

/* Run the backend's jobs [0, n_jobs) in children; fill cells[job]. */
static void run_trials(trial_spec *t, cell *cells) {
    int done = 0, consecutive_crashes = 0;
    char last_crash[512] = "";
    for (int j = 0; j < t->n_jobs; j++) cells[j].status[0] = 0;
    int start = 0;
    while (start < t->n_jobs) {
        int pfd[2];
        if (pipe(pfd)) {
            for (int j = start; j < t->n_jobs; j++) {
                snprintf(cells[j].status, sizeof cells[j].status, "crash");
                snprintf(cells[j].detail, sizeof cells[j].detail, "pipe: %s", strerror(errno));
            }
            return;
        }
        char start_s[16], seed_s[32];
        snprintf(start_s, sizeof start_s, "%d", start);
        snprintf(seed_s, sizeof seed_s, "%llu", (unsigned long long)t->o->seed);
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid == 0) {
            dup2(pfd[1], 1);
            close(pfd[0]);
            close(pfd[1]);
            int lf = open(t->log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (lf >= 0) {
                dup2(lf, 2);
                close(lf);
            }
            const char *argv[24];
            int a = 0;
            argv[a++] = t->o->self_exe;
            argv[a++] = "doctor";
            argv[a++] = "--trial";
            argv[a++] = "--device";
            argv[a++] = t->o->device;
            argv[a++] = "--family";
            argv[a++] = t->family;
            argv[a++] = "--backend";
            argv[a++] = t->backend;
            argv[a++] = "--shapes-file";
            argv[a++] = t->shapes_file;
            argv[a++] = "--ms";
            argv[a++] = t->ms_list;
            argv[a++] = "--start";
            argv[a++] = start_s;
            argv[a++] = "--seed";
            argv[a++] = seed_s;
            if (!t->gpu_ref_ok) argv[a++] = "--gpu-ref-untrusted";
            argv[a] = NULL;
            execv(t->o->self_exe, (char *const *)argv);
            fprintf(stderr, "exec %s: %s\n", t->o->self_exe, strerror(errno));
            _exit(127);
        }
        close(pfd[1]);
        if (pid < 0) {
            close(pfd[0]);
            for (int j = start; j < t->n_jobs; j++) {
                snprintf(cells[j].status, sizeof cells[j].status, "crash");
                snprintf(cells[j].detail, sizeof cells[j].detail, "fork: %s", strerror(errno));
            }
            return;
        }
        buf line;
        buf_init(&line);
        int cur = -1; /* job begun and not finished */
        int timed_out = 0;
        double t_fork = now_sec(), t_begin = 0;
        double deadline = now_sec() + t->o->trial_timeout_s + 30.0; /* start-up allowance */
        for (;;) {
            struct pollfd p = {pfd[0], POLLIN, 0};
            int left = (int)((deadline - now_sec()) * 1000);
            if (left <= 0) {
                timed_out = 1;
                kill(pid, SIGKILL);
                break;
            }
            int pr = poll(&p, 1, left);
            if (pr < 0 && errno == EINTR) continue;
            if (pr == 0) continue; /* re-check the deadline */
            char chunk[4096];
            ssize_t n = read(pfd[0], chunk, sizeof chunk);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            buf_append(&line, chunk, (size_t)n);
            char *nl;
            while (line.data && (nl = memchr(line.data, '\n', line.len))) {
                *nl = 0;
                int job;
                if (sscanf(line.data, "BEGIN %d", &job) == 1) {
                    if (t_fork > 0) t->startup_s += now_sec() - t_fork;
                    t_fork = 0;
                    cur = job;
                    t_begin = now_sec();
                    deadline = t_begin + t->o->trial_timeout_s;
                } else if (sscanf(line.data, "RESULT %d", &job) == 1 && job >= 0 && job < t->n_jobs) {
                    const char *js = strchr(line.data + 7, ' ');
                    parse_result(js ? js + 1 : "", &cells[job]);
                    if (job == cur) {
                        cells[job].wall_s = now_sec() - t_begin;
                        cur = -1;
                    }
                    done = job + 1;
                    consecutive_crashes = 0;
                }
                size_t rest = line.len - (size_t)(nl + 1 - line.data);
                memmove(line.data, nl + 1, rest);
                line.len = rest;
                line.data[rest] = 0;
            }
        }
        close(pfd[0]);
        buf_free(&line);
        int status = 0;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        if (done >= t->n_jobs) break;
        /* the child is gone before finishing: the job in flight crashed */
        int bad = cur >= 0 ? cur : done;
        char why[160], tail[400];
        if (timed_out)
            snprintf(why, sizeof why, "hang: no result after %.0f s, killed", t->o->trial_timeout_s);
        else if (WIFSIGNALED(status))
            snprintf(why, sizeof why, "killed by %s (%d)", sig_name(WTERMSIG(status)), WTERMSIG(status));
        else
            snprintf(why, sizeof why, "exited with status %d", WEXITSTATUS(status));
        tail_of(t->log_path, tail, sizeof tail);
        cell *c = &cells[bad];
        memset(c, 0, sizeof *c);
        c->rel = c->max = NAN;
        snprintf(c->status, sizeof c->status, "crash");
        snprintf(c->detail, sizeof c->detail, "%s%s%s", why, tail[0] ? "; log: " : "", tail);
        snprintf(last_crash, sizeof last_crash, "%s", why);
        consecutive_crashes++;
        done = bad + 1;
        start = done;
        if (consecutive_crashes >= 2) {
            for (int j = start; j < t->n_jobs; j++) {
                memset(&cells[j], 0, sizeof cells[j]);
                cells[j].rel = cells[j].max = NAN;
                snprintf(cells[j].status, sizeof cells[j].status, "crash");
                snprintf(cells[j].detail, sizeof cells[j].detail,
                         "not run: the trial process crashed on the 2 jobs before (%s)", last_crash);
            }
            break;
        }
    }
}

/* ---- report (JSON tree) and its rendering --------------------------------------- */

static json_t *cell_json(const cell *c) {
    json_t *o = json_pack("{s:s,s:s}", "status", c->status, "detail", c->detail);
    if (!strcmp(c->status, "ok") || !strcmp(c->status, "unverified")) {
        json_object_set_new(o, "ms", json_real(c->ms));
        if (c->ms > 0) {
            json_object_set_new(o, "gbs", json_real(c->bytes / (c->ms * 1e-3) / 1e9));
            json_object_set_new(o, "tflops", json_real(c->flops / (c->ms * 1e-3) / 1e12));
        }
    }
    json_object_set_new(o, "bytes", json_real(c->bytes));
    json_object_set_new(o, "flops", json_real(c->flops));
    if (isfinite(c->rel)) json_object_set_new(o, "rel_err", json_real(c->rel));
    if (isfinite(c->max)) json_object_set_new(o, "max_err", json_real(c->max));
    if (c->ref[0]) json_object_set_new(o, "reference", json_string(c->ref));
    if (c->wall_s > 0) json_object_set_new(o, "trial_wall_s", json_real(c->wall_s));
    return o;
}

/* Display width of UTF-8 text (emoji count as 2). */
static int disp_width(const char *s, size_t n) {
    int w = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if ((ch & 0xC0) == 0x80) continue;
        w += ch >= 0xF0 || (ch == 0xE2 && i + 1 < n && (unsigned char)s[i + 1] >= 0x9C) ? 2 : 1;
    }
    return w;
}

static void put_cell(buf *b, const char *text, int width) {
    size_t n = strlen(text), keep = n;
    /* cut on a character boundary so the cell fits */
    while (keep > 0 && disp_width(text, keep) > width) {
        keep--;
        while (keep > 0 && ((unsigned char)text[keep] & 0xC0) == 0x80) keep--;
    }
    buf_append(b, text, keep);
    for (int w = disp_width(text, keep); w < width; w++) buf_putc(b, ' ');
}

static double g_copy_gbs; /* measured device copy bandwidth of the report being rendered */

static void fmt_ok(char *out, size_t n, json_t *c) {
    double ms = json_number_value(json_object_get(c, "ms"));
    double gbs = json_number_value(json_object_get(c, "gbs"));
    double tf = json_number_value(json_object_get(c, "tflops"));
    double bytes = json_number_value(json_object_get(c, "bytes"));
    double flops = json_number_value(json_object_get(c, "flops"));
    char t[32], r[32];
    if (ms < 1.0) snprintf(t, sizeof t, "%.1f µs", ms * 1e3);
    else snprintf(t, sizeof t, "%.3f ms", ms);
    if (bytes > 0 && flops / bytes < 100 && g_copy_gbs > 0)
        snprintf(r, sizeof r, "%.0f GB/s %.0f%%", gbs, 100.0 * gbs / g_copy_gbs);
    else if (bytes > 0 && flops / bytes < 100) snprintf(r, sizeof r, gbs < 10 ? "%.2f GB/s" : "%.0f GB/s", gbs);
    else if (tf < 1) snprintf(r, sizeof r, "%.1f GFLOP/s", tf * 1e3);
    else snprintf(r, sizeof r, "%.1f TFLOP/s", tf);
    snprintf(out, n, "%s %s %s", !strcmp(json_string_value(json_object_get(c, "status")), "ok") ? "✅" : "⚠", t, r);
}

/* Print one table: rows = M, columns = backends, last column = chosen. */
static void render_table(buf *b, json_t *tab) {
    const char *title = json_string_value(json_object_get(tab, "title"));
    json_t *backs = json_object_get(tab, "backends");
    json_t *cells = json_object_get(tab, "cells");
    json_t *ms = json_object_get(tab, "ms");
    json_t *chosen = json_object_get(tab, "chosen");
    const int W = 36;
    buf_printf(b, "\n%s\n", title);
    buf_printf(b, "%6s  ", "M");
    size_t i, j;
    json_t *bn, *mv;
    json_t *tonly = json_object_get(tab, "test_only");
    json_array_foreach(backs, i, bn) {
        char h[96];
        int to = 0;
        size_t q;
        json_t *tn;
        json_array_foreach(tonly, q, tn) to |= !strcmp(json_string_value(tn), json_string_value(bn));
        snprintf(h, sizeof h, "%s%s", json_string_value(bn), to ? " (test-only)" : "");
        put_cell(b, h, W);
        buf_puts(b, "  ");
    }
    buf_puts(b, "chosen\n");
    json_array_foreach(ms, j, mv) {
        char mk[16];
        snprintf(mk, sizeof mk, "%lld", (long long)json_integer_value(mv));
        buf_printf(b, "%6s  ", mk);
        json_array_foreach(backs, i, bn) {
            json_t *c = json_object_get(json_object_get(cells, json_string_value(bn)), mk);
            char txt[600];
            const char *st = c ? json_string_value(json_object_get(c, "status")) : "crash";
            const char *d = c ? json_string_value(json_object_get(c, "detail")) : "no result";
            if (c && (!strcmp(st, "ok") || !strcmp(st, "unverified"))) fmt_ok(txt, sizeof txt, c);
            else snprintf(txt, sizeof txt, "❌ %s: %s", st, d);
            put_cell(b, txt, W);
            buf_puts(b, "  ");
        }
        const char *ch = json_string_value(json_object_get(chosen, mk));
        buf_printf(b, "%s\n", ch ? ch : "❌ none correct");
    }
    /* the full reason of each backend's failures: the buckets per status, and
     * the first reason of each status */
    json_array_foreach(backs, i, bn) {
        const char *name = json_string_value(bn);
        json_t *row = json_object_get(cells, name);
        static const char *const sts[] = {"wrong", "crash", "unsupported", "unverified"};
        for (size_t q = 0; q < sizeof sts / sizeof sts[0]; q++) {
            buf where;
            buf_init(&where);
            const char *first = NULL;
            json_array_foreach(ms, j, mv) {
                char mk[16];
                snprintf(mk, sizeof mk, "%lld", (long long)json_integer_value(mv));
                json_t *c = json_object_get(row, mk);
                if (!c || strcmp(json_string_value(json_object_get(c, "status")), sts[q])) continue;
                buf_printf(&where, "%s%s", where.len ? "," : "", mk);
                if (!first) first = json_string_value(json_object_get(c, "detail"));
            }
            if (first) buf_printf(b, "    %s: %s at M=%s: %s\n", name, sts[q], where.data, first);
            buf_free(&where);
        }
    }
}

void doctor_render(json_t *report, FILE *f) {
    buf b;
    buf_init(&b);
    json_t *dev = json_object_get(report, "device");
    buf_printf(&b, "laststand doctor: %s (cc %s, %s), model %s\n",
               json_string_value(json_object_get(dev, "name")),
               json_string_value(json_object_get(dev, "cc")),
               json_string_value(json_object_get(dev, "driver")),
               json_string_value(json_object_get(report, "model")));
    g_copy_gbs = json_number_value(json_object_get(dev, "copy_gbs"));
    if (g_copy_gbs > 0)
        buf_printf(&b, "measured device copy bandwidth (cudaMemcpy D2D, read + write): %.0f GB/s; "
                       "GB/s cells count weights + activations once, %% is of that copy bandwidth\n", g_copy_gbs);
    const char *timing = json_string_value(json_object_get(report, "timing"));
    if (timing)
        buf_printf(&b, "timing: %s (%s)\n", timing,
                   !strcmp(timing, "isolated") ? "an event pair around every call"
                   : !strcmp(timing, "wall")   ? "host wall time per call"
                                               : "calls back to back in chains of 8, time / 8, as in a CUDA graph");
    size_t i;
    json_t *tab;
    json_array_foreach(json_object_get(report, "tables"), i, tab) render_table(&b, tab);
    json_t *ch = json_object_get(report, "choice");
    const char *fam;
    json_t *v;
    buf_puts(&b, "\nchoice per family (fastest correct on every shape of the family):\n");
    json_object_foreach(ch, fam, v) {
        buf_printf(&b, "  %-9s", fam);
        const char *mk;
        json_t *name;
        json_object_foreach(v, mk, name) buf_printf(&b, " M=%s:%s", mk, json_is_string(name) ? json_string_value(name) : "NONE");
        buf_putc(&b, '\n');
    }
    /* the same choice as serve's backend flags take it: a per-M plan, NAME:MAXM,...,NAME (ops.h) */
    buf_puts(&b, "\nthe same choice as per-M plans (the text serve's backend flags take, e.g. --gdn-backend):\n");
    json_object_foreach(ch, fam, v) {
        int ms[DOC_MAX_M], n = 0, none = -1;
        const char *nm[DOC_MAX_M];
        const char *mk;
        json_t *name;
        json_object_foreach(v, mk, name) {
            if (n >= DOC_MAX_M) break;
            int M = atoi(mk), k = n++;
            while (k > 0 && ms[k - 1] > M) { /* insertion by M */
                ms[k] = ms[k - 1];
                nm[k] = nm[k - 1];
                k--;
            }
            ms[k] = M;
            nm[k] = json_string_value(name);
        }
        for (int i = 0; i < n && none < 0; i++)
            if (!nm[i]) none = ms[i];
        buf_printf(&b, "  %-9s ", fam);
        if (!n || none >= 0) {
            buf_printf(&b, "(none: no correct backend at M=%d)\n", none);
            continue;
        }
        for (int i = 0; i < n; i++) {
            if (i + 1 < n && !strcmp(nm[i], nm[i + 1])) continue; /* runs of one backend merge */
            if (i + 1 < n) buf_printf(&b, "%s:%d,", nm[i], ms[i]);
            else buf_printf(&b, "%s\n", nm[i]);
        }
    }
    fputs(b.data ? b.data : "", f);
    fflush(f);
    buf_free(&b);
}

/* ---- cache ------------------------------------------------------------------------ */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t build_id(const char *exe) {
    size_t len;
    ls_err e;
    char *t = read_file(exe, &len, &e);
    uint64_t h = 0xcbf29ce484222325ull;
    if (t) {
        h = fnv1a(h, t, len);
        free(t);
    }
    return h;
}

void doctor_cache_path(const char *key, char *out, size_t n) {
    uint64_t h = fnv1a(0xcbf29ce484222325ull, key, strlen(key));
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) snprintf(out, n, "%s/laststand/doctor-%016llx.json", xdg, (unsigned long long)h);
    else snprintf(out, n, "%s/.cache/laststand/doctor-%016llx.json", home ? home : "/tmp", (unsigned long long)h);
}

static void mkdirs_for(const char *path) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(tmp, 0755);
            *p = '/';
        }
}

/* ---- the run ---------------------------------------------------------------------- */

static int wanted(const char *list, const char *name) {
    if (!list || !*list) return 1;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        size_t l = strcspn(p, ",");
        if (l == n && !strncmp(p, name, n)) return 1;
        p += l + (p[l] == ',');
    }
    return 0;
}

typedef struct fam_desc {
    const char *name;
    int (*count)(void);
    const char *(*name_at)(int i, dev_kind *dev, int *test_only);
} fam_desc;

#define NAME_AT(fn, T, at)                                                  \
    static const char *fn(int i, dev_kind *d, int *test_only) {             \
        const T *p = at(i);                                                 \
        *d = p->dev;                                                        \
        *test_only = p->test_only;                                          \
        return p->name;                                                     \
    }
NAME_AT(fp4_name_at, fp4_gemm_impl, ops_fp4_gemm_at)
NAME_AT(gemm_name_at, gemm_impl, ops_gemm_at)
NAME_AT(moe_name_at, moe_impl, ops_moe_at)
NAME_AT(attn_name_at, attn_impl, ops_attn_at)
NAME_AT(gdn_name_at, gdn_impl, ops_gdn_at)
#undef NAME_AT

static int open_device(const doctor_opts *o, dev_info *dev, char *driver, size_t dn, ls_err *e) {
    snprintf(driver, dn, "n/a");
    if (!strcmp(o->device, "cuda")) {
#ifdef LS_HAVE_CUDA
        if (lsc_device_count(e) <= 0) return err_prefix(e, "doctor --device cuda: no usable GPU");
        if (lsc_device_open(0, dev, driver, dn, e)) return err_prefix(e, "doctor --device cuda");
        return 0;
#else
        return errf(e, ERR_UNSUPPORTED, "doctor --device cuda: this build has no CUDA (built with NO_CUDA=1)");
#endif
    }
    if (!strcmp(o->device, "cpu")) {
        ops_cpu_dev(dev);
        return 0;
    }
    return errf(e, ERR_INVAL, "--device: '%s' is not cpu or cuda", o->device);
}

/* The cache file of this (device, driver, build, shapes, buckets, families,
 * backends, broken-backend switch). */
static void cache_path_for(const doctor_opts *o, const doc_shapes *s, const dev_info *dev, const char *driver,
                           char *out, size_t n) {
    char *shapes_json = doc_shapes_json(s);
    char ms_list[256] = "", cc[16], bid[32];
    for (int i = 0; i < o->n_ms; i++)
        snprintf(ms_list + strlen(ms_list), sizeof ms_list - strlen(ms_list), "%s%d", i ? "," : "", o->ms[i]);
    snprintf(cc, sizeof cc, "%d.%d", dev->cc_major, dev->cc_minor);
    snprintf(bid, sizeof bid, "%016llx", (unsigned long long)build_id(o->self_exe));
    const char *tb = getenv("LASTSTAND_TEST_BROKEN_BACKENDS");
    buf key;
    buf_init(&key);
    buf_printf(&key, "%s|%s|%s|%s|%s|%s|%s|%s|%s", dev->name, cc, driver, bid, shapes_json, ms_list,
               o->families ? o->families : "", o->backends ? o->backends : "", tb ? tb : "");
    doctor_cache_path(key.data, out, n);
    buf_free(&key);
    free(shapes_json);
}

json_t *doctor_cache_lookup(const doctor_opts *o, const doc_shapes *s, char *path, size_t pn, ls_err *e) {
    dev_info dev;
    char driver[96];
    if (open_device(o, &dev, driver, sizeof driver, e)) return NULL;
    char p[1024];
    cache_path_for(o, s, &dev, driver, p, sizeof p);
    if (path) snprintf(path, pn, "%s", p);
    json_t *r = json_load_file(p, 0, NULL);
    if (!r) errf(e, ERR_IO, "no cached doctor decision (%s)", p);
    return r;
}

const char *doctor_pick(json_t *report, const char *family, int M) {
    json_t *fam = json_object_get(json_object_get(report, "choice"), family);
    const char *k;
    json_t *v;
    long best = -1, largest = -1;
    const char *pick = NULL, *plargest = NULL;
    json_object_foreach(fam, k, v) {
        long b = strtol(k, NULL, 10);
        if (b >= M && (best < 0 || b < best)) {
            best = b;
            pick = json_string_value(v);
        }
        if (b > largest) {
            largest = b;
            plargest = json_string_value(v);
        }
    }
    return best >= 0 ? pick : plargest;
}

int doctor_run(const doctor_opts *o, const doc_shapes *s, ls_err *e) {
    dev_info dev;
    char driver[96];
    int cuda = !strcmp(o->device, "cuda");
    int orc = open_device(o, &dev, driver, sizeof driver, e);
    if (orc) return orc;
    char cache_path[1024];
    cache_path_for(o, s, &dev, driver, cache_path, sizeof cache_path);
    if (o->use_cache) {
        json_t *cached = json_load_file(cache_path, 0, NULL);
        if (cached) {
            fprintf(stderr, "doctor: using the cached decision %s\n", cache_path);
            doctor_render(cached, stdout);
            int rc = json_is_true(json_object_get(cached, "complete")) ? 0 : 1;
            if (o->json_path) json_dump_file(cached, o->json_path, JSON_INDENT(1));
            json_decref(cached);
            return rc;
        }
    }

    char *shapes_json = doc_shapes_json(s);
    char shapes_file[] = "/tmp/laststand-doctor-shapes-XXXXXX";
    int fd = mkstemp(shapes_file);
    if (fd < 0) {
        free(shapes_json);
        return errf(e, ERR_IO, "doctor: temporary file: %s", strerror(errno));
    }
    size_t sl = strlen(shapes_json);
    if (write(fd, shapes_json, sl) != (ssize_t)sl) {
        close(fd);
        unlink(shapes_file);
        free(shapes_json);
        return errf(e, ERR_IO, "doctor: writing %s: %s", shapes_file, strerror(errno));
    }
    close(fd);
    char cc[16];
    snprintf(cc, sizeof cc, "%d.%d", dev.cc_major, dev.cc_minor);
    json_t *report = json_object();
    json_object_set_new(report, "version", json_integer(1));
    json_object_set_new(report, "device", json_pack("{s:s,s:s,s:s,s:i,s:s}", "kind", o->device, "name", dev.name,
                                                    "cc", cuda ? cc : "-", "sms", dev.n_sm, "driver", driver));
    json_object_set_new(report, "model", json_string(s->model));
    json_object_set_new(report, "timing", json_string(cuda ? td_timing_name() : "wall"));
#ifdef LS_HAVE_CUDA
    if (cuda) {
        ls_err ce = {0};
        double bw = lsc_copy_bw_gbs((size_t)2 << 30, 10, &ce);
        if (bw > 0) json_object_set_new(json_object_get(report, "device"), "copy_gbs", json_real(bw));
        else fprintf(stderr, "doctor: copy bandwidth not measured: %s\n", ce.msg);
    }
#endif
    char bid[32];
    snprintf(bid, sizeof bid, "%016llx", (unsigned long long)build_id(o->self_exe));
    json_object_set_new(report, "build", json_string(bid));
    json_object_set_new(report, "shapes", json_loads(shapes_json, 0, NULL));
    json_t *tables = json_array(), *choice = json_object();
    json_object_set_new(report, "tables", tables);
    json_object_set_new(report, "choice", choice);

    static const fam_desc fams[] = {
        {"fp4_gemm", ops_fp4_gemm_count, fp4_name_at},
        {"gemm", ops_gemm_count, gemm_name_at},
        {"moe", ops_moe_count, moe_name_at},
        {"attention", ops_attn_count, attn_name_at},
        {"gdn", ops_gdn_count, gdn_name_at},
        /* the lm_head: a gemm of its own shape with its own choice (serve's --lm-head-backend),
         * so that its plan is not the projections' (their summed time decides the gemm row) */
        {"lm_head", ops_gemm_count, gemm_name_at},
    };
    int complete = 1;
    double t_start = now_sec();
    for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++) {
        const fam_desc *fd = &fams[f];
        if (!wanted(o->families, fd->name)) continue;
        int n_shapes = !strcmp(fd->name, "fp4_gemm")    ? s->n_fp4
                       : !strcmp(fd->name, "gemm")      ? s->n_bf16
                       : !strcmp(fd->name, "moe")       ? s->n_experts > 0
                       : !strcmp(fd->name, "attention") ? s->n_heads > 0
                       : !strcmp(fd->name, "lm_head")   ? s->vocab > 0 && s->hidden > 0
                                                        : s->nk > 0;
        if (n_shapes == 0) {
            fprintf(stderr, "doctor: %s: the model has no such op, skipped\n", fd->name);
            continue;
        }
        /* the device's backends, the reference first */
        const char *names[32];
        int test_only[32];
        int nb = 0;
        const char *refname = cuda ? "cuda_ref" : "cpu_ref";
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < fd->count() && nb < 32; i++) {
                dev_kind dk;
                int to;
                const char *nm = fd->name_at(i, &dk, &to);
                if (dk != dev.kind || !wanted(o->backends, nm)) continue;
                if ((pass == 0) != !strcmp(nm, refname)) continue;
                test_only[nb] = to;
                names[nb++] = nm;
            }
        if (nb == 0) {
            fprintf(stderr, "doctor: %s: no backend for device %s, skipped\n", fd->name, dev.name);
            continue;
        }
        /* the buckets: all, but the lm_head's up to DOC_LM_HEAD_MAX_M (its M is the rows that want
         * logits; above, a 1 GB weight's outputs of [M x vocab] only cost time and host memory) */
        doctor_opts fo = *o;
        if (!strcmp(fd->name, "lm_head")) {
            fo.n_ms = 0;
            int smallest = o->ms[0];
            for (int i = 0; i < o->n_ms; i++) {
                if (o->ms[i] <= DOC_LM_HEAD_MAX_M) fo.ms[fo.n_ms++] = o->ms[i];
                if (o->ms[i] < smallest) smallest = o->ms[i];
            }
            if (!fo.n_ms) fo.ms[fo.n_ms++] = smallest;
        }
        char fms_list[256] = "";
        json_t *fms_arr = json_array();
        for (int i = 0; i < fo.n_ms; i++) {
            snprintf(fms_list + strlen(fms_list), sizeof fms_list - strlen(fms_list), "%s%d", i ? "," : "", fo.ms[i]);
            json_array_append_new(fms_arr, json_integer(fo.ms[i]));
        }
        int n_jobs = n_shapes * fo.n_ms;
        cell **res = xcalloc(nb, sizeof(cell *));
        int gpu_ref_ok = 1;
        for (int b = 0; b < nb; b++) {
            res[b] = xcalloc(n_jobs, sizeof(cell));
            trial_spec t = {&fo, fd->name, names[b], shapes_file, fms_list, n_jobs, gpu_ref_ok, ""};
            snprintf(t.log_path, sizeof t.log_path, "%s.%s.%s.log", shapes_file, fd->name, names[b]);
            double t0 = now_sec();
            fprintf(stderr, "doctor: %s / %s: %d jobs...", fd->name, names[b], n_jobs);
            run_trials(&t, res[b]);
            /* where a backend's time went: its children's start-up and its slowest job (set-up
             * of the inputs, the reference check and the timing together) */
            int slow = 0;
            double put = 0, tim = 0, wall = 0;
            for (int j = 0; j < n_jobs; j++) {
                if (res[b][j].wall_s > res[b][slow].wall_s) slow = j;
                put += res[b][j].put_s;
                tim += res[b][j].time_s;
                wall += res[b][j].wall_s;
            }
            fprintf(stderr,
                    " %.1f s (start-up %.1f, uploads %.1f, timing %.1f, inputs + checks %.1f; slowest job: shape %d, "
                    "M=%d, %.1f s)\n",
                    now_sec() - t0, t.startup_s, put, tim, wall - put - tim, slow / fo.n_ms, fo.ms[slow % fo.n_ms],
                    res[b][slow].wall_s);
            unlink(t.log_path);
            if (cuda && !strcmp(names[b], refname)) {
                /* chain of trust: the GPU reference must match the CPU wherever the CPU checked it */
                for (int j = 0; j < n_jobs; j++)
                    if (!strcmp(res[b][j].ref, "cpu-fp64") && strcmp(res[b][j].status, "ok")) gpu_ref_ok = 0;
                if (!gpu_ref_ok) fprintf(stderr, "doctor: %s: cuda_ref failed its CPU check: large shapes unverified\n", fd->name);
            }
        }
        for (int j = 0; j < n_jobs; j++) { /* the family's shared references (trial.h td_ref_load) */
            char rp[512];
            doctor_ref_path(shapes_file, fd->name, j, rp, sizeof rp);
            unlink(rp);
        }
        /* tables per shape, choice per shape and per family */
        json_t *fam_choice = json_object();
        double *sum = xcalloc(nb, sizeof(double));
        for (int m = 0; m < fo.n_ms; m++) {
            for (int b = 0; b < nb; b++) sum[b] = 0;
            for (int sh = 0; sh < n_shapes; sh++)
                for (int b = 0; b < nb; b++) {
                    cell *c = &res[b][sh * fo.n_ms + m];
                    if (strcmp(c->status, "ok") || !(c->ms > 0)) sum[b] = INFINITY;
                    else sum[b] += c->ms;
                }
            int best = -1;
            for (int b = 0; b < nb; b++)
                if (!test_only[b] && isfinite(sum[b]) && (best < 0 || sum[b] < sum[best])) best = b;
            char mk[16];
            snprintf(mk, sizeof mk, "%d", fo.ms[m]);
            json_object_set_new(fam_choice, mk, best >= 0 ? json_string(names[best]) : json_null());
            if (best < 0) complete = 0;
        }
        free(sum);
        json_object_set_new(choice, fd->name, fam_choice);
        for (int sh = 0; sh < n_shapes; sh++) {
            char title[300];
            if (!strcmp(fd->name, "attention"))
                snprintf(title, sizeof title,
                         "attention  %d heads / %d kv heads x %d%s, paged (16-token pages), decode rows and "
                         "prefill chunks mixed", s->n_heads, s->n_kv_heads, s->head_dim, s->gated ? ", output gate" : "");
            else if (!strcmp(fd->name, "gdn"))
                snprintf(title, sizeof title,
                         "gdn  %d k-heads / %d v-heads, dk %d dv %d, conv %d, per-slot %s state; a cell: a step of "
                         "decode rows and prefill chunks mixed + (M 2..512) a decode step of min(M, 256) sequences",
                         s->nk, s->nv, s->dk, s->dv, s->conv_k, s->state_bf16 ? "BF16" : "fp32");
            else if (!strcmp(fd->name, "moe"))
                snprintf(title, sizeof title,
                         "moe  H=%d E=%d top-%d I=%d shared=%d (%s experts%s)", s->hidden, s->n_experts,
                         s->top_k, s->moe_inter, s->shared_inter, s->nvfp4 ? "NVFP4" : "BF16",
                         s->shared_inter <= 0 ? ""
                         : s->nvfp4 && s->sh_nvfp4 ? ", NVFP4 shared expert"
                                                   : ", BF16 shared expert");
            else if (!strcmp(fd->name, "lm_head"))
                snprintf(title, sizeof title, "lm_head  [%d x %d]  the vocab projection, one row per sequence that "
                         "wants logits  (BF16 weight %.4g MB; a gemm, chosen on its own)", s->vocab, s->hidden,
                         (double)s->vocab * s->hidden * 2 / 1e6);
            else {
                const int f4 = !strcmp(fd->name, "fp4_gemm");
                const doc_lin *L = f4 ? &s->fp4[sh] : &s->bf16[sh];
                double wb = (double)L->N * L->K * (f4 ? 0.5625 : L->fp8 ? 1.0 : 2.0);
                snprintf(title, sizeof title, "%s  [%d x %d]  %s  (%s weight %.3g %s)", fd->name, L->N, L->K,
                         L->label, f4 ? "NVFP4" : L->fp8 ? "FP8" : "BF16",
                         wb >= 1e6 ? wb / 1e6 : wb / 1e3, wb >= 1e6 ? "MB" : "kB");
            }
            json_t *tab = json_pack("{s:s,s:s,s:O}", "family", fd->name, "title", title, "ms", fms_arr);
            json_t *backs = json_array(), *cells = json_object(), *chosen = json_object(), *tonly = json_array();
            for (int b = 0; b < nb; b++) {
                json_array_append_new(backs, json_string(names[b]));
                if (test_only[b]) json_array_append_new(tonly, json_string(names[b]));
                json_t *row = json_object();
                for (int m = 0; m < fo.n_ms; m++) {
                    char mk[16];
                    snprintf(mk, sizeof mk, "%d", fo.ms[m]);
                    json_object_set_new(row, mk, cell_json(&res[b][sh * fo.n_ms + m]));
                }
                json_object_set_new(cells, names[b], row);
            }
            for (int m = 0; m < fo.n_ms; m++) {
                int best = -1;
                for (int b = 0; b < nb; b++) {
                    cell *c = &res[b][sh * fo.n_ms + m];
                    if (!test_only[b] && !strcmp(c->status, "ok") && c->ms > 0 &&
                        (best < 0 || c->ms < res[best][sh * fo.n_ms + m].ms))
                        best = b;
                }
                char mk[16];
                snprintf(mk, sizeof mk, "%d", fo.ms[m]);
                json_object_set_new(chosen, mk, best >= 0 ? json_string(names[best]) : json_null());
                if (best < 0) complete = 0;
            }
            json_object_set_new(tab, "backends", backs);
            json_object_set_new(tab, "cells", cells);
            json_object_set_new(tab, "chosen", chosen);
            json_object_set_new(tab, "test_only", tonly);
            json_array_append_new(tables, tab);
        }
        for (int b = 0; b < nb; b++) free(res[b]);
        free(res);
        json_decref(fms_arr);
    }
    json_object_set_new(report, "complete", json_boolean(complete));
    json_object_set_new(report, "seconds", json_real(now_sec() - t_start));
    unlink(shapes_file);
    free(shapes_json);

    doctor_render(report, stdout);
    fprintf(stderr, "doctor: %.1f s\n", now_sec() - t_start);
    int rc = complete ? 0 : 1;
    if (o->json_path && json_dump_file(report, o->json_path, JSON_INDENT(1))) {
        json_decref(report);
        return errf(e, ERR_IO, "--json: cannot write %s", o->json_path);
    }
    mkdirs_for(cache_path);
    if (json_dump_file(report, cache_path, JSON_INDENT(1)) == 0)
        fprintf(stderr, "doctor: decision cached in %s\n", cache_path);
    json_decref(report);
    return rc;
}
