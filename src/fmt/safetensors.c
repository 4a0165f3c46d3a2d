/* safetensors.c: read (mmap) and write safetensors checkpoints.
 *
 * File format: an 8-byte little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {str: str}}, then the data buffer; offsets are relative to
 * the start of the data buffer (byte 8 + N).
 *
 * Owns: the mappings of every opened file, the tensor table (names are
 * set-owned copies), and for in-memory sets the adopted data buffers.
 * Invariants: every tensor in a set has a unique name, a known dtype,
 * non-negative dims and nbytes == numel x dtype size; file-backed tensors lie
 * entirely inside their file's data buffer and do not overlap each other.
 * Every error message names the file, and the tensor where one is at fault.
 */
#include "fmt/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The HF reference rejects headers above 100 MB; so do we. */
#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)

/* ---- dtypes -------------------------------------------------------------- */

static const struct { const char *name; size_t size; } dtypes[ST_NDTYPES] = {
    [ST_BF16] = {"BF16", 2},    [ST_F16] = {"F16", 2},     [ST_F32] = {"F32", 4},
    [ST_F64] = {"F64", 8},      [ST_U8] = {"U8", 1},       [ST_I8] = {"I8", 1},
    [ST_I16] = {"I16", 2},      [ST_I32] = {"I32", 4},     [ST_I64] = {"I64", 8},
    [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1}, [ST_BOOL] = {"BOOL", 1},
};

const char *st_dtype_name(st_dtype t) { return t >= 0 && t < ST_NDTYPES ? dtypes[t].name : "?"; }
size_t st_dtype_size(st_dtype t) { return t >= 0 && t < ST_NDTYPES ? dtypes[t].size : 0; }

int st_dtype_parse(const char *s) {
    if (!s) return -1;
    for (int i = 0; i < ST_NDTYPES; i++)
        if (!strcmp(s, dtypes[i].name)) return i;
    return -1;
}

/* ---- the set ------------------------------------------------------------- */

typedef struct st_file {
    char *path;
    void *map;   /* MAP_FAILED-free: NULL when size is 0 */
    size_t size;
} st_file;

struct st_set {
    st_tensor *t;      /* [n] */
    int n, cap;
    int *slots;        /* open-addressing name hash -> index into t, -1 empty; [nslots] */
    int nslots;
    void **owned;      /* per tensor: adopted buffer (in-memory sets) or NULL; [cap] */
    st_file *files;    /* [nfiles] */
    int nfiles;
};

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static void rehash(st_set *s) {
    int ns = s->nslots ? s->nslots * 2 : 64;
    free(s->slots);
    s->slots = xmalloc(sizeof(int) * ns);
    for (int i = 0; i < ns; i++) s->slots[i] = -1;
    s->nslots = ns;
    for (int i = 0; i < s->n; i++) {
        uint64_t h = name_hash(s->t[i].name) & (uint64_t)(ns - 1);
        while (s->slots[h] >= 0) h = (h + 1) & (uint64_t)(ns - 1);
        s->slots[h] = i;
    }
}

static int find_index(const st_set *s, const char *name) {
    if (!s->nslots) return -1;
    uint64_t h = name_hash(name) & (uint64_t)(s->nslots - 1);
    while (s->slots[h] >= 0) {
        if (!strcmp(s->t[s->slots[h]].name, name)) return s->slots[h];
        h = (h + 1) & (uint64_t)(s->nslots - 1);
    }
    return -1;
}

/* Append a tensor whose fields are already validated; the name is copied.
 * Returns its index, or -1 when the name already exists. */
static int push_tensor(st_set *s, const st_tensor *t, void *owned) {
    if (find_index(s, t->name) >= 0) return -1;
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->t = xrealloc(s->t, sizeof(st_tensor) * s->cap);
        s->owned = xrealloc(s->owned, sizeof(void *) * s->cap);
    }
    int i = s->n++;
    s->t[i] = *t;
    s->t[i].name = xstrdup(t->name);
    s->owned[i] = owned;
    if (2 * s->n > s->nslots) rehash(s);
    else {
        uint64_t h = name_hash(t->name) & (uint64_t)(s->nslots - 1);
        while (s->slots[h] >= 0) h = (h + 1) & (uint64_t)(s->nslots - 1);
        s->slots[h] = i;
    }
    return i;
}

st_set *st_new(void) { return xcalloc(1, sizeof(st_set)); }

