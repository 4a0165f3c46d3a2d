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

/* (additive) Backend over every shape of family at bucket M: 1 when every cell is "ok"
 * (*ms: their summed time), else 0 with status (if not NULL) the first failing cell's
 * ("wrong", "crash", "unsupported", "unverified", or "missing" when the report has no
 * cell). */
int doctor_bucket(json_t *report, const char *family, const char *backend, int M, double *ms, char *status,
                  size_t sn);

/* A per-bucket plan: entry i takes M up to max_m[i] (the last bucket of its run of
 * buckets); the last entry has no bound (max_m 0). */
#define DOC_PLAN_MAX 8
#define DOC_PLAN_KEEP 1.05
typedef struct doc_plan {
    int n;
    char name[DOC_PLAN_MAX][64];
    int max_m[DOC_PLAN_MAX];
} doc_plan;

/* The plan the report implies for family at the buckets ms (any order): per bucket
 * the fastest of names[0..nn) that is ok there (doctor_bucket; ties: the earlier
 * name), except that the previous bucket's pick stays when it is ok there and within
 * DOC_PLAN_KEEP of the fastest (timing noise of a few percent does not split a plan);
 * consecutive equal picks merged, the last entry unbounded. Returns 0, or
 * ERR_UNSUPPORTED with e naming the first bucket where none of the names is ok (or
 * saying the plan would need more than DOC_PLAN_MAX entries). */
int doctor_plan(json_t *report, const char *family, const int *ms, int n_ms, const char *const *names, int nn,
                doc_plan *out, ls_err *e);
/* The text form of a plan, as ops_plan_parse reads it: "a:8,b" (one entry: "a"). */
void doctor_plan_text(const doc_plan *p, char *out, size_t n);

#endif
