/* cmd_sweep.c: `laststand sweep`, a server per grid point, judged.
 *
 * For every point of the product of the --grid lists (first grid outermost):
 * substitute {name} in the --launch template (plain text replacement), start
 * it (sweep_proc.c: /bin/sh -c, own process group, log to a file), wait for
 * 200 from GET --health-path while watching for the process exiting, run the
 * smoke test (sweep_smoke.c) and, if the answers are sound, the configured
 * bench; then stop the group and wait for the port to be free. Verdicts:
 *   crash    the process exited or died (exit code or signal, log tail)
 *   timeout  no healthy answer within --health-timeout
 *   garbage  errors, empty, repeated or invalid text, identical answers, or
 *            failed bench requests
 *   ok       with the bench's headline numbers
 * Output: a markdown matrix on stdout, JSON with --json FILE; progress on
 * stderr. Exit 0 when every point was judged, 2 for bad flags (including a
 * {placeholder} no grid defines), 1 when the sweep itself could not go on.
 */
#include "cli/cli.h"
#include "cli/sweep.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct grid {
    char *name;
    char **vals;
    int n;
} grid;

typedef struct point_result {
    const char *verdict;
    char *evidence;     /* one line */
    char *command;
    char *log_path;
    char **log_tail;
    int n_tail;
    int exit_status, exited;
    double startup_s;
    json_t *smoke;      /* [{prompt, text, error}] */
    json_t *bench;      /* the bench level objects, or NULL */
} point_result;

static void usage(FILE *f) {
    fprintf(f,
            "usage: laststand sweep --launch 'CMD with {name} placeholders' --grid name=v1,v2 [--grid ...]\n"
            "                       --base-url URL [sweep flags] [bench flags]\n\n"
            "Starts a server per grid point, waits for health, smoke-tests its answers for garbage,\n"
            "benches it, stops it. Markdown matrix on stdout.\n\nsweep flags:\n"
            "  --launch CMD               shell command; {name} is replaced by the grid value\n"
            "  --grid name=v1,v2,...      one parameter's values (several grids form the product)\n"
            "  --health-timeout S         seconds to wait for 200 from the health path (default 300)\n"
            "  --health-path P            default /health\n"
            "  --grace S                  seconds between SIGTERM and SIGKILL at stop (default 10)\n"
            "  --smoke-max-tokens N       max_tokens of the smoke prompts (default 32)\n"
            "  --no-bench                 smoke test only\n"
            "  --log-dir DIR              server logs (default: a new /tmp/laststand-sweep-XXXXXX)\n"
            "  --json FILE                the whole result as JSON\n\nbench flags:\n%s",
            BENCH_FLAGS_HELP);
}

/* ---- template ----------------------------------------------------------------------- */

static int is_name_char(char c, int first) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
           (!first && ((c >= '0' && c <= '9') || c == '-' || c == '.'));
}

/* Calls fn for each {name} in t; returns the count. */
static int scan_placeholders(const char *t, void (*fn)(void *, const char *, size_t), void *ctx) {
    int n = 0;
    for (const char *p = t; (p = strchr(p, '{'));) {
        const char *q = p + 1;
        if (!is_name_char(*q, 1)) { p++; continue; }
        while (is_name_char(*q, 0)) q++;
        if (*q != '}') { p++; continue; }
        fn(ctx, p + 1, (size_t)(q - p - 1));
        n++;
        p = q + 1;
    }
    return n;
}

typedef struct check_ctx {
    grid *g;
    int ng;
    buf missing;
} check_ctx;

static void check_one(void *vc, const char *name, size_t n) {
    check_ctx *c = vc;
    for (int i = 0; i < c->ng; i++)
        if (strlen(c->g[i].name) == n && !strncmp(c->g[i].name, name, n)) return;
    buf_printf(&c->missing, "%s{%.*s}", c->missing.len ? ", " : "", (int)n, name);
}

static char *substitute(const char *t, grid *g, int ng, const int *idx) {
    buf b;
    buf_init(&b);
    const char *p = t;
    while (*p) {
        if (*p == '{') {
            int hit = 0;
            for (int i = 0; i < ng && !hit; i++) {
                size_t n = strlen(g[i].name);
                if (!strncmp(p + 1, g[i].name, n) && p[1 + n] == '}') {
                    buf_puts(&b, g[i].vals[idx[i]]);
                    p += n + 2;
                    hit = 1;
                }
            }
            if (hit) continue;
        }
        buf_putc(&b, *p++);
    }
    return buf_detach(&b);
}

