/* fuzz_st.c: mutation fuzz of the safetensors header parser.
 *
 * Builds a valid file (tensors of several dtypes and ranks), then for each
 * case applies 1-4 random mutations to it (byte flips, random bytes, digit
 * changes inside the JSON, inserted or deleted bytes, a changed header
 * length, truncation), writes it and opens it through st_open_file. An
 * accepted file must satisfy the reader's invariants (every tensor inside
 * the mapping, nbytes == numel x dtype size), checked by reading every byte.
 * Built with -fsanitize=address,undefined: any memory error aborts.
 *
 * usage: fuzz_st [CASES=1000] [SEED=1]
 */
#include "fmt/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t rs;
static uint64_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}
static size_t rndn(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

static unsigned char *make_valid(size_t *len, size_t *hlen) {
    const char *h = "{\"__metadata__\":{\"format\":\"pt\"},"
                    "\"a.weight\":{\"dtype\":\"BF16\",\"shape\":[4,8],\"data_offsets\":[0,64]},"
                    "\"a.weight_scale\":{\"dtype\":\"F8_E4M3\",\"shape\":[4,1],\"data_offsets\":[64,68]},"
                    "\"a.weight_scale_2\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[68,72]},"
                    "\"b\":{\"dtype\":\"I64\",\"shape\":[2,1,1],\"data_offsets\":[72,88]},"
                    "\"c\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[88,88]},"
                    "\"d\":{\"dtype\":\"F64\",\"shape\":[3],\"data_offsets\":[88,112]}}";
    size_t hl = strlen(h), pad = (8 - hl % 8) % 8, n = 8 + hl + pad + 112;
    unsigned char *f = malloc(n);
    uint64_t L = hl + pad;
    for (int i = 0; i < 8; i++) f[i] = (unsigned char)(L >> (8 * i));
    memcpy(f + 8, h, hl);
    memset(f + 8 + hl, ' ', pad);
    for (size_t i = 0; i < 112; i++) f[8 + hl + pad + i] = (unsigned char)(i * 37);
    *len = n;
    *hlen = L;
    return f;
}

static const char *tokens[] = {"{", "}", "[", "]", ",", ":", "\"", "-1", "0", "99999999999999999999", "1e3",
                               "null", "true", "\"F32\"", "\"X\"", "\\u0000", "\"shape\"", "\"data_offsets\"",
                               "\"dtype\"", "[]", "{}", "18446744073709551615", "-0", "\xff"};

int main(int argc, char **argv) {
    int cases = argc > 1 ? atoi(argv[1]) : 1000;
    rs = argc > 2 ? strtoull(argv[2], NULL, 10) * 2654435761u + 1 : 88172645463325252ull;
    size_t vlen, hlen;
    unsigned char *valid = make_valid(&vlen, &hlen);
    char path[] = "/tmp/fuzz_st_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) { perror("mkstemp"); return 1; }
    close(fd);
    int accepted = 0, rejected = 0;
    unsigned char *m = malloc(vlen * 4 + 64);
    for (int c = 0; c < cases; c++) {
        size_t n = vlen;
        memcpy(m, valid, vlen);
        int muts = 1 + (int)rndn(4);
        for (int k = 0; k < muts; k++) {
            size_t hend = 8 + hlen < n ? 8 + hlen : n; /* mutate mostly inside the header */
            size_t at = 8 + rndn(hend > 8 ? hend - 8 : 1);
            if (at > n) at = n;
            switch (rndn(8)) {
            case 0: if (at < n) m[at] ^= (unsigned char)(1u << rndn(8)); break;
            case 1: if (at < n) m[at] = (unsigned char)rnd(); break;
            case 2: /* change a digit */
                for (size_t i = at; i < hend; i++)
                    if (m[i] >= '0' && m[i] <= '9') { m[i] = (unsigned char)('0' + rndn(10)); break; }
                break;
            case 3: { /* insert a JSON-ish token */
                const char *t = tokens[rndn(sizeof tokens / sizeof tokens[0])];
                size_t tl = strlen(t);
                if (n + tl > vlen * 4) break;
                memmove(m + at + tl, m + at, n - at);
                memcpy(m + at, t, tl);
                n += tl;
                break;
            }
            case 4: { /* delete a run */
                size_t dl = 1 + rndn(8);
                if (at + dl > n) dl = n - at;
                memmove(m + at, m + at + dl, n - at - dl);
                n -= dl;
                break;
            }
            case 5: /* the header length */
                m[rndn(8)] = (unsigned char)rnd();
                break;
            case 6: n = rndn(n + 1); break; /* truncate */
            default: /* duplicate a tensor name by copying bytes around */
                if (n > 40) { size_t a = 8 + rndn(n - 40), b = 8 + rndn(n - 40); memmove(m + a, m + b, 16); }
                break;
            }
        }
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(m, 1, n, f) != n) { perror(path); return 1; }
        fclose(f);
        st_set *s = NULL;
        ls_err e = {0};
        if (st_open_file(path, &s, &e) == 0) {
            accepted++;
            unsigned sum = 0;
            for (int i = 0; i < st_count(s); i++) {
                const st_tensor *t = st_get(s, i);
                if ((size_t)st_numel(t) * st_dtype_size(t->dtype) != t->nbytes) {
                    fprintf(stderr, "case %d: tensor '%s' nbytes mismatch\n", c, t->name);
                    return 1;
                }
                for (size_t b = 0; b < t->nbytes; b++) sum += ((const unsigned char *)t->data)[b];
            }
            (void)sum;
            st_close(s);
        } else {
            rejected++;
            if (!e.msg[0] || !strstr(e.msg, path)) {
                fprintf(stderr, "case %d: error message does not name the file: '%s'\n", c, e.msg);
                return 1;
            }
        }
    }
    unlink(path);
    free(m);
    free(valid);
    printf("fuzz_st: %d cases, %d accepted, %d rejected, no crash\n", cases, accepted, rejected);
    return 0;
}
