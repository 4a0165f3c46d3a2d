/* sweep.h: pieces of `laststand sweep` (internal to src/cli): the launched
 * server process and its log, health and port checks, and the smoke test
 * that judges a server's output as garbage or not.
 */
#ifndef LS_CLI_SWEEP_H
#define LS_CLI_SWEEP_H

#include "cli/bench.h"

#include <sys/types.h>

/* ---- the server process ----------------------------------------------------- */
typedef struct sweep_proc {
    pid_t pid;          /* leader of its own process group (setsid) */
    int exited;         /* the leader has been reaped */
    int status;         /* its wait status when exited */
} sweep_proc;

/* Starts `/bin/sh -c cmd` in a new session, stdout and stderr to log_path. */
int sweep_launch(const char *cmd, const char *log_path, sweep_proc *p, ls_err *e);
/* Reaps the leader if it has exited; returns 1 when it has. */
int sweep_poll_exit(sweep_proc *p);
/* SIGTERM to the whole group, SIGKILL after grace_s; reaps the leader. */
void sweep_stop(sweep_proc *p, double grace_s);
/* "exit code 2", "killed by signal 6 (SIGABRT)", ... (malloc'd) */
char *sweep_exit_text(int status);
/* Last n lines of a file (malloc'd array of malloc'd lines); count in *n_out. */
char **sweep_log_tail(const char *path, int n, int *n_out);
void sweep_lines_free(char **lines, int n);

/* host and port of an http(s) URL (default 80/443). */
int sweep_url_host_port(const char *url, char *host, size_t host_n, int *port, ls_err *e);
/* 1 when nothing accepts a TCP connection on host:port. */
int sweep_port_free(const char *host, int port);

/* The process-group id the signal handler kills if sweep itself is stopped. */
void sweep_set_current_group(pid_t pgid);
void sweep_install_signal_handlers(void);

/* ---- smoke test ------------------------------------------------------------------- */
typedef struct sweep_smoke {
    int n;
    const char **prompts;   /* [n], static */
    char **texts;           /* [n] what came back (malloc'd, may be NULL) */
    char **errors;          /* [n] request errors (malloc'd, may be NULL) */
    int garbage;            /* judged garbage */
    char *reason;           /* why (malloc'd), NULL when fine */
} sweep_smoke;

/* Sends the fixed prompts at once (a mixed batch), greedy, max_tokens tokens,
 * and judges the answers. model may be NULL (discovered). */
int sweep_smoke_run(const char *base_url, const char *api_key, const char *model, int max_tokens,
                    double timeout_s, sweep_smoke *s, ls_err *e);
void sweep_smoke_free(sweep_smoke *s);
/* The judgement of one text: NULL if it looks like language, else a reason
 * (malloc'd): empty output, a character or short unit repeated 16+ times,
 * invalid UTF-8. */
char *sweep_judge_text(const char *text, size_t len);

#endif
