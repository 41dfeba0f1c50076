/* The per-sample read path of TarDataset, in C.
 *
 * Same behaviour as TarDataset._read_py (the reference implementation, used
 * when this module is not built): sample i's record (tarindex/index/records.py)
 * gives its shard, byte range, members and key; one positional read of the
 * range (the GIL released); a dict with __key__, __url__, __index__ and one
 * bytes entry per extension. Plain tar shards (an int fd) are read here; a
 * shard whose handle is an object with read_at(offset, size) (zstd frames,
 * HTTP ranges) has that called and the members sliced here; a None handle
 * goes back to Python through `fallback`.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "_tarscan.h"
#include "_zstdread.h"

#define MAX_MEMBERS 256           /* more members than this in one sample: the Python path reads it */
#define DIRECT_READ (64 << 10)    /* samples larger than this are read straight into their members' bytes */
#define STACK_READ (16 << 10)     /* a buffer this small lives on the C stack */
#define RECORD_HEAD 24            /* u64 offset, u64 size, u32 shard, u16 n_members, u16 key_len */

typedef struct {
    PyObject_HEAD
    Py_buffer cols[2];
    int ncols;
    const char *rec_at;  /* u64 per sample + 1: record offsets (empty with a stride) */
    const char *records; /* the record blob */
    uint64_t stride;     /* record i at i * stride; 0: at rec_at[i] */
    Py_ssize_t n, rec_len, n_exts, n_shards;
    PyObject *exts;     /* tuple of str */
    PyObject *urls;     /* tuple of str */
    PyObject *opener;   /* opener(shard): opens the shard and hands its handle over with adopt() */
    PyObject *fallback; /* fallback(i) -> dict, for shards that are not plain tar */
    PyObject *error;    /* error(url, offset, what) -> exception instance */
    PyObject *fork;     /* tarindex._process.FORK: [generation], changed in every forked child */
    long gen;           /* FORK[0] when this reader was made: a reader inherited through fork hands reads to fallback */
    int *fds;           /* per shard: fd, -1 not open here, -2 not plain tar, -3 handle with read_at */
    uint32_t *reading;  /* per shard: reads in progress on its fd (the GIL released): not to be closed yet */
    PyObject **handles; /* per shard: the read_at handle when fds[shard] == -3, else NULL */
} Reader;

/* One sample's record, checked against the blob's bounds. */
typedef struct {
    uint64_t offset, size;
    uint32_t shard;
    Py_ssize_t nm, klen;
    const char *spans; /* nm x (u64 data offset relative to offset, u64 size) */
    const char *ext;   /* nm x u16 */
    const char *key;
} Record;

static PyObject *k_key, *k_url, *k_index, *k_read_at;
static PyObject *IndexFormatError; /* tarindex.errors.IndexFormatError */