void st_close(st_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) {
        free((char *)s->t[i].name);
        free(s->owned[i]);
    }
    for (int i = 0; i < s->nfiles; i++) {
        if (s->files[i].map) munmap(s->files[i].map, s->files[i].size);
        free(s->files[i].path);
    }
    free(s->files);
    free(s->t);
    free(s->owned);
    free(s->slots);
    free(s);
}

int st_count(const st_set *s) { return s ? s->n : 0; }
const st_tensor *st_get(const st_set *s, int i) { return s && i >= 0 && i < s->n ? &s->t[i] : NULL; }
const st_tensor *st_find(const st_set *s, const char *name) {
    int i = s && name ? find_index(s, name) : -1;
    return i >= 0 ? &s->t[i] : NULL;
}

int64_t st_numel(const st_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

/* numel x dtype size without overflow; -1 on overflow. */
static int64_t checked_nbytes(st_dtype dt, int ndim, const int64_t *shape) {
    uint64_t n = st_dtype_size(dt);
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) return -1;
        if (__builtin_mul_overflow(n, (uint64_t)shape[d], &n)) return -1;
    }
    return n > (uint64_t)INT64_MAX ? -1 : (int64_t)n;
}

static void shape_str(char *out, size_t cap, int ndim, const int64_t *shape) {
    size_t k = 0;
    k += snprintf(out + k, cap - k, "[");
    for (int d = 0; d < ndim && k < cap; d++)
        k += snprintf(out + k, cap - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (k < cap) snprintf(out + k, cap - k, "]");
}

static int add_mem(st_set *s, const char *name, st_dtype dt, int ndim, const int64_t *shape, const void *data,
                   size_t nbytes, void *owned, ls_err *e) {
    if (!name || !*name) { free(owned); return errf(e, ERR_INVAL, "<memory>: tensor with an empty name"); }
    if (dt < 0 || dt >= ST_NDTYPES) { free(owned); return errf(e, ERR_INVAL, "<memory>: tensor '%s': bad dtype %d", name, (int)dt); }
    if (ndim < 0 || ndim > ST_MAX_DIMS) { free(owned); return errf(e, ERR_INVAL, "<memory>: tensor '%s': %d dims (at most %d)", name, ndim, ST_MAX_DIMS); }
    int64_t want = checked_nbytes(dt, ndim, shape);
    if (want < 0 || (size_t)want != nbytes) {
        char sh[256];
        shape_str(sh, sizeof sh, ndim, shape);
        free(owned);
        return errf(e, ERR_INVAL, "<memory>: tensor '%s': %zu bytes given for %s %s", name, nbytes,
                    st_dtype_name(dt), sh);
    }
    st_tensor t = {.name = name, .dtype = dt, .ndim = ndim, .data = data, .nbytes = nbytes, .file = "<memory>"};
    for (int d = 0; d < ndim; d++) t.shape[d] = shape[d];
    if (push_tensor(s, &t, owned) < 0) {
        free(owned);
        return errf(e, ERR_INVAL, "<memory>: duplicate tensor '%s'", name);
    }
    return 0;
}

int st_add_owned(st_set *s, const char *name, st_dtype dt, int ndim, const int64_t *shape,
                 void *data, size_t nbytes, ls_err *e) {
    return add_mem(s, name, dt, ndim, shape, data, nbytes, data, e);
}

int st_add_ref(st_set *s, const char *name, st_dtype dt, int ndim, const int64_t *shape,
               const void *data, size_t nbytes, ls_err *e) {
    return add_mem(s, name, dt, ndim, shape, data, nbytes, NULL, e);
}

/* ---- reading one file ---------------------------------------------------- */

typedef struct span { int64_t begin, end; int idx; } span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Read an integer JSON value that must be a non-negative int64. */
static int json_nonneg(json_t *v, int64_t *out) {
    if (!json_is_integer(v)) return -1;
    json_int_t x = json_integer_value(v);
    if (x < 0) return -1;
    *out = (int64_t)x;
    return 0;
}

/* Parse and validate the header of the mapped file f, adding its tensors to s.
 * On error nothing of this file remains in s. */
static int parse_header(st_set *s, st_file *f, ls_err *e) {
    const char *p = f->path;
    if (f->size < 8)
        return errf(e, ERR_INVAL, "%s: file is %zu bytes, too short for a safetensors header (truncated?)", p, f->size);
    const unsigned char *m = f->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | m[i];
    if (hlen > ST_MAX_HEADER)
        return errf(e, ERR_INVAL, "%s: header length %llu is not sane (limit %llu bytes)", p,
                    (unsigned long long)hlen, (unsigned long long)ST_MAX_HEADER);
    if (hlen > f->size - 8)
        return errf(e, ERR_INVAL, "%s: header length %llu runs past the end of the file (size %zu; truncated?)", p,
                    (unsigned long long)hlen, f->size);
    json_error_t je;
    json_t *root = json_loadb((const char *)m + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return errf(e, ERR_INVAL, "%s: header is not valid JSON: %s (at byte %d of the header)", p, je.text, je.position);
    if (!json_is_object(root)) {
        json_decref(root);
        return errf(e, ERR_INVAL, "%s: header is not a JSON object", p);
    }
    const uint64_t data_len = f->size - 8 - hlen;
    const unsigned char *data = m + 8 + hlen;
    int first = s->n, rc = 0, nsp = 0;
    span *sp = xmalloc(sizeof(span) * (json_object_size(root) + 1));
    const char *name;
    json_t *v;
    json_object_foreach(root, name, v) {
        if (!strcmp(name, "__metadata__")) {
            if (json_is_null(v)) continue;
            if (!json_is_object(v)) { rc = errf(e, ERR_INVAL, "%s: __metadata__ is not an object", p); goto fail; }
            const char *mk;
            json_t *mv;
            json_object_foreach(v, mk, mv) if (!json_is_string(mv)) {
                rc = errf(e, ERR_INVAL, "%s: __metadata__ value '%s' is not a string", p, mk);
                goto fail;
            }
            continue;
        }
        if (!*name) { rc = errf(e, ERR_INVAL, "%s: tensor with an empty name", p); goto fail; }
        if (!json_is_object(v)) { rc = errf(e, ERR_INVAL, "%s: tensor '%s': entry is not an object", p, name); goto fail; }
        json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
               *jo = json_object_get(v, "data_offsets");
        if (!json_is_string(jd)) { rc = errf(e, ERR_INVAL, "%s: tensor '%s': missing or non-string dtype", p, name); goto fail; }
        int dt = st_dtype_parse(json_string_value(jd));
        if (dt < 0) { rc = errf(e, ERR_INVAL, "%s: tensor '%s': unknown dtype '%s'", p, name, json_string_value(jd)); goto fail; }
        if (!json_is_array(js)) { rc = errf(e, ERR_INVAL, "%s: tensor '%s': missing or non-array shape", p, name); goto fail; }
        if (json_array_size(js) > ST_MAX_DIMS) {
            rc = errf(e, ERR_INVAL, "%s: tensor '%s': %zu dims (at most %d)", p, name, json_array_size(js), ST_MAX_DIMS);
            goto fail;
        }
        st_tensor t = {.name = name, .dtype = (st_dtype)dt, .ndim = (int)json_array_size(js), .file = f->path};
        for (int d = 0; d < t.ndim; d++)
            if (json_nonneg(json_array_get(js, d), &t.shape[d])) {
                rc = errf(e, ERR_INVAL, "%s: tensor '%s': shape dim %d is not a non-negative integer", p, name, d);
                goto fail;
            }
        int64_t b, en;
        if (!json_is_array(jo) || json_array_size(jo) != 2 || json_nonneg(json_array_get(jo, 0), &b) ||
            json_nonneg(json_array_get(jo, 1), &en)) {
            rc = errf(e, ERR_INVAL, "%s: tensor '%s': data_offsets must be [begin, end] with non-negative integers", p, name);
            goto fail;
        }
        if (en < b) {
            rc = errf(e, ERR_INVAL, "%s: tensor '%s': data_offsets [%lld,%lld] end before they begin", p, name,
                      (long long)b, (long long)en);
            goto fail;
        }
        if ((uint64_t)en > data_len) {
            rc = errf(e, ERR_INVAL, "%s: tensor '%s': data_offsets [%lld,%lld] run past the end of the file (size %zu, data %llu bytes)",
                      p, name, (long long)b, (long long)en, f->size, (unsigned long long)data_len);
            goto fail;
        }
        int64_t want = checked_nbytes(t.dtype, t.ndim, t.shape);
        char sh[256];
        shape_str(sh, sizeof sh, t.ndim, t.shape);
        if (want < 0) { rc = errf(e, ERR_INVAL, "%s: tensor '%s': shape %s overflows", p, name, sh); goto fail; }
        if (want != en - b) {
            rc = errf(e, ERR_INVAL, "%s: tensor '%s': %s %s needs %lld bytes but data_offsets [%lld,%lld] hold %lld", p, name,
                      st_dtype_name(t.dtype), sh, (long long)want, (long long)b, (long long)en, (long long)(en - b));
            goto fail;
        }
        t.data = data + b;
        t.nbytes = (size_t)want;
        int idx = push_tensor(s, &t, NULL);
        if (idx < 0) {
            const st_tensor *o = st_find(s, name);
            rc = errf(e, ERR_INVAL, "%s: tensor '%s': duplicate name (also in %s)", p, name, o ? o->file : "?");
            goto fail;
        }
        sp[nsp++] = (span){b, en, idx};
    }
    /* Overlap check: sorted by begin, each non-empty span must start at or
     * after the furthest end seen so far. Zero-byte tensors overlap nothing. */
    qsort(sp, nsp, sizeof(span), span_cmp);
    int64_t far = 0;
    int far_idx = -1;
    for (int i = 0; i < nsp; i++) {
        if (sp[i].end == sp[i].begin) continue;
        if (far_idx >= 0 && sp[i].begin < far) {
            rc = errf(e, ERR_INVAL, "%s: tensor '%s': data_offsets [%lld,%lld] overlap tensor '%s'", p,
                      s->t[sp[i].idx].name, (long long)sp[i].begin, (long long)sp[i].end, s->t[far_idx].name);
            goto fail;
        }
        if (sp[i].end > far) { far = sp[i].end; far_idx = sp[i].idx; }
    }
    free(sp);
    json_decref(root);
    return 0;
fail:
    /* roll back the tensors of this file */
    while (s->n > first) {
        s->n--;
        free((char *)s->t[s->n].name);
    }
    rehash(s);
    free(sp);
    json_decref(root);
    return rc;
}

/* Map path and add its tensors to s. */
static int add_file(st_set *s, const char *path, ls_err *e) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errf(e, errno == ENOENT || errno == EISDIR ? ERR_INVAL : ERR_IO, "%s: %s", path, strerror(errno));
    struct stat stt;
    if (fstat(fd, &stt) || !S_ISREG(stt.st_mode)) {
        close(fd);
        return errf(e, ERR_INVAL, "%s: not a regular file", path);
    }
    st_file f = {.path = xstrdup(path), .size = (size_t)stt.st_size};
    if (f.size) {
        f.map = mmap(NULL, f.size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f.map == MAP_FAILED) {
            int er = errno;
            close(fd);
            free(f.path);
            return errf(e, ERR_IO, "%s: mmap failed: %s", path, strerror(er));
        }
    }
    close(fd);
    int rc = parse_header(s, &f, e);
    if (rc) {
        if (f.map) munmap(f.map, f.size);
        free(f.path);
        return rc;
    }
    /* tensors point at f.path: the string outlives the table entry */
    s->files = xrealloc(s->files, sizeof(st_file) * (s->nfiles + 1));
    s->files[s->nfiles++] = f;
    return 0;
}

int st_open_file(const char *path, st_set **out, ls_err *e) {
    *out = NULL;
    st_set *s = st_new();
    int rc = add_file(s, path, e);
    if (rc) { st_close(s); return rc; }
    *out = s;
    return 0;
}

/* ---- reading a folder ---------------------------------------------------- */

static char *path_join(const char *dir, const char *name) {
    buf b;
    buf_init(&b);
    buf_printf(&b, "%s%s%s", dir, (*dir && dir[strlen(dir) - 1] == '/') ? "" : "/", name);
    return buf_detach(&b);
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static int strp_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int open_index(st_set *s, const char *dir, const char *ipath, ls_err *e) {
    json_error_t je;
    json_t *root = json_load_file(ipath, JSON_REJECT_DUPLICATES, &je);
    if (!root) return errf(e, ERR_INVAL, "%s: not valid JSON: %s (line %d)", ipath, je.text, je.line);
    int rc = 0;
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) { rc = errf(e, ERR_INVAL, "%s: missing or non-object 'weight_map'", ipath); goto out; }
    /* the distinct shard names, in sorted order */
    size_t n = json_object_size(wm), nf = 0;
    const char **files = xmalloc(sizeof(char *) * (n + 1));
    const char *tname;
    json_t *fv;
    json_object_foreach(wm, tname, fv) {
        if (!json_is_string(fv)) {
            rc = errf(e, ERR_INVAL, "%s: weight_map['%s'] is not a string", ipath, tname);
            free(files);
            goto out;
        }
        const char *fn = json_string_value(fv);
        if (!*fn || fn[0] == '/' || strstr(fn, "..")) {
            rc = errf(e, ERR_INVAL, "%s: weight_map['%s'] names '%s', not a file inside the folder", ipath, tname, fn);
            free(files);
            goto out;
        }
        files[nf++] = fn;
    }
    qsort(files, nf, sizeof(char *), strp_cmp);
    for (size_t i = 0; i < nf; i++) {
        if (i && !strcmp(files[i], files[i - 1])) continue;
        char *fp = path_join(dir, files[i]);
        if (!file_exists(fp)) {
            /* name a tensor that points at it */
            const char *who = "?";
            json_object_foreach(wm, tname, fv) if (!strcmp(json_string_value(fv), files[i])) { who = tname; break; }
            rc = errf(e, ERR_INVAL, "%s: tensor '%s': shard %s does not exist", ipath, who, fp);
            free(fp);
            free(files);
            goto out;
        }
        rc = add_file(s, fp, e);
        free(fp);
        if (rc) { free(files); goto out; }
    }
    free(files);
    json_object_foreach(wm, tname, fv) {
        const st_tensor *t = st_find(s, tname);
        char *fp = path_join(dir, json_string_value(fv));
        if (!t) {
            rc = errf(e, ERR_INVAL, "%s: tensor '%s': listed in the index but missing from %s", ipath, tname, fp);
            free(fp);
            goto out;
        }
        if (strcmp(t->file, fp)) {
            rc = errf(e, ERR_INVAL, "%s: tensor '%s': index says %s but it is in %s", ipath, tname, fp, t->file);
            free(fp);
            goto out;
        }
        free(fp);
    }
out:
    json_decref(root);
    return rc;
}

int st_open_dir(const char *dir, st_set **out, ls_err *e) {
    *out = NULL;
    struct stat st;
    if (stat(dir, &st)) return errf(e, ERR_INVAL, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return st_open_file(dir, out, e);
    st_set *s = st_new();
    int rc = 0;
    char *ip = path_join(dir, "model.safetensors.index.json");
    char *sp = path_join(dir, "model.safetensors");
    if (file_exists(ip)) {
        rc = open_index(s, dir, ip, e);
    } else if (file_exists(sp)) {
        rc = add_file(s, sp, e);
    } else {
        DIR *d = opendir(dir);
        if (!d) { rc = errf(e, ERR_IO, "%s: %s", dir, strerror(errno)); goto done; }
        char **names = NULL;
        int nn = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
            size_t l = strlen(de->d_name);
            if (l > 12 && !strcmp(de->d_name + l - 12, ".safetensors")) {
                names = xrealloc(names, sizeof(char *) * (nn + 1));
                names[nn++] = xstrdup(de->d_name);
            }
        }
        closedir(d);
        if (!nn) rc = errf(e, ERR_INVAL, "%s: no model.safetensors.index.json, model.safetensors or *.safetensors", dir);
        qsort(names, nn, sizeof(char *), strp_cmp);
        for (int i = 0; i < nn; i++) {
            if (!rc) {
                char *fp = path_join(dir, names[i]);
                rc = add_file(s, fp, e);
                free(fp);
            }
            free(names[i]);
        }
        free(names);
    }
done:
    free(ip);
    free(sp);
    if (rc) { st_close(s); return rc; }
    *out = s;
    return 0;
}

/* ---- writing ------------------------------------------------------------- */

/* Write order: by dtype alignment (largest first), then name, as the HF
 * writer does, so that with the 8-byte aligned data start every tensor is
 * naturally aligned inside the mapping. */
static int write_order_cmp(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    size_t sx = st_dtype_size(x->dtype), sy = st_dtype_size(y->dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

/* One shard file holding tensors ts[0..n). */
static int write_shard(const char *path, const st_tensor **ts, int n, ls_err *e) {
    json_t *h = json_object();
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < ts[i]->ndim; d++) json_array_append_new(shape, json_integer(ts[i]->shape[d]));
        json_object_set_new(h, ts[i]->name,
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype", st_dtype_name(ts[i]->dtype), "shape", shape,
                                      "data_offsets", (json_int_t)off, (json_int_t)(off + ts[i]->nbytes)));
        off += ts[i]->nbytes;
    }
    char *js = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    size_t jl = strlen(js), padded = (jl + 7) & ~(size_t)7;
    char *hdr = xmalloc(8 + padded);
    uint64_t hl = padded;
    for (int i = 0; i < 8; i++) hdr[i] = (char)(hl >> (8 * i));
    memcpy(hdr + 8, js, jl);
    memset(hdr + 8 + jl, ' ', padded - jl);
    free(js);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) { free(hdr); return errf(e, ERR_IO, "%s: %s", path, strerror(errno)); }
    int bad = write_all(fd, hdr, 8 + padded);
    free(hdr);
    for (int i = 0; i < n && !bad; i++) bad = write_all(fd, ts[i]->data, ts[i]->nbytes);
    int er = errno;
    if (close(fd) && !bad) { bad = 1; er = errno; }
    if (bad) return errf(e, ERR_IO, "%s: write failed: %s", path, strerror(er));
    return 0;
}

