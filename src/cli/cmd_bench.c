/* cmd_bench.c: `laststand bench`, the client side of a serving benchmark
 * against any OpenAI-compatible server (ours, SGLang, vLLM, llama.cpp), with
 * sglang.bench_serving's metric definitions. The work is in bench_*.c; this
 * file parses the command line and sets the exit code:
 *   0 every level ran and had successful requests, 1 a level had none (or the
 *   run failed), 2 bad flags.
 */
#include "cli/bench.h"
#include "cli/cli.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: laststand bench --base-url URL [flags]\n\n"
               "Serving benchmark with sglang.bench_serving's metrics (TTFT, TPOT, ITL, E2E; throughputs;\n"
               "concurrency) on the random dataset. Table on stdout, one per concurrency level; its last\n"
               "line is the headline.\n\nflags:\n%s",
            BENCH_FLAGS_HELP);
}

int cmd_bench(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN); /* a server closing a connection is a failed request, not our death */
    bench_opts o;
    bench_opts_default(&o);
    ls_err e = {0};
    for (int i = 1; i < argc;) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            bench_opts_free(&o);
            return 0;
        }
        int rc = bench_opts_parse_flag(&o, argc, argv, &i, &e);
        if (rc < 0) goto bad;
        if (rc == 0) {
            errf(&e, ERR_INVAL, "unknown flag '%s' (see laststand bench --help)", argv[i]);
            goto bad;
        }
    }
    if (bench_opts_check(&o, &e)) goto bad;
    bench_result *rs = NULL;
    char *model = NULL;
    int rc = bench_run(&o, &rs, &model, &e);
    if (rc) {
        fprintf(stderr, "laststand: error: %s\n", e.msg);
        bench_opts_free(&o);
        return err_exit_code(rc);
    }
    int nlev = o.n_conc ? o.n_conc : 1, exit_code = 0;
    for (int i = 0; i < nlev; i++) {
        if (rs[i].completed == 0) {
            fprintf(stderr, "laststand: error: every request at concurrency %d failed\n", rs[i].max_concurrency);
            exit_code = 1;
        }
        bench_result_free(&rs[i]);
    }
    free(rs);
    free(model);
    bench_opts_free(&o);
    return exit_code;
bad:
    fprintf(stderr, "laststand: error: %s\n", e.msg);
    bench_opts_free(&o);
    return 2;
}