static void grid_free(grid *g) {
    for (int v = 0; v < g->n; v++) free(g->vals[v]);
    free(g->vals);
    free(g->name);
    memset(g, 0, sizeof *g);
}

static int parse_grid(const char *s, grid *g, ls_err *e) {
    memset(g, 0, sizeof *g);
    const char *eq = strchr(s, '=');
    if (!eq || eq == s) return errf(e, ERR_INVAL, "--grid: '%s' is not name=v1,v2,...", s);
    for (const char *q = s; q < eq; q++)
        if (!is_name_char(*q, q == s))
            return errf(e, ERR_INVAL, "--grid: '%.*s' is not a placeholder name (letters, digits, _ - .)", (int)(eq - s), s);
    g->name = xstrdup(s);
    g->name[eq - s] = 0;
    g->n = 0;
    g->vals = NULL;
    const char *v = eq + 1;
    for (;;) {
        size_t len = strcspn(v, ",");
        if (len == 0) {
            errf(e, ERR_INVAL, "--grid %s: empty value in '%s'", g->name, eq + 1);
            grid_free(g);
            return ERR_INVAL;
        }
        g->vals = xrealloc(g->vals, sizeof(char *) * (g->n + 1));
        char *x = xmalloc(len + 1);
        memcpy(x, v, len);
        x[len] = 0;
        g->vals[g->n++] = x;
        if (!v[len]) break;
        v += len + 1;
    }
    return 0;
}

/* ---- evidence helpers --------------------------------------------------------------------- */

static void attach_log_tail(point_result *pr, int n) {
    pr->log_tail = sweep_log_tail(pr->log_path, n, &pr->n_tail);
}

static char *tail_text(const point_result *pr, int last, const char *sep) {
    buf b;
    buf_init(&b);
    int from = pr->n_tail > last ? pr->n_tail - last : 0;
    for (int i = from; i < pr->n_tail; i++) buf_printf(&b, "%s%s", i > from ? sep : "", pr->log_tail[i]);
    if (!b.len) buf_puts(&b, "(empty log)");
    return buf_detach(&b);
}

static void md_cell(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '|') fputs("\\|", f);
        else if (*s == '\n') fputs("<br>", f);
        else fputc(*s, f);
    }
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static int wait_port_free(const char *host, int port, double timeout_s) {
    double end = now_sec() + timeout_s;
    while (!sweep_port_free(host, port)) {
        if (now_sec() > end) return 0;
        sleep_s(0.2);
    }
    return 1;
}

/* ---- one point ------------------------------------------------------------------------------ */

typedef struct sweep_cfg {
    const char *launch;
    double health_timeout, grace;
    const char *health_path;
    int smoke_max_tokens, no_bench;
    const char *log_dir;
    bench_opts bo;
} sweep_cfg;

static void judge_exit(point_result *pr, sweep_proc *p, const char *when) {
    pr->verdict = "crash";
    pr->exited = 1;
    pr->exit_status = p->status;
    attach_log_tail(pr, 20);
    char *ex = sweep_exit_text(p->status);
    char *tail = tail_text(pr, 4, "\n");
    buf b;
    buf_init(&b);
    buf_printf(&b, "%s %s; log: %s", ex, when, tail);
    pr->evidence = buf_detach(&b);
    free(ex);
    free(tail);
}

/* After a failed request: a server that is dying has closed its sockets a
 * moment before it can be reaped. Wait up to 2 s so a crash is called a crash. */
static int exited_after_failure(sweep_proc *p) {
    double end = now_sec() + 2.0;
    while (!sweep_poll_exit(p)) {
        if (now_sec() > end) return 0;
        sleep_s(0.05);
    }
    return 1;
}

