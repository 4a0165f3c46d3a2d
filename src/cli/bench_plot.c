/* bench_plot.c: the SVG chart of a concurrency sweep, written by hand.
 *
 * x: concurrency levels, evenly spaced in run order (levels are usually
 * powers of two, so this is a log axis in practice) and labelled with their
 * values; left y: output token throughput (tok/s, blue, solid); right y:
 * median TPOT (ms, orange, dashed). Both y axes start at 0 and end at a
 * "nice" number (1, 2, 2.5, 5 x 10^k) above the largest value.
 */
#include "cli/bench.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static double nice_ceil(double v) {
    if (!(v > 0)) return 1;
    double p = pow(10, floor(log10(v)));
    static const double steps[] = {1, 2, 2.5, 5, 10};
    for (int i = 0; i < 5; i++)
        if (v <= steps[i] * p * (1 + 1e-12)) return steps[i] * p;
    return 10 * p;
}

static void xml_text(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else fputc(*s, f);
    }
}

int bench_plot_svg(const char *path, const bench_result *rs, int n, const char *title, ls_err *e) {
    FILE *f = fopen(path, "w");
    if (!f) return errf(e, ERR_IO, "--plot %s: %s", path, strerror(errno));
    const double W = 760, H = 440, L = 80, R = 80, T = 60, B = 70;
    const double pw = W - L - R, ph = H - T - B;
    double ymax_thr = 0, ymax_tpot = 0;
    for (int i = 0; i < n; i++) {
        if (rs[i].output_throughput > ymax_thr) ymax_thr = rs[i].output_throughput;
        if (rs[i].tpot.median > ymax_tpot) ymax_tpot = rs[i].tpot.median;
    }
    ymax_thr = nice_ceil(ymax_thr * 1.05);
    ymax_tpot = nice_ceil(ymax_tpot * 1.05);
#define XP(i) (L + (n > 1 ? pw * (i) / (n - 1) : pw / 2))
#define YT(v) (T + ph - ph * (v) / ymax_thr)
#define YP(v) (T + ph - ph * (v) / ymax_tpot)
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
               "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n", W, H, W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%.1f\" y=\"28\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">", W / 2);
    xml_text(f, title ? title : "laststand bench");
    fprintf(f, "</text>\n");
    /* grid and y ticks (5 intervals on both axes so grid lines are shared) */
    for (int k = 0; k <= 5; k++) {
        double y = T + ph - ph * k / 5.0;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e0e0e0\"/>\n", L, y, L + pw, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#1f77b4\">%g</text>\n", L - 8, y + 4,
                ymax_thr * k / 5.0);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"start\" fill=\"#d62728\">%g</text>\n", L + pw + 8, y + 4,
                ymax_tpot * k / 5.0);
    }
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#444\"/>\n", L, T, pw, ph);
    for (int i = 0; i < n; i++) {
        char lab[32];
        if (rs[i].max_concurrency > 0) snprintf(lab, sizeof lab, "%d", rs[i].max_concurrency);
        else snprintf(lab, sizeof lab, "inf");
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\"/>\n", XP(i), T + ph, XP(i), T + ph + 5);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", XP(i), T + ph + 20, lab);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">max concurrency</text>\n", L + pw / 2, H - 22);
    fprintf(f, "<text transform=\"translate(22,%.1f) rotate(-90)\" text-anchor=\"middle\" fill=\"#1f77b4\">"
               "output throughput (tok/s)</text>\n", T + ph / 2);
    fprintf(f, "<text transform=\"translate(%.1f,%.1f) rotate(90)\" text-anchor=\"middle\" fill=\"#d62728\">"
               "median TPOT (ms)</text>\n", W - 22, T + ph / 2);
    /* series */
    fprintf(f, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2.5\" points=\"");
    for (int i = 0; i < n; i++) fprintf(f, "%.1f,%.1f ", XP(i), YT(rs[i].output_throughput));
    fprintf(f, "\"/>\n");
    fprintf(f, "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"2.5\" stroke-dasharray=\"6,4\" points=\"");
    for (int i = 0; i < n; i++) fprintf(f, "%.1f,%.1f ", XP(i), YP(rs[i].tpot.median));
    fprintf(f, "\"/>\n");
    for (int i = 0; i < n; i++) {
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#1f77b4\"><title>%.2f tok/s</title></circle>\n",
                XP(i), YT(rs[i].output_throughput), rs[i].output_throughput);
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"8\" height=\"8\" fill=\"#d62728\"><title>%.2f ms</title></rect>\n",
                XP(i) - 4, YP(rs[i].tpot.median) - 4, rs[i].tpot.median);
    }
    /* legend */
    double lx = L + 12, ly = T + 14;
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"210\" height=\"44\" fill=\"white\" fill-opacity=\"0.85\" stroke=\"#ccc\"/>\n",
            lx - 6, ly - 12);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#1f77b4\" stroke-width=\"2.5\"/>\n", lx, ly, lx + 26, ly);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">output throughput (tok/s)</text>\n", lx + 34, ly + 4);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#d62728\" stroke-width=\"2.5\" "
               "stroke-dasharray=\"6,4\"/>\n", lx, ly + 20, lx + 26, ly + 20);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">median TPOT (ms)</text>\n", lx + 34, ly + 24);
    fprintf(f, "</svg>\n");
#undef XP
#undef YT
#undef YP
    if (fclose(f)) return errf(e, ERR_IO, "--plot %s: %s", path, strerror(errno));
    return 0;
}
