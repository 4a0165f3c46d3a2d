/* safetensors.h: a set of named tensors, mmapped from safetensors files
 * (single file or sharded through model.safetensors.index.json) or built in
 * memory (synth:), plus the writer used by `synth` and `quantize`.
 *
 * Tensors are non-owning views into the mapping (or into buffers the st_set
 * owns for in-memory sets). Names are the checkpoint's own names.
 */
#ifndef LS_SAFETENSORS_H
#define LS_SAFETENSORS_H

#include "base/base.h"

typedef enum st_dtype {
    ST_BF16, ST_F16, ST_F32, ST_F64, ST_U8, ST_I8, ST_I16, ST_I32, ST_I64,
    ST_F8_E4M3, ST_F8_E5M2, ST_BOOL, ST_NDTYPES
} st_dtype;

const char *st_dtype_name(st_dtype t);   /* "BF16", "F8_E4M3", ... */
int st_dtype_parse(const char *s);        /* -> st_dtype or -1 */
size_t st_dtype_size(st_dtype t);

#define ST_MAX_DIMS 8

typedef struct st_tensor {
    const char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;     /* nbytes bytes, read-only */
    size_t nbytes;
    const char *file;     /* the file it came from ("<memory>" for in-memory sets) */
} st_tensor;

typedef struct st_set st_set;

/* Open a model folder: model.safetensors, or the shards named by
 * model.safetensors.index.json, or every *.safetensors if neither exists.
 * Validates every header (well-formed JSON, dtype known, offsets inside the
 * file and not overlapping, byte size == shape x dtype size, no duplicate
 * names across shards). Errors name the file and the tensor. */
int st_open_dir(const char *dir, st_set **out, ls_err *e);
/* Open one .safetensors file with the same validation. */
int st_open_file(const char *path, st_set **out, ls_err *e);
/* An empty in-memory set; st_add_* copy or adopt data. */
st_set *st_new(void);
/* Adopt a malloc'd buffer (freed by st_close). Fails on duplicate name or size mismatch. */
int st_add_owned(st_set *s, const char *name, st_dtype dt, int ndim, const int64_t *shape,
                 void *data, size_t nbytes, ls_err *e);
/* Add a non-owning view (data must outlive s; e.g. a tensor of another set).
 * Same checks as st_add_owned. */
int st_add_ref(st_set *s, const char *name, st_dtype dt, int ndim, const int64_t *shape,
               const void *data, size_t nbytes, ls_err *e);
void st_close(st_set *s);

int st_count(const st_set *s);
const st_tensor *st_get(const st_set *s, int i);
const st_tensor *st_find(const st_set *s, const char *name); /* NULL if absent */
int64_t st_numel(const st_tensor *t);

/* Write all tensors of s (or those whose name passes keep(), if given) into
 * dir as shards of at most shard_bytes (0 = one file model.safetensors; more
 * than one shard writes model.safetensors.index.json). Tensors are written
 * sorted by name; metadata {"format":"pt"}.
 * (As HF's writer does, the order is by dtype size, largest first, then by
 * name, so every tensor is naturally aligned in a mapping. Weight files left
 * in dir by an earlier write are removed first, see st_remove_weights.) */
int st_write_dir(const st_set *s, const char *dir, size_t shard_bytes, ls_err *e);
/* Write every tensor of s into one file (same order and header as above). */
int st_write_file(const st_set *s, const char *path, ls_err *e);
/* Delete dir's model.safetensors, model-NNNNN-of-NNNNN.safetensors and
 * model.safetensors.index.json, so a new checkpoint does not mix with an old one. */
int st_remove_weights(const char *dir, ls_err *e);

#endif