static void run_point(const sweep_cfg *c, const char *cmd, int index, point_result *pr) {
    memset(pr, 0, sizeof *pr);
    pr->command = xstrdup(cmd);
    buf lp;
    buf_init(&lp);
    buf_printf(&lp, "%s/point-%02d.log", c->log_dir, index + 1);
    pr->log_path = buf_detach(&lp);
    ls_err e = {0};
    sweep_proc p;
    if (sweep_launch(cmd, pr->log_path, &p, &e)) {
        pr->verdict = "crash";
        pr->evidence = xstrdup(e.msg);
        return;
    }
    /* health */
    buf hu;
    buf_init(&hu);
    buf_printf(&hu, "%s%s", c->bo.base_url, c->health_path);
    double t0 = now_sec(), deadline = t0 + c->health_timeout;
    int healthy = 0;
    while (!healthy) {
        if (sweep_poll_exit(&p)) {
            judge_exit(pr, &p, "before it was healthy");
            break;
        }
        int status = 0;
        char *resp = NULL;
        ls_err he = {0};
        if (!bench_http_simple(hu.data, c->bo.api_key, NULL, 2, &status, &resp, &he) && status == 200) healthy = 1;
        free(resp);
        if (healthy) break;
        if (now_sec() > deadline) {
            pr->verdict = "timeout";
            attach_log_tail(pr, 20);
            char *tail = tail_text(pr, 4, "\n");
            buf b;
            buf_init(&b);
            buf_printf(&b, "no 200 from GET %s within %.0f s; log: %s", c->health_path, c->health_timeout, tail);
            pr->evidence = buf_detach(&b);
            free(tail);
            break;
        }
        sleep_s(0.25);
    }
    buf_free(&hu);
    if (healthy) {
        pr->startup_s = now_sec() - t0;
        log_info("sweep: point %d healthy after %.1f s; smoke test", index + 1, pr->startup_s);
        ls_err me = {0};
        char *model = c->bo.model ? xstrdup(c->bo.model) : bench_discover_model(&c->bo, &me);
        sweep_smoke s;
        int rc = sweep_smoke_run(c->bo.base_url, c->bo.api_key, model, c->smoke_max_tokens,
                                 c->bo.timeout_s > 0 ? c->bo.timeout_s : 300, &s, &e);
        if (!rc) {
            pr->smoke = json_array();
            for (int i = 0; i < s.n; i++)
                json_array_append_new(pr->smoke, json_pack("{s:s,s:o,s:o}", "prompt", s.prompts[i], "text",
                                                           s.texts[i] ? json_string(s.texts[i]) : json_null(),
                                                           "error", s.errors[i] ? json_string(s.errors[i]) : json_null()));
        }
        if (sweep_poll_exit(&p) || ((rc || s.garbage) && exited_after_failure(&p)))
            judge_exit(pr, &p, "during the smoke test");
        else if (rc) {
            pr->verdict = "garbage";
            pr->evidence = xstrdup(e.msg);
        } else if (s.garbage) {
            pr->verdict = "garbage";
            pr->evidence = xstrdup(s.reason);
        } else if (c->no_bench) {
            pr->verdict = "ok";
            buf b;
            buf_init(&b);
            buf_printf(&b, "smoke ok (%d prompts); first answer: ", s.n);
            const char *t = s.texts[0] ? s.texts[0] : "";
            size_t n = strlen(t);
            buf_printf(&b, "%.*s%s", (int)(n > 60 ? 60 : n), t, n > 60 ? "..." : "");
            for (size_t k = 0; k < b.len; k++)
                if (b.data[k] == '\n') b.data[k] = ' ';
            pr->evidence = buf_detach(&b);
        } else {
            log_info("sweep: point %d smoke ok; bench", index + 1);
            bench_opts bo = c->bo;
            bo.quiet = 1;
            bench_result *rs = NULL;
            char *bm = NULL;
            ls_err be = {0};
            int brc = bench_run(&bo, &rs, &bm, &be);
            int nlev = bo.n_conc ? bo.n_conc : 1;
            if (!brc) {
                pr->bench = json_array();
                for (int i = 0; i < nlev; i++) json_array_append_new(pr->bench, bench_result_json(&rs[i], &bo, bm, NULL));
            }
            int bench_bad = brc != 0;
            for (int i = 0; !brc && i < nlev; i++) bench_bad |= rs[i].failed > 0;
            if (sweep_poll_exit(&p) || (bench_bad && exited_after_failure(&p))) judge_exit(pr, &p, "during the bench");
            else if (brc) {
                pr->verdict = "garbage";
                buf b;
                buf_init(&b);
                buf_printf(&b, "bench: %s", be.msg);
                pr->evidence = buf_detach(&b);
            } else {
                buf b;
                buf_init(&b);
                int failed = 0, total = 0;
                for (int i = 0; i < nlev; i++) failed += rs[i].failed, total += rs[i].num_prompts;
                if (failed) {
                    pr->verdict = "garbage";
                    const char *first = NULL;
                    for (int i = 0; i < nlev && !first; i++)
                        first = json_string_value(json_object_get(json_array_get(rs[i].errors, 0), "error"));
                    buf_printf(&b, "bench: %d of %d requests failed: %s", failed, total, first ? first : "?");
                } else {
                    pr->verdict = "ok";
                    for (int i = 0; i < nlev; i++) {
                        const bench_result *r = &rs[i];
                        char cc[16];
                        if (r->max_concurrency > 0) snprintf(cc, sizeof cc, "%d", r->max_concurrency);
                        else snprintf(cc, sizeof cc, "inf");
                        buf_printf(&b, "%sc=%s: out %.2f tok/s, TPOT p50 %.2f ms, TTFT p50 %.2f ms, %d/%d ok",
                                   i ? "; " : "", cc, r->output_throughput, r->tpot.median, r->ttft.median,
                                   r->completed, r->num_prompts);
                    }
                }
                pr->evidence = buf_detach(&b);
            }
            if (rs)
                for (int i = 0; i < nlev; i++) bench_result_free(&rs[i]);
            free(rs);
            free(bm);
        }
        if (!rc) sweep_smoke_free(&s);
        free(model);
    }
    sweep_stop(&p, c->grace);
    if (!pr->exited && p.exited) pr->exit_status = p.status; /* status after our stop, for the record */
    if (!pr->n_tail) attach_log_tail(pr, 20);
}

