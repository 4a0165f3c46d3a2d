/* select.h: the doctor's decision as serve with `auto` needs it.
 *
 * doctor_ensure returns the report of a previous run with the same key
 * (doctor_cache_lookup) or runs the doctor now and returns what it cached;
 * doctor_verdicts turns a report into one verdict per backend of a family,
 * restricted to the buckets the caller will use. Additive to doctor.h (the
 * doctor's own files are not changed).
 */
#ifndef LS_DOCTOR_SELECT_H
#define LS_DOCTOR_SELECT_H

#include "doctor/doctor.h"

/* The report for (o, s): cached, or from a fresh doctor_run (its matrix goes
 * to stdout, progress to stderr). *from_cache says which; path receives the
 * cache file. Returns 0, or negative ERR_* with e filled (device unusable,
 * cache not writable after the run). A run that leaves a bucket without a
 * correct backend still returns 0: the verdicts say which. */
int doctor_ensure(const doctor_opts *o, const doc_shapes *s, json_t **report, int *from_cache, char *path,
                  size_t pn, ls_err *e);

/* One backend of one family over the chosen buckets, every shape of the family. */
typedef struct doc_verdict {
    char name[64];
    int test_only;
    int ok;               /* status "ok" at every bucket and shape */
    double ms;            /* sum of the times over buckets and shapes (ok only) */
    char status[16];      /* the first failure: "wrong" | "crash" | "unsupported" | "unverified" | "missing" */
    char detail[600];     /* "at M=1,16: <the first failure's detail>" */
} doc_verdict;

/* Whether the report tested family at all (the model has that op). */
int doctor_has_family(json_t *report, const char *family);
/* Verdicts of family's backends, in the report's order (the reference first).
 * ms / n_ms: the buckets to judge (each must be in the report). Returns the
 * count (<= max). */
int doctor_verdicts(json_t *report, const char *family, const int *ms, int n_ms, doc_verdict *out, int max);

#endif