static inline uint64_t ld64(const char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint32_t ld32(const char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint16_t ld16(const char *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static int Reader_traverse(Reader *self, visitproc visit, void *arg) {
    Py_VISIT(self->exts);
    Py_VISIT(self->urls);
    Py_VISIT(self->opener); /* bound methods of the dataset: a cycle the collector must see */
    Py_VISIT(self->fallback);
    Py_VISIT(self->error);
    Py_VISIT(self->fork);
    if (self->handles)
        for (Py_ssize_t s = 0; s < self->n_shards; s++) Py_VISIT(self->handles[s]);
    return 0;
}

static int Reader_clear(Reader *self) {
    Py_CLEAR(self->exts);
    Py_CLEAR(self->urls);
    Py_CLEAR(self->opener);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->error);
    Py_CLEAR(self->fork);
    if (self->handles)
        for (Py_ssize_t s = 0; s < self->n_shards; s++) Py_CLEAR(self->handles[s]);
    return 0;
}

static void Reader_dealloc(Reader *self) {
    PyObject_GC_UnTrack(self);
    Reader_clear(self);
    for (int c = 0; c < self->ncols; c++) PyBuffer_Release(&self->cols[c]);
    PyMem_Free(self->fds);
    PyMem_Free(self->reading);
    PyMem_Free(self->handles);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int take(Reader *self, PyObject *obj, const char **out, Py_ssize_t *len) {
    Py_buffer *view = &self->cols[self->ncols];
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0) return -1;
    self->ncols++;
    *out = view->buf;
    *len = view->len;
    return 0;
}

static int Reader_init(Reader *self, PyObject *args, PyObject *kw) {
    PyObject *rec_at, *records, *exts, *urls, *opener, *fallback, *error, *fork;
    Py_ssize_t at_len, n;
    unsigned long long stride;
    if (self->exts) {
        PyErr_SetString(PyExc_RuntimeError, "Reader is already initialised");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOKnO!O!OOOO!", &rec_at, &records, &stride, &n, &PyTuple_Type, &exts, &PyTuple_Type, &urls,
                          &opener, &fallback, &error, &PyList_Type, &fork))
        return -1;
    if (PyList_GET_SIZE(fork) != 1 || !PyLong_Check(PyList_GET_ITEM(fork, 0))) {
        PyErr_SetString(PyExc_ValueError, "fork must be a list of one int");
        return -1;
    }
    self->gen = PyLong_AsLong(PyList_GET_ITEM(fork, 0));
    Py_INCREF(fork);
    self->fork = fork;
    Py_INCREF(exts);
    self->exts = exts;
    Py_INCREF(urls);
    self->urls = urls;
    Py_INCREF(opener);
    self->opener = opener;
    Py_INCREF(fallback);
    self->fallback = fallback;
    Py_INCREF(error);
    self->error = error;
    if (take(self, rec_at, &self->rec_at, &at_len) < 0 || take(self, records, &self->records, &self->rec_len) < 0) return -1;
    if (n < 0 || (stride ? stride % 8 || (uint64_t)self->rec_len / stride < (uint64_t)n : at_len / 8 <= n)) {
        PyErr_SetString(IndexFormatError, "index records are damaged (fewer than the index's samples)");
        return -1;
    }
    self->n = n;
    self->stride = stride;
    self->n_exts = PyTuple_GET_SIZE(self->exts);
    self->n_shards = PyTuple_GET_SIZE(self->urls);
    self->fds = PyMem_Malloc(sizeof(int) * (self->n_shards ? self->n_shards : 1));
    self->handles = PyMem_Calloc(self->n_shards ? self->n_shards : 1, sizeof(PyObject *));
    self->reading = PyMem_Calloc(self->n_shards ? self->n_shards : 1, sizeof(uint32_t));
    if (!self->fds || !self->handles || !self->reading) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t s = 0; s < self->n_shards; s++) self->fds[s] = -1;
    return 0;
}

