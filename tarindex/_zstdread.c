/* Random reads of zstd shards, in C: ZstdReader and FrameCache (part of the _speedups module).
 *
 * Same behaviour as tarindex.zstd_random.ZstdShardReader (the reference, used when
 * the extension is not built): read_at(offset, size) finds the frame holding
 * `offset` in the shard's frame table (binary search), reads the compressed
 * frame (pread on a local descriptor, the GIL released, or the read_at method
 * of any other handle, such as a URL's RangeReader), checks its header against
 * the table and decompresses it whole, so every frame's checksum is verified
 * before any byte of it is returned. Damage raises CorruptFrameError(path,
 * compressed offset, what). The shard is never mapped: a shard truncated in
 * place under a reader is a short read (CorruptFrameError), not a SIGBUS.
 *
 * FrameCache keeps decompressed frames in one ring of max_bytes, allocated on
 * first use and reused: a frame is copied in at the write position and the
 * oldest frames in its way are dropped (FIFO). No allocation per kept frame.
 * Fresh pages still cost page faults the first time the ring reaches them,
 * which can cost more than decompressing the frame again, so the ring's
 * length in force (limit) starts at SEED_BYTES and grows by half the bytes
 * its hits serve, and a reader keeps a frame only when it decompresses it
 * again within that horizon. Each reader also remembers the frame it
 * decompressed last (consecutive samples of one frame: one decompression).
 * Entries carry consecutive serial numbers, so a reader finds its frame k by
 * the serial it remembers for k, in O(1), without a hash table.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "_zstdread.h"

/* -- libzstd, found at run time ------------------------------------------------------ */

/* The system's libzstd (libzstd.so.1), opened with dlopen when the module loads: no build dependency.
 * With it a frame is decompressed straight into the reader's buffer, the GIL held (one context per
 * process, no allocation); without it (or after _libzstd(False)), through python-zstandard's
 * ZstdDecompressor.decompress, which returns a new bytes object and lets other threads run. */
static struct {
    void *lib, *dctx;
    size_t (*decompress)(void *dctx, void *dst, size_t capacity, const void *src, size_t size);
    size_t (*frame_size)(const void *src, size_t size);
    unsigned (*is_error)(size_t code);
    const char *(*error_name)(size_t code);
    int on;
} Z;

static void load_libzstd(void) {
    if (Z.lib) return;
    void *lib = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    void *(*create)(void) = (void *(*)(void))dlsym(lib, "ZSTD_createDCtx");
    *(void **)&Z.decompress = dlsym(lib, "ZSTD_decompressDCtx");
    *(void **)&Z.frame_size = dlsym(lib, "ZSTD_findFrameCompressedSize");
    *(void **)&Z.is_error = dlsym(lib, "ZSTD_isError");
    *(void **)&Z.error_name = dlsym(lib, "ZSTD_getErrorName");
    Z.dctx = create && Z.decompress && Z.frame_size && Z.is_error && Z.error_name ? create() : NULL;
    if (!Z.dctx) {
        dlclose(lib);
        memset(&Z, 0, sizeof Z);
        return;
    }
    Z.lib = lib;
    Z.on = 1;
}

static PyObject *zstdread_libzstd(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "_libzstd([on]) takes at most one argument");
        return NULL;
    }
    if (nargs == 1) {
        int on = PyObject_IsTrue(args[0]);
        if (on < 0) return NULL;
        Z.on = on && Z.lib;
    }
    return PyBool_FromLong(Z.on);
}

static PyMethodDef zstdread_functions[] = {
    {"_libzstd", (PyCFunction)(void (*)(void))zstdread_libzstd, METH_FASTCALL,
     "_libzstd([on]) -> whether zstd frames are decompressed with the system's libzstd (tests switch it off)"},
    {NULL, NULL, 0, NULL},
};

/* -- FrameCache ---------------------------------------------------------------------- */

typedef struct {
    size_t pos, size;
} Entry;

#define SEED_BYTES ((size_t)4 << 20) /* the ring's first length; it grows only as hits pay for fresh memory */