int st_write_file(const st_set *s, const char *path, ls_err *e) {
    const st_tensor **ts = xmalloc(sizeof(st_tensor *) * (s->n + 1));
    for (int i = 0; i < s->n; i++) ts[i] = &s->t[i];
    qsort(ts, s->n, sizeof(st_tensor *), write_order_cmp);
    int rc = write_shard(path, ts, s->n, e);
    free(ts);
    return rc;
}

static int is_weight_file(const char *n) {
    if (!strcmp(n, "model.safetensors") || !strcmp(n, "model.safetensors.index.json")) return 1;
    unsigned a, b;
    int len = 0;
    return sscanf(n, "model-%5u-of-%5u.safetensors%n", &a, &b, &len) == 2 && len == (int)strlen(n);
}

int st_remove_weights(const char *dir, ls_err *e) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : errf(e, ERR_IO, "%s: %s", dir, strerror(errno));
    struct dirent *de;
    int rc = 0;
    while (!rc && (de = readdir(d))) {
        if (!is_weight_file(de->d_name)) continue;
        char *p = path_join(dir, de->d_name);
        if (unlink(p) && errno != ENOENT) rc = errf(e, ERR_IO, "%s: cannot remove: %s", p, strerror(errno));
        free(p);
    }
    closedir(d);
    return rc;
}

