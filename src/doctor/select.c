/* select.c: the doctor's decision for serve with `auto` (select.h): a cached
 * report or a fresh run, and per-backend verdicts over the buckets the server
 * uses.
 *
 * Owns nothing beyond the report it returns (the caller json_decref's it).
 * Invariants: a backend is "ok" only when every cell of every shape of its
 * family at every requested bucket has status "ok"; a bucket missing from a
 * report counts as a failure ("missing"), never as a pass.
 */
#include "doctor/select.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *jstr(json_t *j) {
    const char *s = json_string_value(j);
    return s ? s : "";
}

int doctor_ensure(const doctor_opts *o, const doc_shapes *s, json_t **report, int *from_cache, char *path,
                  size_t pn, ls_err *e) {
    *report = NULL;
    *from_cache = 0;
    ls_err le = {0};
    json_t *r = doctor_cache_lookup(o, s, path, pn, &le);
    if (r) {
        *from_cache = 1;
        *report = r;
        return 0;
    }
    if (le.code && le.code != ERR_IO) { /* the device itself cannot be opened */
        *e = le;
        return le.code;
    }
    int rc = doctor_run(o, s, e);
    if (rc < 0) return rc;
    r = doctor_cache_lookup(o, s, path, pn, e);
    if (!r) return err_prefix(e, "doctor ran but its decision could not be read back");
    *report = r;
    return 0;
}

int doctor_has_family(json_t *report, const char *family) {
    size_t i;
    json_t *tab;
    json_array_foreach(json_object_get(report, "tables"), i, tab)
        if (!strcmp(jstr(json_object_get(tab, "family")), family)) return 1;
    return 0;
}

/* Record a failure of verdict v at bucket M (first failure's detail kept,
 * buckets of that same status accumulated). */
static void fail_at(doc_verdict *v, const char *status, int M, const char *detail, char *where, size_t wn) {
    if (!v->ok && v->status[0] && strcmp(v->status, status)) return; /* keep the first status */
    if (v->ok || !v->status[0]) {
        v->ok = 0;
        snprintf(v->status, sizeof v->status, "%s", status);
        snprintf(v->detail, sizeof v->detail, "%s", detail ? detail : "");
    }
    char mk[16];
    snprintf(mk, sizeof mk, "%d", M);
    /* each bucket once */
    size_t l = strlen(mk);
    for (const char *p = where; *p;) {
        size_t k = strcspn(p, ",");
        if (k == l && !strncmp(p, mk, l)) return;
        p += k + (p[k] == ',');
    }
    size_t n = strlen(where);
    snprintf(where + n, wn - n, "%s%s", n ? "," : "", mk);
}

int doctor_verdicts(json_t *report, const char *family, const int *ms, int n_ms, doc_verdict *out, int max) {
    int n = 0;
    char where[64][128];
    size_t i;
    json_t *tab;
    json_array_foreach(json_object_get(report, "tables"), i, tab) {
        if (strcmp(jstr(json_object_get(tab, "family")), family)) continue;
        json_t *cells = json_object_get(tab, "cells"), *tonly = json_object_get(tab, "test_only");
        size_t b;
        json_t *bn;
        json_array_foreach(json_object_get(tab, "backends"), b, bn) {
            const char *name = json_string_value(bn);
            if (!name) continue;
            int k = 0;
            while (k < n && strcmp(out[k].name, name)) k++;
            if (k == n) {
                if (n >= max || n >= 64) continue;
                memset(&out[k], 0, sizeof out[k]);
                snprintf(out[k].name, sizeof out[k].name, "%s", name);
                out[k].ok = 1;
                where[k][0] = 0;
                size_t q;
                json_t *tn;
                json_array_foreach(tonly, q, tn) out[k].test_only |= !strcmp(jstr(tn), name);
                n++;
            }
            doc_verdict *v = &out[k];
            json_t *row = json_object_get(cells, name);
            for (int m = 0; m < n_ms; m++) {
                char mk[16];
                snprintf(mk, sizeof mk, "%d", ms[m]);
                json_t *c = json_object_get(row, mk);
                const char *st = c ? json_string_value(json_object_get(c, "status")) : NULL;
                if (!st) {
                    fail_at(v, "missing", ms[m], "the doctor's report has no result for this bucket", where[k],
                            sizeof where[k]);
                } else if (strcmp(st, "ok")) {
                    fail_at(v, st, ms[m], json_string_value(json_object_get(c, "detail")), where[k], sizeof where[k]);
                } else {
                    double t = json_number_value(json_object_get(c, "ms"));
                    if (isfinite(t)) v->ms += t;
                }
            }
        }
    }
    for (int k = 0; k < n; k++)
        if (!out[k].ok) {
            char d[sizeof out[k].detail];
            snprintf(d, sizeof d, "%s", out[k].detail);
            snprintf(out[k].detail, sizeof out[k].detail, "at M=%.100s: %.480s", where[k], d);
        }
    return n;
}