typedef struct {
    PyObject_HEAD
    char *arena;       /* max_bytes, allocated at the first put */
    size_t arena_len;  /* its allocated length */
    size_t max_bytes;  /* the bound; 0: nothing is kept */
    size_t limit;      /* the ring's length now: SEED_BYTES, growing by half the bytes hits served, up to max_bytes */
    uint64_t hit_bytes; /* decompressed bytes served by hits since max_bytes was set */
    size_t head;       /* where the next frame is written */
    size_t used;       /* bytes held */
    Entry *ring;       /* entries, oldest first, from ring[first] */
    size_t ring_cap, first, count;
    uint64_t oldest;   /* serial of ring[first]; serials of held entries run oldest .. oldest + count - 1 */
    uint64_t clock;    /* bytes decompressed by the readers using this cache, ever */
} FrameCache;

static void cache_drop_oldest(FrameCache *c) {
    c->used -= c->ring[c->first].size;
    c->first = (c->first + 1) % c->ring_cap;
    c->count--;
    c->oldest++;
}

static void cache_clear(FrameCache *c) {
    c->oldest += c->count; /* every serial handed out so far is now stale */
    c->first = c->count = 0;
    c->head = c->used = 0;
}

/* The held frame with this serial, or NULL. */
static const Entry *cache_find(const FrameCache *c, uint64_t serial) {
    if (serial < c->oldest || serial - c->oldest >= c->count) return NULL;
    return &c->ring[(c->first + (size_t)(serial - c->oldest)) % c->ring_cap];
}

/* Copy a frame in; its serial, or 0 if not kept (too large, or no memory for the ring). */
static uint64_t cache_put(FrameCache *c, const char *data, size_t size) {
    if (!size || size > c->limit) return 0;
    if (c->arena_len < c->max_bytes) {
        PyMem_RawFree(c->arena);
        c->arena = PyMem_RawMalloc(c->max_bytes);
        c->arena_len = c->arena ? c->max_bytes : 0;
        cache_clear(c);
        if (!c->arena) return 0; /* no room: read without keeping */
    }
    if (c->count == c->ring_cap) {
        size_t cap = c->ring_cap ? 2 * c->ring_cap : 64;
        Entry *ring = PyMem_RawMalloc(cap * sizeof(Entry));
        if (!ring) return 0;
        for (size_t j = 0; j < c->count; j++) ring[j] = c->ring[(c->first + j) % c->ring_cap];
        PyMem_RawFree(c->ring);
        c->ring = ring;
        c->ring_cap = cap;
        c->first = 0;
    }
    if (c->head + size > c->limit) { /* wrap: the frames after head are the oldest */
        while (c->count && c->ring[c->first].pos >= c->head) cache_drop_oldest(c);
        c->head = 0;
    }
    /* Held frames lie from the oldest's position up to head (around the end); drop those in the way. */
    while (c->count && c->ring[c->first].pos >= c->head && c->ring[c->first].pos < c->head + size) cache_drop_oldest(c);
    memcpy(c->arena + c->head, data, size);
    c->ring[(c->first + c->count) % c->ring_cap] = (Entry){c->head, size};
    c->count++;
    c->head += size;
    c->used += size;
    return c->oldest + c->count - 1;
}

static int FrameCache_init(FrameCache *self, PyObject *args, PyObject *kw) {
    Py_ssize_t max_bytes;
    static char *names[] = {"max_bytes", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "n", names, &max_bytes)) return -1;
    if (max_bytes < 0) {
        PyErr_SetString(PyExc_ValueError, "max_bytes must be >= 0");
        return -1;
    }
    if (!self->oldest) self->oldest = 1; /* serial 0 means "not kept" */
    cache_clear(self);
    self->max_bytes = (size_t)max_bytes;
    self->limit = self->max_bytes < SEED_BYTES ? self->max_bytes : SEED_BYTES;
    self->hit_bytes = 0;
    return 0;
}

static void FrameCache_dealloc(FrameCache *self) {
    PyMem_RawFree(self->arena);
    PyMem_RawFree(self->ring);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *FrameCache_clear(FrameCache *self, PyObject *unused) {
    cache_clear(self);
    Py_RETURN_NONE;
}

static Py_ssize_t FrameCache_len(FrameCache *self) { return (Py_ssize_t)self->count; }

static PyObject *FrameCache_get_max_bytes(FrameCache *self, void *closure) { return PyLong_FromSize_t(self->max_bytes); }

static int FrameCache_set_max_bytes(FrameCache *self, PyObject *value, void *closure) {
    Py_ssize_t v = value ? PyLong_AsSsize_t(value) : -1;
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0) {
        PyErr_SetString(PyExc_ValueError, "max_bytes must be >= 0");
        return -1;
    }
    if ((size_t)v != self->max_bytes) { /* a new bound: empty, and the ring is reallocated at its next use */
        cache_clear(self);
        PyMem_RawFree(self->arena);
        self->arena = NULL;
        self->arena_len = 0;
        self->max_bytes = (size_t)v;
        self->limit = self->max_bytes < SEED_BYTES ? self->max_bytes : SEED_BYTES;
        self->hit_bytes = 0;
    }
    return 0;
}

