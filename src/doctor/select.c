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