/* ---- main ------------------------------------------------------------------------------------ */

int cmd_sweep(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN); /* a dying server must not take sweep with it */
    sweep_cfg c;
    memset(&c, 0, sizeof c);
    bench_opts_default(&c.bo);
    c.health_timeout = 300;
    c.grace = 10;
    c.health_path = "/health";
    c.smoke_max_tokens = 32;
    const char *json_path = NULL;
    grid *grids = NULL;
    int ng = 0;
    ls_err e = {0};
    int exit_code = 0;
    for (int i = 1; i < argc;) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            goto out;
        }
        if (!strcmp(a, "--no-bench")) {
            c.no_bench = 1;
            i++;
            continue;
        }
        static const char *const own[] = {"--launch", "--grid", "--health-timeout", "--health-path", "--grace",
                                          "--smoke-max-tokens", "--log-dir", "--json"};
        int k = -1;
        for (int q = 0; q < (int)(sizeof own / sizeof own[0]); q++)
            if (!strcmp(a, own[q])) k = q;
        if (k >= 0) {
            if (i + 1 >= argc) {
                errf(&e, ERR_INVAL, "%s needs a value", a);
                goto bad;
            }
            const char *v = argv[i + 1];
            i += 2;
            char *end;
            switch (k) {
            case 0: c.launch = v; break;
            case 1:
                grids = xrealloc(grids, sizeof(grid) * (ng + 1));
                if (parse_grid(v, &grids[ng], &e)) goto bad;
                ng++;
                for (int q = 0; q < ng - 1; q++)
                    if (!strcmp(grids[q].name, grids[ng - 1].name)) {
                        errf(&e, ERR_INVAL, "--grid %s is given twice", grids[ng - 1].name);
                        goto bad;
                    }
                break;
            case 2:
            case 4:
                errno = 0;
                double d = strtod(v, &end);
                if (end == v || *end || errno || !(d >= 0) || !isfinite(d)) {
                    errf(&e, ERR_INVAL, "%s: '%s' is not a number of seconds", a, v);
                    goto bad;
                }
                if (k == 2) c.health_timeout = d;
                else c.grace = d;
                break;
            case 3:
                if (v[0] != '/') {
                    errf(&e, ERR_INVAL, "--health-path: '%s' does not start with /", v);
                    goto bad;
                }
                c.health_path = v;
                break;
            case 5: {
                long n = strtol(v, &end, 10);
                if (end == v || *end || n < 1 || n > 4096) {
                    errf(&e, ERR_INVAL, "--smoke-max-tokens: '%s' is not an integer in [1, 4096]", v);
                    goto bad;
                }
                c.smoke_max_tokens = (int)n;
                break;
            }
            case 6: c.log_dir = v; break;
            case 7: json_path = v; break;
            }
            continue;
        }
        int rc = bench_opts_parse_flag(&c.bo, argc, argv, &i, &e);
        if (rc < 0) goto bad;
        if (rc == 0) {
            errf(&e, ERR_INVAL, "unknown flag '%s' (see laststand sweep --help)", a);
            goto bad;
        }
    }
    if (!c.launch) { errf(&e, ERR_INVAL, "--launch is required"); goto bad; }
    if (!ng) { errf(&e, ERR_INVAL, "at least one --grid name=v1,v2 is required"); goto bad; }
    if (bench_opts_check(&c.bo, &e)) goto bad;
    if (c.bo.output_file || c.bo.plot_file) {
        errf(&e, ERR_INVAL, "--output-file and --plot are bench-only; sweep writes every point's bench to --json");
        goto bad;
    }
    {
        check_ctx cc = {grids, ng, {0}};
        buf_init(&cc.missing);
        scan_placeholders(c.launch, check_one, &cc);
        if (cc.missing.len) {
            errf(&e, ERR_INVAL, "--launch: placeholder%s %s not defined by any --grid", strchr(cc.missing.data, ',') ? "s" : "",
                 cc.missing.data);
            buf_free(&cc.missing);
            goto bad;
        }
        buf_free(&cc.missing);
        for (int g = 0; g < ng; g++) {
            buf pat;
            buf_init(&pat);
            buf_printf(&pat, "{%s}", grids[g].name);
            int used = strstr(c.launch, pat.data) != NULL;
            buf_free(&pat);
            if (!used) {
                errf(&e, ERR_INVAL, "--grid %s: the --launch command has no {%s}", grids[g].name, grids[g].name);
                goto bad;
            }
        }
    }
    char host[256];
    int port;
    if (sweep_url_host_port(c.bo.base_url, host, sizeof host, &port, &e)) goto bad;
    if (!sweep_port_free(host, port)) {
        errf(&e, ERR_INVAL, "--base-url %s: something already listens on port %d; stop it first", c.bo.base_url, port);
        goto bad;
    }
    char tmpl[] = "/tmp/laststand-sweep-XXXXXX";
    if (!c.log_dir) {
        if (!mkdtemp(tmpl)) {
            fprintf(stderr, "laststand: error: mkdtemp %s: %s\n", tmpl, strerror(errno));
            exit_code = 1;
            goto out;
        }
        c.log_dir = tmpl;
    } else if (mkdir(c.log_dir, 0755) && errno != EEXIST) {
        fprintf(stderr, "laststand: error: --log-dir %s: %s\n", c.log_dir, strerror(errno));
        exit_code = 1;
        goto out;
    }
    sweep_install_signal_handlers();

    int npts = 1;
    for (int g = 0; g < ng; g++) npts *= grids[g].n;
    log_info("sweep: %d points, logs in %s", npts, c.log_dir);
    point_result *pr = xcalloc(npts, sizeof *pr);
    int *idx = xcalloc(ng, sizeof(int));
    int **pidx = xcalloc(npts, sizeof(int *));
    int done = 0;
    for (int pt = 0; pt < npts; pt++) {
        /* odometer over the grids, last grid fastest (itertools.product order) */
        int r = pt;
        for (int g = ng - 1; g >= 0; g--) {
            idx[g] = r % grids[g].n;
            r /= grids[g].n;
        }
        pidx[pt] = xmalloc(sizeof(int) * ng);
        memcpy(pidx[pt], idx, sizeof(int) * ng);
        char *cmd = substitute(c.launch, grids, ng, idx);
        if (!wait_port_free(host, port, 60)) {
            fprintf(stderr, "laststand: error: port %d is still taken 60 s after the previous server was stopped\n", port);
            free(cmd);
            exit_code = 1;
            break;
        }
        log_info("sweep: point %d/%d: %s", pt + 1, npts, cmd);
        run_point(&c, cmd, pt, &pr[pt]);
        log_info("sweep: point %d/%d: %s: %s", pt + 1, npts, pr[pt].verdict, pr[pt].evidence ? pr[pt].evidence : "");
        free(cmd);
        done++;
        if (!wait_port_free(host, port, 60)) log_warn("sweep: port %d still taken after stopping point %d", port, pt + 1);
    }

    /* markdown matrix */
    printf("| # |");
    for (int g = 0; g < ng; g++) printf(" %s |", grids[g].name);
    printf(" verdict | evidence |\n|---|");
    for (int g = 0; g < ng; g++) printf("---|");
    printf("---|---|\n");
    for (int pt = 0; pt < done; pt++) {
        printf("| %d |", pt + 1);
        for (int g = 0; g < ng; g++) {
            fputc(' ', stdout);
            md_cell(stdout, grids[g].vals[pidx[pt][g]]);
            fputs(" |", stdout);
        }
        printf(" %s | ", pr[pt].verdict);
        md_cell(stdout, pr[pt].evidence ? pr[pt].evidence : "");
        printf(" |\n");
    }
    fflush(stdout);

    if (json_path) {
        json_t *j = json_object();
        json_object_set_new(j, "launch", json_string(c.launch));
        json_object_set_new(j, "base_url", json_string(c.bo.base_url));
        json_object_set_new(j, "log_dir", json_string(c.log_dir));
        json_t *jg = json_object();
        for (int g = 0; g < ng; g++) {
            json_t *a = json_array();
            for (int v = 0; v < grids[g].n; v++) json_array_append_new(a, json_string(grids[g].vals[v]));
            json_object_set_new(jg, grids[g].name, a);
        }
        json_object_set_new(j, "grids", jg);
        json_t *pts = json_array();
        for (int pt = 0; pt < done; pt++) {
            point_result *p = &pr[pt];
            json_t *o = json_object(), *params = json_object(), *tail = json_array();
            for (int g = 0; g < ng; g++) json_object_set_new(params, grids[g].name, json_string(grids[g].vals[pidx[pt][g]]));
            for (int l = 0; l < p->n_tail; l++) {
                json_t *s = json_string(p->log_tail[l]);
                json_array_append_new(tail, s ? s : json_string("(line is not valid UTF-8)"));
            }
            json_object_set_new(o, "params", params);
            json_object_set_new(o, "command", json_string(p->command));
            json_object_set_new(o, "verdict", json_string(p->verdict));
            json_t *ev = p->evidence ? json_string(p->evidence) : NULL;
            json_object_set_new(o, "evidence", ev ? ev : json_string("(evidence is not valid UTF-8)"));
            if (!strcmp(p->verdict, "crash") && p->exited) {
                char *ex = sweep_exit_text(p->exit_status);
                json_object_set_new(o, "exit", json_string(ex));
                free(ex);
            }
            json_object_set_new(o, "startup_s", p->startup_s > 0 ? json_real(p->startup_s) : json_null());
            json_object_set_new(o, "log_file", json_string(p->log_path));
            json_object_set_new(o, "log_tail", tail);
            json_object_set_new(o, "smoke", p->smoke ? json_incref(p->smoke) : json_null());
            json_object_set_new(o, "bench", p->bench ? json_incref(p->bench) : json_null());
            json_array_append_new(pts, o);
        }
        json_object_set_new(j, "points", pts);
        if (json_dump_file(j, json_path, JSON_INDENT(1) | JSON_REAL_PRECISION(10))) {
            fprintf(stderr, "laststand: error: --json %s: cannot write\n", json_path);
            exit_code = 1;
        }
        json_decref(j);
    }
    for (int pt = 0; pt < npts; pt++) {
        point_result *p = &pr[pt];
        free(p->evidence), free(p->command), free(p->log_path), free(pidx[pt]);
        sweep_lines_free(p->log_tail, p->n_tail);
        json_decref(p->smoke), json_decref(p->bench);
    }
    free(pr), free(idx), free(pidx);
    goto out;
bad:
    fprintf(stderr, "laststand: error: %s\n", e.msg);
    exit_code = 2;
out:
    for (int g = 0; g < ng; g++) grid_free(&grids[g]);
    free(grids);
    bench_opts_free(&c.bo);
    return exit_code;
}