static PyObject *corrupt(Reader *self, uint32_t shard, uint64_t offset, const char *what) {
    PyObject *exc = PyObject_CallFunction(self->error, "OKs", PyTuple_GET_ITEM(self->urls, shard),
                                          (unsigned long long)offset, what);
    if (exc) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* Record i, checked: every member inside the sample's range, in order, with a known extension. */
static int load(Reader *self, Py_ssize_t i, Record *r) {
    uint64_t at = self->stride ? (uint64_t)i * self->stride : ld64(self->rec_at + 8 * i);
    if (at > (uint64_t)self->rec_len || (uint64_t)self->rec_len - at < RECORD_HEAD) goto bad;
    const char *p = self->records + at;
    r->offset = ld64(p);
    r->size = ld64(p + 8);
    r->shard = ld32(p + 16);
    r->nm = ld16(p + 20);
    r->klen = ld16(p + 22);
    if ((uint64_t)self->rec_len - at < RECORD_HEAD + 18 * (uint64_t)r->nm + (uint64_t)r->klen) goto bad;
    if (r->shard >= self->n_shards || r->size > PY_SSIZE_T_MAX) goto bad;
    r->spans = p + RECORD_HEAD;
    r->ext = r->spans + 16 * r->nm;
    r->key = r->ext + 2 * r->nm;
    uint64_t pos = 0;
    for (Py_ssize_t k = 0; k < r->nm; k++) {
        uint64_t mo = ld64(r->spans + 16 * k), ms = ld64(r->spans + 16 * k + 8);
        if (ld16(r->ext + 2 * k) >= self->n_exts || mo < pos || mo > r->size || ms > r->size - mo) {
            corrupt(self, r->shard, r->offset, "index entry out of bounds");
            return -1;
        }
        pos = mo + ms;
    }
    return 0;
bad:
    PyErr_Format(IndexFormatError, "the index record of sample %zd is damaged; rebuild the index", i);
    return -1;
}

/* A new sample dict with __key__, __url__ and __index__ and member k's bytes from vals[k]
 * (references stolen, all of them, also on error); NULL on error. */
static PyObject *new_sample(Reader *self, const Record *r, PyObject *index, PyObject **vals) {
    PyObject *d = _PyDict_NewPresized(3 + r->nm);
    PyObject *key = PyUnicode_DecodeUTF8(r->key, r->klen, "surrogateescape");
    int bad = !d || !key || PyDict_SetItem(d, k_key, key) < 0 ||
              PyDict_SetItem(d, k_url, PyTuple_GET_ITEM(self->urls, r->shard)) < 0 || PyDict_SetItem(d, k_index, index) < 0;
    Py_XDECREF(key);
    for (Py_ssize_t k = 0; k < r->nm; k++) {
        if (!bad && PyDict_SetItem(d, PyTuple_GET_ITEM(self->exts, ld16(r->ext + 2 * k)), vals[k]) < 0) bad = 1;
        Py_DECREF(vals[k]);
    }
    if (bad) {
        Py_XDECREF(d);
        return NULL;
    }
    return d;
}

/* Each member's bytes, copied out of the sample's bytes at base (vals[k] new references); -1 on error. */
static int slice_members(const Record *r, const char *base, PyObject **vals) {
    for (Py_ssize_t k = 0; k < r->nm; k++) {
        vals[k] = PyBytes_FromStringAndSize(base + ld64(r->spans + 16 * k), (Py_ssize_t)ld64(r->spans + 16 * k + 8));
        if (!vals[k]) {
            for (Py_ssize_t q = 0; q < k; q++) Py_DECREF(vals[q]);
            return -1;
        }
    }
    return 0;
}

/* A sample of a shard read through its handle's read_at(offset, size): members sliced from the bytes it returns.
 * A ZstdReader (_zstdread.c) is called directly and its members are sliced straight from the decompressed frame. */
static PyObject *read_handle(Reader *self, PyObject *handle, const Record *r, PyObject *index) {
    PyObject *buf = NULL;
    const char *base = NULL;
    size_t got = 0;
    if (zstdread_is_reader(handle)) {
        Py_INCREF(handle); /* alive even if another thread forgets it meanwhile */
        if (zstdread_view(handle, r->offset, r->size, &base, &got, &buf) < 0) {
            Py_DECREF(handle);
            return NULL;
        }
        if (!buf) buf = handle; /* the view lies in the frame cache the reader holds: keep the reader */
        else Py_DECREF(handle);
    } else {
        PyObject *off_o = PyLong_FromUnsignedLongLong(r->offset), *size_o = PyLong_FromUnsignedLongLong(r->size);
        buf = off_o && size_o ? PyObject_CallMethodObjArgs(handle, k_read_at, off_o, size_o, NULL) : NULL;
        Py_XDECREF(off_o);
        Py_XDECREF(size_o);
        if (!buf) return NULL;
        if (PyBytes_Check(buf)) {
            base = PyBytes_AS_STRING(buf);
            got = (size_t)PyBytes_GET_SIZE(buf);
        }
    }
    if (!base || got != r->size) {
        Py_DECREF(buf); /* a short read: the Python path reports it */
        return PyObject_CallOneArg(self->fallback, index);
    }
    PyObject *vals[MAX_MEMBERS];
    int rc = slice_members(r, base, vals); /* at once: a view in the frame cache lasts until the next zstd read */
    Py_DECREF(buf);
    return rc < 0 ? NULL : new_sample(self, r, index, vals);
}

/* pread/preadv until done or error, the GIL released; returns bytes read or -1 (errno in *err). */
static ssize_t read_range(int fd, struct iovec *iov, int niov, uint64_t off, int *err) {
    ssize_t got = 0;
    *err = 0;
    Py_BEGIN_ALLOW_THREADS
    do {
        got = niov == 1 ? pread(fd, iov[0].iov_base, iov[0].iov_len, (off_t)off) : niov ? preadv(fd, iov, niov, (off_t)off) : 0;
    } while (got < 0 && errno == EINTR);
    if (got < 0) *err = errno;
    Py_END_ALLOW_THREADS
    return got;
}

/* A plain tar sample: small ones with one pread into a buffer of this call (on the stack up to
 * STACK_READ) and a copy per member; large ones with one preadv straight into each member's bytes
 * (headers and padding into this call's buffer). Nothing is shared between calls: reads run with the
 * GIL released, so several threads may be in here at once. */
static PyObject *read_fd(Reader *self, int fd, const Record *r, PyObject *index) {
    PyObject *vals[MAX_MEMBERS];
    struct iovec iov[2 * MAX_MEMBERS + 1];
    char stack[STACK_READ];
    int niov = 0, direct = r->size > DIRECT_READ;
    uint64_t pos = 0, area = r->size; /* bytes of the buffer: the sample, or its headers and padding */
    if (direct) {
        area = 0;
        for (Py_ssize_t k = 0; k < r->nm; k++) {
            uint64_t mo = ld64(r->spans + 16 * k), ms = ld64(r->spans + 16 * k + 8);
            area += mo - pos;
            pos = mo + ms;
            vals[k] = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)ms);
            if (!vals[k]) {
                for (Py_ssize_t q = 0; q < k; q++) Py_DECREF(vals[q]);
                return NULL;
            }
        }
        area += r->size - pos;
    }
    char *heap = area > STACK_READ ? PyMem_Malloc(area) : NULL, *buf = heap ? heap : stack;
    if (area > STACK_READ && !heap) {
        if (direct)
            for (Py_ssize_t q = 0; q < r->nm; q++) Py_DECREF(vals[q]);
        return PyErr_NoMemory();
    }
    if (!direct) {
        iov[niov].iov_base = buf;
        iov[niov++].iov_len = r->size;
    } else {
        char *gap = buf;
        pos = 0;
        for (Py_ssize_t k = 0; k < r->nm; k++) {
            uint64_t mo = ld64(r->spans + 16 * k), ms = ld64(r->spans + 16 * k + 8);
            if (mo > pos) {
                iov[niov].iov_base = gap;
                iov[niov++].iov_len = mo - pos;
                gap += mo - pos;
            }
            if (ms) {
                iov[niov].iov_base = PyBytes_AS_STRING(vals[k]);
                iov[niov++].iov_len = ms;
            }
            pos = mo + ms;
        }
        if (r->size > pos) {
            iov[niov].iov_base = gap;
            iov[niov++].iov_len = r->size - pos;
        }
    }
    int err;
    ssize_t got = read_range(fd, iov, niov, r->offset, &err);
    if (err || got < 0 || (uint64_t)got < r->size) {
        PyMem_Free(heap);
        if (direct)
            for (Py_ssize_t q = 0; q < r->nm; q++) Py_DECREF(vals[q]);
        if (err) {
            errno = err;
            return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, PyTuple_GET_ITEM(self->urls, r->shard));
        }
        return PyObject_CallOneArg(self->fallback, index); /* a short read: the Python path reports it */
    }
    int bad = !direct && slice_members(r, buf, vals) < 0;
    PyMem_Free(heap);
    return bad ? NULL : new_sample(self, r, index, vals);
}