int doctor_bucket(json_t *report, const char *family, const char *backend, int M, double *ms, char *status,
                  size_t sn) {
    double sum = 0;
    int n_tab = 0;
    char mk[16];
    snprintf(mk, sizeof mk, "%d", M);
    if (status && sn) status[0] = 0;
    size_t i;
    json_t *tab;
    json_array_foreach(json_object_get(report, "tables"), i, tab) {
        if (strcmp(jstr(json_object_get(tab, "family")), family)) continue;
        n_tab++;
        json_t *c = json_object_get(json_object_get(json_object_get(tab, "cells"), backend), mk);
        const char *st = c ? json_string_value(json_object_get(c, "status")) : NULL;
        if (!st || strcmp(st, "ok")) {
            if (status) snprintf(status, sn, "%s", st ? st : "missing");
            return 0;
        }
        double t = json_number_value(json_object_get(c, "ms"));
        if (isfinite(t)) sum += t;
    }
    if (!n_tab) {
        if (status) snprintf(status, sn, "missing");
        return 0;
    }
    if (ms) *ms = sum;
    return 1;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

int doctor_plan(json_t *report, const char *family, const int *ms, int n_ms, const char *const *names, int nn,
                doc_plan *out, ls_err *e) {
    memset(out, 0, sizeof *out);
    if (n_ms <= 0 || n_ms > DOC_MAX_M) return errf(e, ERR_INVAL, "doctor plan for %s: %d buckets", family, n_ms);
    int b[DOC_MAX_M];
    memcpy(b, ms, sizeof(int) * n_ms);
    qsort(b, n_ms, sizeof b[0], cmp_int);
    for (int m = 0; m < n_ms; m++) {
        if (m && b[m] == b[m - 1]) continue;
        int best = -1;
        double bt = INFINITY;
        for (int k = 0; k < nn; k++) {
            double t = 0;
            if (doctor_bucket(report, family, names[k], b[m], &t, NULL, 0) && (best < 0 || t < bt)) {
                best = k;
                bt = t;
            }
        }
        if (best < 0) return errf(e, ERR_UNSUPPORTED, "no correct %s backend at M=%d", family, b[m]);
        if (out->n) { /* within DOC_PLAN_KEEP of the fastest, the previous entry's backend keeps its run */
            for (int k = 0; k < nn; k++) {
                double t = 0;
                if (k != best && !strcmp(names[k], out->name[out->n - 1]) &&
                    doctor_bucket(report, family, names[k], b[m], &t, NULL, 0) && t <= bt * DOC_PLAN_KEEP)
                    best = k;
            }
        }
        if (out->n && !strcmp(out->name[out->n - 1], names[best])) {
            out->max_m[out->n - 1] = b[m];
        } else if (out->n < DOC_PLAN_MAX) {
            snprintf(out->name[out->n], sizeof out->name[0], "%s", names[best]);
            out->max_m[out->n++] = b[m];
        } else {
            return errf(e, ERR_UNSUPPORTED, "the %s picks change more than %d times over the buckets", family,
                        DOC_PLAN_MAX - 1);
        }
    }
    out->max_m[out->n - 1] = 0;
    return 0;
}

void doctor_plan_text(const doc_plan *p, char *out, size_t n) {
    size_t o = 0;
    if (n) out[0] = 0;
    for (int i = 0; i < p->n && o < n; i++) {
        int w = p->max_m[i] > 0 && i + 1 < p->n ? snprintf(out + o, n - o, "%s%s:%d", i ? "," : "", p->name[i], p->max_m[i])
                                                : snprintf(out + o, n - o, "%s%s", i ? "," : "", p->name[i]);
        if (w < 0) break;
        o += (size_t)w;
    }
}