static PyObject *FrameCache_get_bytes(FrameCache *self, void *closure) { return PyLong_FromSize_t(self->used); }

static PyObject *FrameCache_get_limit(FrameCache *self, void *closure) { return PyLong_FromSize_t(self->limit); }

static PyObject *FrameCache_get_clock(FrameCache *self, void *closure) { return PyLong_FromUnsignedLongLong(self->clock); }

static PyMethodDef FrameCache_methods[] = {
    {"clear", (PyCFunction)FrameCache_clear, METH_NOARGS, "Drop every frame (the ring's memory is kept)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef FrameCache_getset[] = {
    {"max_bytes", (getter)FrameCache_get_max_bytes, (setter)FrameCache_set_max_bytes, "The bound in bytes (0: keep nothing); setting another value empties the cache.", NULL},
    {"bytes", (getter)FrameCache_get_bytes, NULL, "Bytes of decompressed frames held.", NULL},
    {"limit", (getter)FrameCache_get_limit, NULL, "The ring's length now (it grows up to max_bytes as hits pay for it).", NULL},
    {"decompressed", (getter)FrameCache_get_clock, NULL, "Bytes decompressed by the readers using this cache, ever.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods FrameCache_as_sequence = {.sq_length = (lenfunc)FrameCache_len};

static PyTypeObject FrameCacheType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tarindex._speedups.FrameCache",
    .tp_basicsize = sizeof(FrameCache),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "FrameCache(max_bytes): decompressed zstd frames in one ring of max_bytes (oldest dropped first).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)FrameCache_init,
    .tp_dealloc = (destructor)FrameCache_dealloc,
    .tp_methods = FrameCache_methods,
    .tp_getset = FrameCache_getset,
    .tp_as_sequence = &FrameCache_as_sequence,
};

/* -- ZstdReader ---------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    int fd;               /* the compressed shard, read with pread; -1 when read through source or closed */
    PyObject *source;     /* a handle with read_at(offset, size) when the shard is not a local descriptor */
    PyObject *read_at;    /* its bound read_at */
    char *scratch;        /* compressed frames are read here for libzstd (no allocation per read) */
    size_t scratch_len;
    int scratch_busy;     /* a read into scratch is in progress (the GIL released): others allocate */
    PyObject *path;       /* str, for errors */
    Py_buffer table;      /* (n, 4) uint64: c_offset, c_size, d_offset, d_size */
    int has_table;
    const uint64_t *t;
    Py_ssize_t n;
    uint64_t *serial;     /* per frame: its serial in the cache, 0 if none */
    uint64_t *seen;       /* per frame: the cache's clock after its last decompression, 0 if never */
    PyObject *last;       /* the frame this reader decompressed last (bytes), or NULL */
    Py_ssize_t last_k;
    char *out;            /* libzstd decompresses here; frame out_k (-1: none) */
    size_t out_len;
    Py_ssize_t out_k;
    PyObject *decompressor; /* zstandard.ZstdDecompressor */
    PyObject *decompress; /* decompress of this reader's own ZstdDecompressor */
    int decoding;         /* calls of it in progress: it lets other threads run, and a context serves one at a time */
    PyObject *error;      /* CorruptFrameError */
    PyObject *zstd_error; /* zstandard.ZstdError */
    FrameCache *cache;
} ZstdReader;

static PyObject *k_max_output_size_names; /* ("max_output_size",) */

/* Raise error(path, offset, what); NULL. With a pending exception, it becomes the cause. */
static PyObject *frame_error(ZstdReader *self, uint64_t offset, PyObject *what) {
    PyObject *cause = NULL, *type = NULL, *tb = NULL;
    if (PyErr_Occurred()) { /* the decompressor's error becomes the cause */
        PyErr_Fetch(&type, &cause, &tb);
        PyErr_NormalizeException(&type, &cause, &tb);
        if (cause && tb) PyException_SetTraceback(cause, tb);
        Py_XDECREF(type);
        Py_XDECREF(tb);
    }
    PyObject *exc = what ? PyObject_CallFunction(self->error, "OKO", self->path, (unsigned long long)offset, what) : NULL;
    if (exc) {
        if (cause) {
            PyException_SetCause(exc, Py_NewRef(cause));
            PyException_SetContext(exc, cause);
            cause = NULL;
        }
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    Py_XDECREF(cause);
    Py_XDECREF(what);
    return NULL;
}

/* The frame content size in a zstd frame header: 1 and *out set, 0 when the header has none, -1 unparsable. */
static int header_content_size(const unsigned char *p, size_t len, uint64_t *out) {
    if (len < 5 || p[0] != 0x28 || p[1] != 0xB5 || p[2] != 0x2F || p[3] != 0xFD) return -1;
    unsigned d = p[4];
    if (d & 0x08) return -1;
    int single = (d >> 5) & 1;
    size_t pos = 5 + (single ? 0 : 1) + (size_t)((const int[]){0, 1, 2, 4})[d & 3];
    int fcs = ((const int[]){single ? 1 : 0, 2, 4, 8})[d >> 6];
    if (!fcs) return 0;
    if (len < pos + (size_t)fcs) return -1;
    uint64_t v = 0;
    for (int b = fcs - 1; b >= 0; b--) v = (v << 8) | p[pos + (size_t)b];
    *out = fcs == 2 ? v + 256 : v;
    return 1;
}

static int decompress_direct(ZstdReader *self, const char *src, size_t n, uint64_t d_size, uint64_t c_off);

/* A reused buffer of at least n bytes: 0, or -1 with MemoryError set. */
static int grow(char **buf, size_t *len, size_t n) {
    if (*buf && *len >= n) return 0;
    char *grown = PyMem_Realloc(*buf, n ? n : 1);
    if (!grown) {
        PyErr_NoMemory();
        return -1;
    }
    *buf = grown;
    *len = n;
    return 0;
}
static PyObject *decompress_python(ZstdReader *self, PyObject *raw, int sized, uint64_t d_size, uint64_t c_off);

/* Frame k: a pointer to its bytes in the cache or the reader's buffer (*owner NULL; valid until the next
 * zstd read), or in a new bytes object (*owner, a new reference). */
static int get_frame(ZstdReader *self, Py_ssize_t k, int keep, const char **ptr, size_t *len, PyObject **owner) {
    FrameCache *cache = self->cache;
    const uint64_t *row = self->t + 4 * k;
    uint64_t c_off = row[0], c_size = row[1], d_size = row[3];
    if (self->last && self->last_k == k) { /* block reads: consecutive samples of one frame */
        *ptr = PyBytes_AS_STRING(self->last);
        *len = (size_t)PyBytes_GET_SIZE(self->last);
        *owner = Py_NewRef(self->last);
        return 0;
    }
    if (self->out_k == k) {
        *ptr = self->out;
        *len = (size_t)d_size;
        *owner = NULL;
        return 0;
    }
    *owner = NULL;
    if (self->serial[k]) {
        const Entry *e = cache_find(cache, self->serial[k]);
        if (e) {
            *ptr = cache->arena + e->pos;
            *len = e->size;
            cache->hit_bytes += e->size; /* fresh memory (page faults) costs more than a decompression: */
            size_t grown = SEED_BYTES + (size_t)(cache->hit_bytes / 2); /* the ring grows as hits pay for it */
            if (grown > cache->limit) cache->limit = grown < cache->max_bytes ? grown : cache->max_bytes;
            return 0;
        }
        self->serial[k] = 0;
    }
    if (self->fd < 0 && !self->read_at) {
        PyErr_SetString(PyExc_ValueError, "read from a closed zstd shard reader");
        return -1;
    }
    if (c_size > PY_SSIZE_T_MAX || d_size > PY_SSIZE_T_MAX) {
        frame_error(self, c_off, PyUnicode_FromString("zstd frame table entry out of bounds"));
        return -1;
    }
    PyObject *raw = NULL;
    size_t got = 0;
    int direct = Z.on;    /* libzstd decompresses: a compressed frame needs no Python object */
    int scratch = 0;      /* read into self->scratch */
    const char *buf;
    if (self->read_at) { /* any random-read handle: its read_at returns the frame's bytes */
        raw = PyObject_CallFunction(self->read_at, "KK", (unsigned long long)c_off, (unsigned long long)c_size);
        if (!raw) return -1;
        if (!PyBytes_Check(raw)) {
            PyErr_Format(PyExc_TypeError, "read_at returned %.100s, not bytes", Py_TYPE(raw)->tp_name);
            Py_DECREF(raw);
            return -1;
        }
        got = (size_t)PyBytes_GET_SIZE(raw);
        buf = PyBytes_AS_STRING(raw);
    } else {
        char *dst;
        if (direct && !self->scratch_busy) {
            if (grow(&self->scratch, &self->scratch_len, (size_t)c_size) < 0) return -1;
            dst = self->scratch;
            scratch = self->scratch_busy = 1;
        } else {
            raw = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)c_size);
            if (!raw) return -1;
            dst = PyBytes_AS_STRING(raw);
        }
        buf = dst;
        int err = 0, fd = self->fd;
        Py_BEGIN_ALLOW_THREADS
        while (got < c_size) {
            ssize_t r = pread(fd, dst + got, c_size - got, (off_t)(c_off + got));
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) err = errno;
            if (r <= 0) break;
            got += (size_t)r;
        }
        Py_END_ALLOW_THREADS
        if (err) {
            Py_XDECREF(raw);
            if (scratch) self->scratch_busy = 0;
            errno = err;
            PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, self->path);
            return -1;
        }
    }
    if (got != c_size) {
        Py_XDECREF(raw);
        if (scratch) self->scratch_busy = 0;
        frame_error(self, c_off, PyUnicode_FromFormat("truncated zstd frame (%zu of %llu bytes; the shard is shorter than indexed)", got, (unsigned long long)c_size));
        return -1;
    }
    uint64_t content = 0;
    int known = header_content_size((const unsigned char *)buf, got, &content);
    if (known == 1 && content != d_size) { /* never let a damaged header size the output */
        Py_XDECREF(raw);
        if (scratch) self->scratch_busy = 0;
        frame_error(self, c_off, PyUnicode_FromFormat("zstd frame header disagrees with the index (%llu bytes)", (unsigned long long)d_size));
        return -1;
    }
    if (direct) {
        int rc = decompress_direct(self, buf, got, d_size, c_off);
        Py_XDECREF(raw);
        if (scratch) self->scratch_busy = 0;
        if (rc < 0) return -1;
        Py_CLEAR(self->last);
        self->out_k = k;
        *ptr = self->out;
        *owner = NULL;
    } else {
        PyObject *data = decompress_python(self, raw, known == 1, d_size, c_off);
        Py_DECREF(raw);
        if (!data) return -1;
        Py_XSETREF(self->last, Py_NewRef(data));
        self->last_k = k;
        *ptr = PyBytes_AS_STRING(data);
        *owner = data;
    }
    *len = (size_t)d_size;
    /* Kept only if decompressed before, recently enough that a ring of the current limit holding
     * every decompressed frame would still have it: copying in a frame that leaves the ring before
     * its next read costs and saves nothing. */
    uint64_t prev = self->seen[k], before = cache->clock;
    cache->clock += d_size;
    self->seen[k] = cache->clock;
    if (keep && prev && before - prev + d_size <= cache->limit) self->serial[k] = cache_put(cache, *ptr, *len);
    return 0;
}

