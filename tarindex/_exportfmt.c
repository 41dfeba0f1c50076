/* DALI's webdataset index lines from an index's columns (tarindex.export._dali_bytes; its Python reference
 * is there, beside the call). Part of the optional _speedups extension (module init in _speedups.c calls
 * exportfmt_add).
 *
 * dali_lines(keys, exts, nmembers, member_ext, offsets, sizes) -> bytes
 *
 * One line per sample, each ended by "\n": for each of its members "ext offset size key.ext", separated by
 * a space (the format DALI's wds2idx writes). keys: list of bytes, one per sample; exts: list of bytes, by
 * extension number; nmembers: int64 per sample; member_ext: uint16 per member; offsets (the member's data
 * offset in the shard) and sizes: uint64 per member. Any buffer of those item sizes will do; the counts and
 * extension numbers are checked (ValueError: the caller passed inconsistent columns). Two passes: the
 * output's exact length, then the bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_exportfmt.h"

/* The decimal digits of v. */
static size_t digits(uint64_t v) {
    size_t n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

/* v in decimal at p; returns the end. */
static char *put_decimal(char *p, uint64_t v) {
    char tmp[20];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n) *p++ = tmp[--n];
    return p;
}

typedef struct {
    Py_buffer nmembers, member_ext, offsets, sizes;
    int held; /* how many of them are held */
} Columns;

static void columns_release(Columns *c) {
    Py_buffer *all[] = {&c->nmembers, &c->member_ext, &c->offsets, &c->sizes};
    for (int k = 0; k < c->held; k++) PyBuffer_Release(all[k]);
}

/* The four buffers, each of its item size: 0, or -1 with ValueError set. */
static int columns_get(Columns *c, PyObject *const *objs) {
    Py_buffer *all[] = {&c->nmembers, &c->member_ext, &c->offsets, &c->sizes};
    static const Py_ssize_t width[] = {8, 2, 8, 8};
    c->held = 0;
    for (int k = 0; k < 4; k++) {
        if (PyObject_GetBuffer(objs[k], all[k], PyBUF_C_CONTIGUOUS) < 0) return -1;
        c->held++;
        if (all[k]->len % width[k] != 0) {
            PyErr_SetString(PyExc_ValueError, "dali_lines: a column's byte length is not a multiple of its item size");
            return -1;
        }
    }
    return 0;
}

static PyObject *dali_lines(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "dali_lines() takes exactly 6 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!PyList_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "dali_lines: keys and exts must be lists of bytes");
        return NULL;
    }
    PyObject *keys = args[0], *exts = args[1];
    Py_ssize_t n = PyList_GET_SIZE(keys), n_exts = PyList_GET_SIZE(exts);
    for (Py_ssize_t e = 0; e < n_exts; e++)
        if (!PyBytes_Check(PyList_GET_ITEM(exts, e))) {
            PyErr_SetString(PyExc_TypeError, "dali_lines: an extension is not bytes");
            return NULL;
        }
    Columns c;
    if (columns_get(&c, args + 2) < 0) {
        columns_release(&c);
        return NULL;
    }
    const int64_t *nm = c.nmembers.buf;
    const uint16_t *ext = c.member_ext.buf;
    const uint64_t *off = c.offsets.buf, *size = c.sizes.buf;
    Py_ssize_t members = c.member_ext.len / 2;
    PyObject *out = NULL;
    if (c.nmembers.len / 8 != n || c.offsets.len / 8 != members || c.sizes.len / 8 != members) {
        PyErr_SetString(PyExc_ValueError, "dali_lines: the columns' lengths differ");
        goto done;
    }
    size_t total = 0;
    Py_ssize_t m = 0;
    for (Py_ssize_t i = 0; i < n; i++) { /* the length, and every count and number checked */
        PyObject *key = PyList_GET_ITEM(keys, i);
        if (!PyBytes_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "dali_lines: a key is not bytes");
            goto done;
        }
        if (nm[i] < 0 || nm[i] > members - m) {
            PyErr_SetString(PyExc_ValueError, "dali_lines: the member counts do not add up");
            goto done;
        }
        size_t klen = (size_t)PyBytes_GET_SIZE(key);
        for (int64_t k = 0; k < nm[i]; k++, m++) {
            if (ext[m] >= n_exts) {
                PyErr_SetString(PyExc_ValueError, "dali_lines: an extension number past the table");
                goto done;
            }
            size_t elen = (size_t)PyBytes_GET_SIZE(PyList_GET_ITEM(exts, ext[m]));
            total += 2 * elen + digits(off[m]) + digits(size[m]) + klen + 5; /* three spaces, the dot, then a space or the line's end */
        }
        total += nm[i] == 0; /* an empty line */
    }
    if (m != members) {
        PyErr_SetString(PyExc_ValueError, "dali_lines: the member counts do not add up");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (!out) goto done;
    char *p = PyBytes_AS_STRING(out);
    m = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        const char *kb = PyBytes_AS_STRING(key);
        size_t klen = (size_t)PyBytes_GET_SIZE(key);
        for (int64_t k = 0; k < nm[i]; k++, m++) {
            PyObject *e = PyList_GET_ITEM(exts, ext[m]);
            const char *eb = PyBytes_AS_STRING(e);
            size_t elen = (size_t)PyBytes_GET_SIZE(e);
            if (k) *p++ = ' ';
            memcpy(p, eb, elen);
            p += elen;
            *p++ = ' ';
            p = put_decimal(p, off[m]);
            *p++ = ' ';
            p = put_decimal(p, size[m]);
            *p++ = ' ';
            memcpy(p, kb, klen);
            p += klen;
            *p++ = '.';
            memcpy(p, eb, elen);
            p += elen;
        }
        *p++ = '\n';
    }
done:
    columns_release(&c);
    return out;
}

static PyMethodDef exportfmt_methods[] = {
    {"dali_lines", (PyCFunction)(void (*)(void))dali_lines, METH_FASTCALL,
     "dali_lines(keys, exts, nmembers, member_ext, offsets, sizes) -> bytes: DALI index lines, one per sample"},
    {NULL, NULL, 0, NULL},
};

int exportfmt_add(PyObject *module) { return PyModule_AddFunctions(module, exportfmt_methods); }