int st_write_dir(const st_set *s, const char *dir, size_t shard_bytes, ls_err *e) {
    if (mkdir(dir, 0755) && errno != EEXIST) return errf(e, ERR_IO, "%s: %s", dir, strerror(errno));
    int rc0 = st_remove_weights(dir, e);
    if (rc0) return rc0;
    int n = s->n;
    const st_tensor **ts = xmalloc(sizeof(st_tensor *) * (n + 1));
    for (int i = 0; i < n; i++) ts[i] = &s->t[i];
    qsort(ts, n, sizeof(st_tensor *), write_order_cmp);
    /* split into shards: start a new one when adding a tensor would exceed shard_bytes */
    int *start = xmalloc(sizeof(int) * (n + 2));
    int nsh = 0;
    uint64_t cur = 0, total = 0;
    start[nsh++] = 0;
    for (int i = 0; i < n; i++) {
        if (shard_bytes && cur > 0 && cur + ts[i]->nbytes > shard_bytes) {
            start[nsh++] = i;
            cur = 0;
        }
        cur += ts[i]->nbytes;
        total += ts[i]->nbytes;
    }
    start[nsh] = n;
    int rc = 0;
    char name[64];
    if (nsh == 1) {
        char *p = path_join(dir, "model.safetensors");
        rc = write_shard(p, ts, n, e);
        free(p);
    } else {
        json_t *wm = json_object();
        for (int k = 0; k < nsh && !rc; k++) {
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, nsh);
            char *p = path_join(dir, name);
            rc = write_shard(p, ts + start[k], start[k + 1] - start[k], e);
            free(p);
            for (int i = start[k]; i < start[k + 1]; i++) json_object_set_new(wm, ts[i]->name, json_string(name));
        }
        if (!rc) {
            json_t *idx = json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wm);
            char *p = path_join(dir, "model.safetensors.index.json");
            if (json_dump_file(idx, p, JSON_INDENT(2) | JSON_SORT_KEYS))
                rc = errf(e, ERR_IO, "%s: write failed", p);
            free(p);
            json_decref(idx);
        } else {
            json_decref(wm);
        }
    }
    free(start);
    free(ts);
    return rc;
}