/* Decompress the frame at src into self->out with libzstd: 0, or -1 with CorruptFrameError set. */
static int decompress_direct(ZstdReader *self, const char *src, size_t n, uint64_t d_size, uint64_t c_off) {
    self->out_k = -1; /* its bytes are about to change */
    if (grow(&self->out, &self->out_len, (size_t)d_size) < 0) return -1;
    size_t frame = Z.frame_size(src, n); /* the first frame only, as python-zstandard reads it */
    size_t r = Z.is_error(frame) ? frame : Z.decompress(Z.dctx, self->out, (size_t)d_size, src, frame);
    if (Z.is_error(r)) {
        PyObject *cause = PyObject_CallFunction(self->zstd_error, "s", Z.error_name(r));
        if (cause) {
            PyErr_SetObject(self->zstd_error, cause);
            Py_DECREF(cause);
        }
        frame_error(self, c_off, PyUnicode_FromFormat("corrupt zstd frame (%s)", Z.error_name(r)));
        return -1;
    }
    if (r != d_size) {
        frame_error(self, c_off, PyUnicode_FromFormat("zstd frame decompresses to %zu bytes, the index says %llu", r, (unsigned long long)d_size));
        return -1;
    }
    return 0;
}

/* Decompress raw (the frame) with python-zstandard: a new bytes object, or NULL with CorruptFrameError set. */
static PyObject *decompress_python(ZstdReader *self, PyObject *raw, int sized, uint64_t d_size, uint64_t c_off) {
    PyObject *data;
    PyObject *decompress = self->decompress, *own = NULL;
    if (self->decoding) { /* another thread is inside this reader's decompressor: use a new one */
        PyObject *dctx = PyObject_CallNoArgs(self->decompressor);
        own = decompress = dctx ? PyObject_GetAttrString(dctx, "decompress") : NULL;
        Py_XDECREF(dctx);
    } else {
        self->decoding++;
    }
    if (!decompress) {
        data = NULL;
    } else if (sized) { /* the header's size, checked: one positional argument */
        data = PyObject_Vectorcall(decompress, &raw, 1, NULL);
    } else {
        PyObject *limit = PyLong_FromUnsignedLongLong(d_size);
        PyObject *args[2] = {raw, limit};
        data = limit ? PyObject_Vectorcall(decompress, args, 1, k_max_output_size_names) : NULL;
        Py_XDECREF(limit);
    }
    if (own) Py_DECREF(own);
    else if (decompress) self->decoding--;
    if (!data) {
        if (PyErr_ExceptionMatches(self->zstd_error)) {
            PyObject *type, *exc, *tb;
            PyErr_Fetch(&type, &exc, &tb);
            PyErr_NormalizeException(&type, &exc, &tb);
            PyObject *what = exc ? PyUnicode_FromFormat("corrupt zstd frame (%S)", exc) : NULL;
            PyErr_Restore(type, exc, tb);
            frame_error(self, c_off, what);
        }
        return NULL;
    }
    if (!PyBytes_Check(data) || (uint64_t)PyBytes_GET_SIZE(data) != d_size) {
        Py_ssize_t n = PyBytes_Check(data) ? PyBytes_GET_SIZE(data) : -1;
        Py_DECREF(data);
        frame_error(self, c_off, PyUnicode_FromFormat("zstd frame decompresses to %zd bytes, the index says %llu", n, (unsigned long long)d_size));
        return NULL;
    }
    return data;
}