/* The handle of a shard for one read: the one adopted (fds, handles), or what the opener returns when
 * the shard is not open here (the opener also adopts it, unless another thread evicts it before the
 * opener returns: the handle is used for this read all the same, and the caller's count in `reading`
 * keeps the dataset from closing it meanwhile). Returns the fd, -2 (not plain: fallback), -3 (*handle:
 * an object with read_at, a new reference) or -4 on error. */
static int shard_handle(Reader *self, uint32_t shard, PyObject **handle) {
    int fd = self->fds[shard];
    if (fd == -3) {
        *handle = Py_NewRef(self->handles[shard]);
        return fd;
    }
    if (fd != -1) return fd;
    PyObject *got = PyObject_CallFunction(self->opener, "I", shard);
    if (!got) return -4;
    if (got == Py_None) {
        fd = -2;
    } else if (!PyLong_Check(got)) {
        *handle = got;
        return -3;
    } else {
        long v = PyLong_AsLong(got);
        fd = v == -1 && PyErr_Occurred() ? -4 : (int)v;
    }
    Py_DECREF(got);
    return fd;
}

static PyObject *Reader_read(Reader *self, PyObject *arg) {
    if (!self->fds || !self->handles) {
        PyErr_SetString(PyExc_RuntimeError, "Reader is not initialised");
        return NULL;
    }
    PyObject *now = PyList_GET_SIZE(self->fork) == 1 ? PyList_GET_ITEM(self->fork, 0) : NULL;
    if (!now || !PyLong_Check(now) || PyLong_AsLong(now) != self->gen) return PyObject_CallOneArg(self->fallback, arg);
    Py_ssize_t asked = PyLong_CheckExact(arg) ? PyLong_AsSsize_t(arg) : PyNumber_AsSsize_t(arg, PyExc_IndexError); /* numpy ints too */
    if (asked == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t i = asked;
    int given = i >= 0 && PyLong_CheckExact(arg); /* then arg itself is __index__ */
    if (i < 0) i += self->n;
    if (i < 0 || i >= self->n) {
        PyErr_Format(PyExc_IndexError, "sample %zd out of range for %zd samples", asked, self->n);
        return NULL;
    }
    Record r;
    if (load(self, i, &r) < 0) return NULL;
    PyObject *handle = NULL, *out = NULL;
    /* From here to the end of the read, the dataset closes no descriptor of this shard (other threads
     * may evict it meanwhile: it is closed once the count is back to zero). */
    self->reading[r.shard]++;
    int fd = shard_handle(self, r.shard, &handle);
    PyObject *index = fd == -4 ? NULL : given ? Py_NewRef(arg) : PyLong_FromSsize_t(i);
    if (index) {
        if (fd == -2 || r.nm > MAX_MEMBERS)
            out = PyObject_CallOneArg(self->fallback, index);
        else if (fd == -3)
            out = read_handle(self, handle, &r, index);
        else
            out = read_fd(self, fd, &r, index);
        Py_DECREF(index);
    }
    self->reading[r.shard]--;
    Py_XDECREF(handle);
    return out;
}

static PyObject *Reader_forget(Reader *self, PyObject *arg) {
    Py_ssize_t s = PyLong_AsSsize_t(arg);
    if (s == -1 && PyErr_Occurred()) return NULL;
    if (s >= 0 && s < self->n_shards) {
        self->fds[s] = -1;
        Py_CLEAR(self->handles[s]);
    }
    Py_RETURN_NONE;
}

static PyObject *Reader_adopt(Reader *self, PyObject *args) {
    Py_ssize_t s;
    PyObject *handle;
    if (!PyArg_ParseTuple(args, "nO", &s, &handle)) return NULL;
    if (s < 0 || s >= self->n_shards) {
        PyErr_Format(PyExc_IndexError, "shard %zd out of range", s);
        return NULL;
    }
    int fd;
    if (handle == Py_None) {
        fd = -2;
    } else if (!PyLong_Check(handle)) { /* an object with read_at(offset, size) */
        fd = -3;
    } else {
        long v = PyLong_AsLong(handle);
        if (v == -1 && PyErr_Occurred()) return NULL;
        if (v < 0 || v > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "not a file descriptor: %ld", v);
            return NULL;
        }
        fd = (int)v;
    }
    Py_XINCREF(fd == -3 ? handle : NULL);
    Py_XSETREF(self->handles[s], fd == -3 ? handle : NULL);
    self->fds[s] = fd;
    Py_RETURN_NONE;
}

