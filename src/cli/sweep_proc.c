/* sweep_proc.c: the server process of one sweep point.
 *
 * The launch command runs as `/bin/sh -c CMD` in a new session (setsid), so it
 * and everything it starts share one process group that is stopped as a
 * whole: SIGTERM to the group, then SIGKILL after a grace period. Its stdout
 * and stderr go to a log file whose last lines are the evidence of a crash.
 *
 * Owns: the launched group until sweep_stop; the signal handler that stops
 * that group if sweep itself is interrupted (no server is left behind).
 */
#include "cli/sweep.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile pid_t g_current_pgid = 0;

void sweep_set_current_group(pid_t pgid) { g_current_pgid = pgid; }

static void on_fatal_signal(int sig) {
    pid_t g = g_current_pgid;
    if (g > 0) kill(-g, SIGKILL);
    signal(sig, SIG_DFL);
    raise(sig);
}

void sweep_install_signal_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

int sweep_launch(const char *cmd, const char *log_path, sweep_proc *p, ls_err *e) {
    memset(p, 0, sizeof *p);
    int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return errf(e, ERR_IO, "server log %s: %s", log_path, strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        close(fd);
        return errf(e, ERR_RUNTIME, "fork: %s", strerror(errno));
    }
    if (pid == 0) {
        setsid();
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) dup2(devnull, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        /* no inherited sockets or files beyond stdio */
        long maxfd = sysconf(_SC_OPEN_MAX);
        if (maxfd < 0 || maxfd > 65536) maxfd = 65536;
        for (long k = 3; k < maxfd; k++) close((int)k);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        dprintf(2, "laststand sweep: exec /bin/sh failed: %s\n", strerror(errno));
        _exit(127);
    }
    close(fd);
    p->pid = pid;
    /* the child calls setsid itself; do it here too so the group exists
     * before we might signal it (one of the two calls wins, both are fine) */
    setpgid(pid, pid);
    sweep_set_current_group(pid);
    return 0;
}

int sweep_poll_exit(sweep_proc *p) {
    if (p->exited) return 1;
    int st;
    pid_t r = waitpid(p->pid, &st, WNOHANG);
    if (r == p->pid) {
        p->exited = 1;
        p->status = st;
        return 1;
    }
    return 0;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* 1 while any process of the group is alive (zombie leader reaped first). */
static int group_alive(sweep_proc *p) {
    sweep_poll_exit(p);
    return kill(-p->pid, 0) == 0 || errno == EPERM;
}

void sweep_stop(sweep_proc *p, double grace_s) {
    if (p->pid <= 0) return;
    kill(-p->pid, SIGTERM);
    double t_end = now_sec() + grace_s;
    while (group_alive(p) && now_sec() < t_end) sleep_s(0.05);
    if (group_alive(p)) {
        kill(-p->pid, SIGKILL);
        double t_kill = now_sec() + 10;
        while (group_alive(p) && now_sec() < t_kill) sleep_s(0.05);
    }
    if (!p->exited) {
        int st;
        if (waitpid(p->pid, &st, 0) == p->pid) p->exited = 1, p->status = st;
    }
    sweep_set_current_group(0);
}

char *sweep_exit_text(int status) {
    buf b;
    buf_init(&b);
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        const char *ab = sigabbrev_np(sig);
        buf_printf(&b, "killed by signal %d (SIG%s)%s", sig, ab ? ab : "?", WCOREDUMP(status) ? ", core dumped" : "");
    } else if (WIFEXITED(status)) {
        int code = WEXITSTATUS(status);
        buf_printf(&b, "exit code %d", code);
        if (code > 128 && code < 128 + 65) {
            const char *ab = sigabbrev_np(code - 128);
            buf_printf(&b, " (its command died of signal %d, SIG%s)", code - 128, ab ? ab : "?");
        }
    } else {
        buf_printf(&b, "wait status 0x%x", status);
    }
    return buf_detach(&b);
}

char **sweep_log_tail(const char *path, int n, int *n_out) {
    *n_out = 0;
    size_t len = 0;
    char *all = read_file(path, &len, NULL);
    if (!all) return NULL;
    char **lines = xcalloc(n > 0 ? n : 1, sizeof(char *));
    /* walk back over n non-empty lines */
    size_t end = len;
    int got = 0;
    while (got < n && end > 0) {
        while (end > 0 && (all[end - 1] == '\n' || all[end - 1] == '\r')) end--;
        if (!end) break;
        size_t start = end;
        while (start > 0 && all[start - 1] != '\n') start--;
        size_t m = end - start;
        if (m > 400) m = 400; /* one line of evidence, not a megabyte */
        char *line = xmalloc(m + 1);
        memcpy(line, all + start, m);
        line[m] = 0;
        for (size_t k = 0; k < m; k++)
            if (line[k] == '\r') line[k] = ' ';
        lines[got++] = line;
        end = start;
    }
    /* reverse into file order */
    for (int i = 0; i < got / 2; i++) {
        char *t = lines[i];
        lines[i] = lines[got - 1 - i];
        lines[got - 1 - i] = t;
    }
    free(all);
    *n_out = got;
    return lines;
}

void sweep_lines_free(char **lines, int n) {
    for (int i = 0; i < n; i++) free(lines[i]);
    free(lines);
}

int sweep_url_host_port(const char *url, char *host, size_t host_n, int *port, ls_err *e) {
    const char *p = strstr(url, "://");
    if (!p) return errf(e, ERR_INVAL, "--base-url: '%s' has no scheme", url);
    int https = !strncmp(url, "https", 5);
    p += 3;
    const char *end = p + strcspn(p, "/?#");
    const char *hs = p, *he;
    if (*p == '[') { /* [v6]:port */
        hs = p + 1;
        he = memchr(hs, ']', end - hs);
        if (!he) return errf(e, ERR_INVAL, "--base-url: '%s' has an unclosed [", url);
        p = he + 1;
    } else {
        he = memchr(p, ':', end - p);
        if (!he) he = end;
        p = he;
    }
    if ((size_t)(he - hs) + 1 > host_n || he == hs) return errf(e, ERR_INVAL, "--base-url: bad host in '%s'", url);
    memcpy(host, hs, he - hs);
    host[he - hs] = 0;
    *port = https ? 443 : 80;
    if (p < end && *p == ':') {
        char *q;
        long v = strtol(p + 1, &q, 10);
        if (q != end || v <= 0 || v > 65535) return errf(e, ERR_INVAL, "--base-url: bad port in '%s'", url);
        *port = (int)v;
    }
    return 0;
}

int sweep_port_free(const char *host, int port) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    if (getaddrinfo(host, ps, &hints, &res) || !res) return 1;
    int free_ = 1;
    for (struct addrinfo *a = res; a && free_; a = a->ai_next) {
        int s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (s < 0) continue;
        if (connect(s, a->ai_addr, a->ai_addrlen) == 0) free_ = 0;
        close(s);
    }
    freeaddrinfo(res);
    return free_;
}