/* The bytes [offset, offset + size) (fewer only at the end of the shard): *ptr, *len, and *owner, a new
 * reference to the bytes object that holds them, or NULL when they lie in the cache's ring (valid until
 * the ring next takes a frame). 0, or -1 with an exception set. */
static int zstd_view(ZstdReader *self, uint64_t offset, uint64_t size, const char **ptr, size_t *len, PyObject **owner) {
    const uint64_t *t = self->t;
    Py_ssize_t lo = 0, hi = self->n; /* the first frame with d_offset > offset */
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (t[4 * mid + 2] <= offset) lo = mid + 1;
        else hi = mid;
    }
    Py_ssize_t k = lo - 1;
    *owner = NULL;
    *ptr = "";
    *len = 0;
    if (k < 0 || !size) return 0;
    uint64_t start = offset - t[4 * k + 2], d_size = t[4 * k + 3];
    if (start <= d_size && size <= d_size - start) { /* within frame k */
        int whole = start == 0 && size == d_size; /* a frame that holds just this range is not kept */
        if (get_frame(self, k, !whole, ptr, len, owner) < 0) return -1;
        *ptr += start;
        *len = (size_t)size;
        return 0;
    }
    /* across frames: up to the end of the last one */
    uint64_t end = t[4 * (self->n - 1) + 2] + t[4 * (self->n - 1) + 3];
    uint64_t want = end > offset ? (end - offset < size ? end - offset : size) : 0;
    if (want > PY_SSIZE_T_MAX) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)want);
    if (!out) return -1;
    char *dst = PyBytes_AS_STRING(out);
    uint64_t done = 0;
    for (; done < want && k < self->n; k++, start = 0) {
        const char *fp;
        size_t flen;
        PyObject *fowner;
        if (get_frame(self, k, 1, &fp, &flen, &fowner) < 0) {
            Py_DECREF(out);
            return -1;
        }
        uint64_t take = start < flen ? flen - start : 0;
        if (take > want - done) take = want - done;
        memcpy(dst + done, fp + start, (size_t)take);
        done += take;
        Py_XDECREF(fowner);
    }
    if (done != want && _PyBytes_Resize(&out, (Py_ssize_t)done) < 0) return -1;
    *owner = out;
    *ptr = PyBytes_AS_STRING(out);
    *len = (size_t)done;
    return 0;
}