static PyObject *Reader_reading(Reader *self, PyObject *arg) {
    Py_ssize_t s = PyLong_AsSsize_t(arg);
    if (s == -1 && PyErr_Occurred()) return NULL;
    return PyLong_FromUnsignedLong(s >= 0 && s < self->n_shards && self->reading ? self->reading[s] : 0);
}

static PyMethodDef Reader_methods[] = {
    {"read", (PyCFunction)Reader_read, METH_O, "read(i) -> sample dict of bytes"},
    {"reading", (PyCFunction)Reader_reading, METH_O, "reading(shard) -> reads in progress on its file (other threads)"},
    {"forget", (PyCFunction)Reader_forget, METH_O, "forget(shard): its handle was closed; ask the opener next time"},
    {"adopt", (PyCFunction)Reader_adopt, METH_VARARGS, "adopt(shard, handle): the opener's handle (an int fd, an object with read_at, or None)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tarindex._speedups.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_dealloc = (destructor)Reader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Reader_traverse,
    .tp_clear = (inquiry)Reader_clear,
    .tp_doc = "Per-process sample reader over an index's records.",
    .tp_methods = Reader_methods,
    .tp_init = (initproc)Reader_init,
    .tp_new = PyType_GenericNew,
};


static PyMethodDef module_methods[] = {
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speedups", "TarDataset's read path, the tar header walk's common case and the offset-table packer, in C.", -1, module_methods};

PyMODINIT_FUNC PyInit__speedups(void) {
    if (PyType_Ready(&ReaderType) < 0) return NULL;
    k_key = PyUnicode_InternFromString("__key__");
    k_url = PyUnicode_InternFromString("__url__");
    k_index = PyUnicode_InternFromString("__index__");
    k_read_at = PyUnicode_InternFromString("read_at");
    if (!k_key || !k_url || !k_index || !k_read_at) return NULL;
    PyObject *errors = PyImport_ImportModule("tarindex.errors");
    IndexFormatError = errors ? PyObject_GetAttrString(errors, "IndexFormatError") : NULL;
    Py_XDECREF(errors);
    if (!IndexFormatError) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&ReaderType);
    if (PyModule_AddObject(m, "Reader", (PyObject *)&ReaderType) < 0) {
        Py_DECREF(&ReaderType);
        Py_DECREF(m);
        return NULL;
    }
    if (tarscan_add(m) < 0 || zstdread_add_types(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