static PyObject *zstd_read_range(ZstdReader *self, uint64_t offset, uint64_t size) {
    const char *ptr;
    size_t len;
    PyObject *owner;
    if (zstd_view(self, offset, size, &ptr, &len, &owner) < 0) return NULL;
    if (owner && ptr == PyBytes_AS_STRING(owner) && (Py_ssize_t)len == PyBytes_GET_SIZE(owner)) return owner;
    PyObject *out = PyBytes_FromStringAndSize(ptr, (Py_ssize_t)len);
    Py_XDECREF(owner);
    return out;
}

int zstdread_view(PyObject *handle, uint64_t offset, uint64_t size, const char **ptr, size_t *len, PyObject **owner) {
    return zstd_view((ZstdReader *)handle, offset, size, ptr, len, owner);
}

static PyObject *ZstdReader_read_at(ZstdReader *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "read_at(offset, size) takes two arguments");
        return NULL;
    }
    long long offset = PyLong_AsLongLong(args[0]), size = PyLong_AsLongLong(args[1]);
    if ((offset == -1 || size == -1) && PyErr_Occurred()) return NULL;
    if (offset < 0 || size <= 0) return PyBytes_FromStringAndSize(NULL, 0);
    return zstd_read_range(self, (uint64_t)offset, (uint64_t)size);
}

static PyObject *ZstdReader_close(ZstdReader *self, PyObject *unused) {
    Py_CLEAR(self->last);
    self->out_k = -1;
    if (self->fd >= 0) {
        close(self->fd);
        self->fd = -1;
    }
    Py_CLEAR(self->read_at);
    PyObject *source = self->source;
    self->source = NULL;
    if (source) {
        PyObject *r = PyObject_CallMethod(source, "close", NULL);
        Py_DECREF(source);
        if (!r) return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_NONE;
}

static int ZstdReader_init(ZstdReader *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"path", "source", "frames", "decompressor", "error", "zstd_error", "cache", NULL};
    PyObject *path, *source, *frames, *decompressor, *error, *zstd_error, *cache;
    int fd = -1;
    if (self->path || self->has_table) {
        PyErr_SetString(PyExc_RuntimeError, "ZstdReader is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "UOOOOOO!", names, &path, &source, &frames, &decompressor, &error, &zstd_error,
                                     &FrameCacheType, &cache))
        return -1;
    if (PyLong_Check(source)) { /* a local descriptor */
        long v = PyLong_AsLong(source);
        if (v == -1 && PyErr_Occurred()) return -1;
        if (v < 0 || v > INT_MAX) {
            PyErr_SetString(PyExc_ValueError, "source must be a descriptor >= 0 or a handle with read_at");
            return -1;
        }
        fd = (int)v;
    } else {
        PyObject *read_at = PyObject_GetAttrString(source, "read_at");
        if (!read_at) return -1;
        self->read_at = read_at;
        self->source = Py_NewRef(source);
    }
    if (PyObject_GetBuffer(frames, &self->table, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    self->has_table = 1;
    if (self->table.itemsize != 8 || self->table.ndim != 2 || self->table.shape[1] != 4) {
        PyErr_SetString(PyExc_ValueError, "frames must be a C-contiguous (n, 4) uint64 array");
        return -1;
    }
    self->t = self->table.buf;
    self->n = self->table.shape[0];
    self->serial = PyMem_Calloc(self->n ? (size_t)self->n : 1, sizeof(uint64_t));
    self->seen = PyMem_Calloc(self->n ? (size_t)self->n : 1, sizeof(uint64_t));
    if (!self->serial || !self->seen) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject *dctx = PyObject_CallNoArgs(decompressor);
    self->decompress = dctx ? PyObject_GetAttrString(dctx, "decompress") : NULL;
    Py_XDECREF(dctx);
    if (!self->decompress) return -1;
    self->decompressor = Py_NewRef(decompressor);
    self->path = Py_NewRef(path);
    self->error = Py_NewRef(error);
    self->zstd_error = Py_NewRef(zstd_error);
    self->cache = (FrameCache *)Py_NewRef(cache);
    self->fd = fd; /* owned from here on (or the source) */
    return 0;
}

static PyObject *ZstdReader_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    ZstdReader *self = (ZstdReader *)type->tp_alloc(type, 0);
    if (self) {
        self->fd = -1;
        self->out_k = -1;
    }
    return (PyObject *)self;
}

static void ZstdReader_dealloc(ZstdReader *self) {
    if (self->fd >= 0) close(self->fd);
    Py_XDECREF(self->read_at);
    Py_XDECREF(self->source);
    PyMem_Free(self->scratch);
    if (self->has_table) PyBuffer_Release(&self->table);
    PyMem_Free(self->serial);
    PyMem_Free(self->seen);
    PyMem_Free(self->out);
    Py_XDECREF(self->last);
    Py_XDECREF(self->path);
    Py_XDECREF(self->decompress);
    Py_XDECREF(self->decompressor);
    Py_XDECREF(self->error);
    Py_XDECREF(self->zstd_error);
    Py_XDECREF(self->cache);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *ZstdReader_get_fd(ZstdReader *self, void *closure) { return PyLong_FromLong(self->fd); }

static PyObject *ZstdReader_get_path(ZstdReader *self, void *closure) {
    return Py_NewRef(self->path ? self->path : Py_None);
}

/* The decompressed size: the end of the last frame (the frame table's last row). */
static PyObject *ZstdReader_get_size(ZstdReader *self, void *closure) {
    if (!self->has_table || self->n == 0) return PyLong_FromLong(0);
    const uint64_t *last = self->t + 4 * (self->n - 1);
    return PyLong_FromUnsignedLongLong(last[2] + last[3]);
}

/* No descriptor whose positional reads give the tar bytes (they are compressed): None. */
static PyObject *ZstdReader_fileno(ZstdReader *self, PyObject *unused) { Py_RETURN_NONE; }

static PyMethodDef ZstdReader_methods[] = {
    {"fileno", (PyCFunction)ZstdReader_fileno, METH_NOARGS, "None: no descriptor reads the decompressed bytes."},
    {"read_at", (PyCFunction)(void (*)(void))ZstdReader_read_at, METH_FASTCALL, "read_at(offset, size) -> bytes (fewer only at the end of the shard)"},
    {"close", (PyCFunction)ZstdReader_close, METH_NOARGS, "Close the shard file."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ZstdReader_getset[] = {
    {"fd", (getter)ZstdReader_get_fd, NULL, "The shard's descriptor (-1 once closed).", NULL},
    {"path", (getter)ZstdReader_get_path, NULL, "The shard (used in errors).", NULL},
    {"size", (getter)ZstdReader_get_size, NULL, "The decompressed size in bytes (the frame table's end).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ZstdReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tarindex._speedups.ZstdReader",
    .tp_basicsize = sizeof(ZstdReader),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, /* zstd_random adds read_many in Python */
    .tp_doc = "ZstdReader(path, source, frames, decompressor, error, zstd_error, cache): read_at over a zstd shard's frame table (source: an fd or a handle with read_at).",
    .tp_new = ZstdReader_new,
    .tp_init = (initproc)ZstdReader_init,
    .tp_dealloc = (destructor)ZstdReader_dealloc,
    .tp_methods = ZstdReader_methods,
    .tp_getset = ZstdReader_getset,
};

int zstdread_is_reader(PyObject *handle) { return PyObject_TypeCheck(handle, &ZstdReaderType); }

int zstdread_add_types(PyObject *module) {
    load_libzstd();
    if (PyModule_AddFunctions(module, zstdread_functions) < 0) return -1;
    k_max_output_size_names = Py_BuildValue("(s)", "max_output_size");
    if (!k_max_output_size_names || PyType_Ready(&FrameCacheType) < 0 || PyType_Ready(&ZstdReaderType) < 0) return -1;
    if (PyModule_AddObjectRef(module, "FrameCache", (PyObject *)&FrameCacheType) < 0) return -1;
    if (PyModule_AddObjectRef(module, "ZstdReader", (PyObject *)&ZstdReaderType) < 0) return -1;
    return 0;
}
