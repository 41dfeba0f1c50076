/* The per-sample read path of TarDataset, in C.
 *
 * Same behaviour as TarDataset._read_py (the reference implementation, used
 * when this module is not built): sample i's record (tarindex/index/records.py)
 * gives its shard, byte range, members and key; one positional read of the
 * range (the GIL released); a dict with __key__, __url__, __index__ and one
 * bytes entry per extension. Plain tar shards (an int fd) are read here; a
 * shard whose handle is an object with read_at(offset, size) (zstd frames,
 * HTTP ranges) has that called and the members sliced here. Before a sample is returned, its members' tar
 * headers in the bytes read are checked against the record (headers_agree); a read this file does not accept
 * goes to the Python path, whose check (tarindex._readcheck) judges it and names what differs.
 *
 * Handles belong to the dataset's tarindex.access.handles.HandleTable: the reader
 * reads its tables (fds: int32 per shard, -1 when no plain descriptor is open;
 * handles: a list, the read_at object or None) without a call, counts each read
 * in its busy table (uint32 per shard) from before it looks at the tables until
 * the read is done, asks opener.open(shard) for a shard that is not open (which
 * resolves the shard's name in urls too: a shard's first read is read here), and
 * calls opener.reap() after a read while closed handles wait for their reads
 * (busy[n_shards] != 0). The opener closes no handle whose count is not zero.
 *
 * A dataset of some shards of an index (tarindex/view.py) reads through a view: its sample i is index
 * sample rindex[r] + i - rview[r], r the run that holds i (a bisection over the runs; none without a view).
 * The record blocks come from the index's BlockSource (tarindex/index/reader.py): this process's copies,
 * read with pread and checked once. The same object, the guard, is asked to check the index file again
 * (check(): IndexChangedError once it changed) at the first read after check_seconds (a coarse clock read
 * every check_every reads), and gives per shard the bytes its records may span (bounds, filled by
 * bound(shard)): a record outside is the Python path's IndexFormatError, never an allocation of the size
 * a damaged or crafted record claims.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "_batchio.h"
#include "_exportfmt.h"
#include "_tarcore.h"
#include "_tarscan.h"
#include "_resample.h"
#include "_tarwalk.h"
#include "_zstdread.h"

#define READER_MAX_MEMBERS 256    /* more members than this in one sample: the Python path reads it */
#define DIRECT_READ (64 << 10)    /* samples larger than this are read straight into their members' bytes */
#define STACK_READ (16 << 10)     /* a buffer this small lives on the C stack */
#define BLOCK_HEAD 22             /* u32 n, u32 M, u32 n_patterns, u8 key_mode, u8 key_digits, u32 prefix_len, u32 heap_len */

typedef struct {
    PyObject_HEAD
    Py_buffer cols[5];  /* the opener's fds and busy tables, the view's runs, the guard's bounds */
    int ncols;
    PyObject *blocks;   /* blocks(b) -> memoryview of record block b, checked (tarindex/index/records.py) */
    PyObject **bobj;    /* per block: the memoryview of its bytes (this process's copy), once asked for */
    struct Block **bhead; /* per block: its header, copied out of its bytes when the block is first read */
    Py_ssize_t per, n_blocks; /* samples per block */
    Py_ssize_t n, n_exts, n_shards; /* n: samples of the index */
    Py_ssize_t len;     /* samples this reader reads: n, or the view's */
    const uint64_t *rview, *rindex; /* the view's runs (NULL: no view): first sample of each in the view, then len;
                                     * the index sample each run starts at */
    Py_ssize_t nruns;
    PyObject *exts;     /* tuple of str */
    PyObject *urls;     /* list of str, None until a shard's name is resolved (by its handle's open); its length never changes */
    PyObject *opener;   /* the ShardOpener: owns the tables below and every handle */
    PyObject *open;     /* opener.open(shard) -> handle (an int fd or an object with read_at) */
    PyObject *reap;     /* opener.reap(): close the handles whose reads have ended */
    PyObject *handles;  /* opener.handles: list, per shard the read_at object or None */
    PyObject *fallback; /* fallback(i) -> dict, for shards that are not plain tar */
    PyObject *error;    /* error(url, offset, what) -> exception instance */
    PyObject *fork;     /* tarindex._process.FORK: [generation], changed in every forked child */
    long gen;           /* FORK[0] when this reader was made: a reader inherited through fork hands reads to fallback */
    const int32_t *fds; /* opener.fds: per shard, the plain descriptor open here, or -1 */
    uint32_t *busy;     /* opener.busy: per shard, reads in progress here; [n_shards]: handles waiting to close */
    PyObject *check;    /* guard.check(): raises if the index file changed since it was opened (one fstat); or NULL */
    PyObject *bound;    /* guard.bound(shard): fills bounds[shard] from the shard's record */
    const uint64_t *bounds; /* guard.bounds: per shard, 0 until known, then the bytes its records may span */
    int64_t check_ns, due; /* check() at the first read past `due` (a coarse clock), then every check_ns */
    long check_every, countdown; /* the clock read every check_every reads */
    unsigned char *modes; /* per shard: how read_batch reads it (_batchio.h BIO_*), learnt from its reads */
    struct Tail *tails; /* per extension: the bytes a plain member name ends with (headers_agree) */
} Reader;

#define TAIL_MAX 32 /* '.', an extension of up to 30 bytes and a NUL: a longer one is compared by name_agrees */

/* An extension as a member's name field ends with it, made once per reader: '.' and the extension (UTF-8),
 * NULs after them, and their length; len 0 for one the fast path leaves to name_agrees (not UTF-8, a leading
 * "__", a '/', long). */
typedef struct Tail {
    unsigned char len;
    char bytes[TAIL_MAX];
} Tail;

/* A record block's header (layout: tarindex/index/records.py), copied out of its bytes when the block is first
 * read, with what a read derives from it. A warm read then touches the block only at its row and key bytes: at
 * 100M samples the header's page was a second TLB and cache miss per read (half of the C read's own time). */
typedef struct Block {
    const char *rows;           /* the block's rows, in its bytes (bobj) */
    const char *heap;           /* the key heap after them (key_mode 0), in its bytes */
    Py_ssize_t rowlen, key_at;  /* bytes per row; the key column's place in a row */
    uint32_t m, npat, plen, heap_len;
    int mode, digits;
    int plain_prefix;           /* no '.' in the prefix after its last '/': a key of prefix + digits splits as is (plain_key) */
    const uint64_t *bases;      /* 5 + 2m column bases (below) */
    const unsigned char *w;     /* 5 + 2m column widths (below) */
    const char *pats;           /* npat patterns of 1 + m u16 (below) */
    const char *prefix;         /* the keys' common prefix, plen bytes (below) */
    uint64_t tail[];            /* bases, patterns, widths, prefix */
} Block;

/* One sample's record, decoded from its block's row and checked. */
typedef struct {
    uint64_t offset, size;
    uint32_t shard;
    Py_ssize_t nm;      /* members; above READER_MAX_MEMBERS the Python path reads the sample */
    uint64_t mo[READER_MAX_MEMBERS], ms[READER_MAX_MEMBERS]; /* data offset relative to offset, data size */
    uint16_t ext[READER_MAX_MEMBERS];
    const char *prefix, *suffix; /* key: prefix + suffix (key_mode 0) or prefix + number in digits decimals */
    Py_ssize_t plen, slen;
    int digits;
    int plain_prefix;   /* the block's plain_prefix */
    uint64_t number;
} Record;

/* A record's key as bytes (key_text): made once per read for the read check and the sample's __key__. */
#define KEY_MAX 256
typedef struct {
    size_t len;               /* the key's length; above KEY_MAX the bytes are not made */
    char bytes[KEY_MAX + 8];  /* the key, then up to 8 bytes put_digits writes past it */
} KeyText;

static PyObject *k_key, *k_url, *k_index, *k_read_at;
static PyObject *IndexFormatError; /* tarindex.errors.IndexFormatError, handed in once by init() */

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

static inline uint64_t ldw(const char *p, int w) {
    uint64_t v = 0;
    memcpy(&v, p, (size_t)w); /* little-endian hosts */
    return v;
}

static int Reader_traverse(Reader *self, visitproc visit, void *arg) {
    Py_VISIT(self->blocks);
    Py_VISIT(self->exts);
    Py_VISIT(self->urls);
    Py_VISIT(self->opener); /* holds bound methods of the dataset: a cycle the collector must see */
    Py_VISIT(self->open);
    Py_VISIT(self->reap);
    Py_VISIT(self->handles);
    Py_VISIT(self->fallback);
    Py_VISIT(self->error);
    Py_VISIT(self->fork);
    Py_VISIT(self->check);
    Py_VISIT(self->bound);
    return 0;
}

static int Reader_clear(Reader *self) {
    Py_CLEAR(self->blocks);
    Py_CLEAR(self->exts);
    Py_CLEAR(self->urls);
    Py_CLEAR(self->opener);
    Py_CLEAR(self->open);
    Py_CLEAR(self->reap);
    Py_CLEAR(self->handles);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->error);
    Py_CLEAR(self->fork);
    Py_CLEAR(self->check);
    Py_CLEAR(self->bound);
    return 0;
}

static void Reader_dealloc(Reader *self) {
    PyObject_GC_UnTrack(self);
    Reader_clear(self);
    for (int c = 0; c < self->ncols; c++) PyBuffer_Release(&self->cols[c]);
    if (self->bobj)
        for (Py_ssize_t b = 0; b < self->n_blocks; b++) Py_XDECREF(self->bobj[b]);
    PyMem_Free(self->bobj);
    if (self->bhead)
        for (Py_ssize_t b = 0; b < self->n_blocks; b++) PyMem_Free(self->bhead[b]);
    PyMem_Free(self->bhead);
    PyMem_Free(self->modes);
    PyMem_Free(self->tails);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int take(Reader *self, PyObject *obj, const char **out, Py_ssize_t *len, int flags) {
    Py_buffer *view = &self->cols[self->ncols];
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    self->ncols++;
    *out = view->buf;
    *len = view->len;
    return 0;
}

/* The opener's tables and methods, checked against the number of shards. */
static int adopt_opener(Reader *self, PyObject *opener) {
    const char *fds = NULL, *busy = NULL;
    Py_ssize_t fds_len, busy_len;
    PyObject *fds_o = PyObject_GetAttrString(opener, "fds"), *busy_o = PyObject_GetAttrString(opener, "busy");
    int bad = !fds_o || !busy_o || take(self, fds_o, &fds, &fds_len, PyBUF_SIMPLE) < 0 ||
              take(self, busy_o, &busy, &busy_len, PyBUF_WRITABLE) < 0;
    Py_XDECREF(fds_o);
    Py_XDECREF(busy_o);
    if (bad) return -1;
    self->open = PyObject_GetAttrString(opener, "open");
    self->reap = self->open ? PyObject_GetAttrString(opener, "reap") : NULL;
    self->handles = self->reap ? PyObject_GetAttrString(opener, "handles") : NULL;
    if (!self->handles) return -1;
    if (fds_len != 4 * self->n_shards || busy_len != 4 * (self->n_shards + 1) || !PyList_CheckExact(self->handles) ||
        PyList_GET_SIZE(self->handles) != self->n_shards) {
        PyErr_SetString(PyExc_ValueError, "the opener's tables do not match the index's shards");
        return -1;
    }
    self->fds = (const int32_t *)fds;
    self->busy = (uint32_t *)busy;
    return 0;
}

/* The view's runs (run_view: nruns + 1 uint64, run_index: nruns uint64), checked: run_view starts at 0 and
 * ascends, every run lies within the index's samples. */
static int adopt_view(Reader *self, PyObject *view) {
    PyObject *starts, *index;
    const char *sv, *iv;
    Py_ssize_t slen, ilen;
    if (!PyArg_ParseTuple(view, "OO;view must be (run_view, run_index)", &starts, &index) ||
        take(self, starts, &sv, &slen, PyBUF_SIMPLE) < 0 || take(self, index, &iv, &ilen, PyBUF_SIMPLE) < 0)
        return -1;
    const uint64_t *v = (const uint64_t *)sv, *x = (const uint64_t *)iv;
    Py_ssize_t nruns = ilen / 8;
    int bad = slen % 8 || ilen % 8 || slen / 8 != nruns + 1 || v[0] != 0 || v[nruns] > (uint64_t)PY_SSIZE_T_MAX;
    for (Py_ssize_t r = 0; !bad && r < nruns; r++)
        bad = v[r + 1] <= v[r] || x[r] > (uint64_t)self->n || v[r + 1] - v[r] > (uint64_t)self->n - x[r];
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "the view's runs do not fit the index");
        return -1;
    }
    self->rview = v;
    self->rindex = x;
    self->nruns = nruns;
    self->len = (Py_ssize_t)v[nruns];
    return 0;
}

/* The index's number of view sample i (0 <= i < len): the run that holds it, found by bisection. */
static inline Py_ssize_t to_index(const Reader *self, Py_ssize_t i) {
    const uint64_t *v = self->rview;
    Py_ssize_t lo = 0, hi = self->nruns;
    while (hi - lo > 1) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (v[mid] <= (uint64_t)i) lo = mid;
        else hi = mid;
    }
    return (Py_ssize_t)(self->rindex[lo] + ((uint64_t)i - v[lo]));
}

/* A cheap monotonic clock (the coarse one: a few ns through the vDSO, a few ms resolution). */
static inline int64_t clock_ns(void) {
    struct timespec t;
#ifdef CLOCK_MONOTONIC_COARSE
    clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
#else
    clock_gettime(CLOCK_MONOTONIC, &t);
#endif
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* The guard's check(), bound(shard), bounds (a u64 per shard) and check_seconds (tarindex/index/reader.py BlockSource). */
static int adopt_guard(Reader *self, PyObject *guard) {
    const char *bounds = NULL;
    Py_ssize_t len;
    PyObject *seconds = PyObject_GetAttrString(guard, "check_seconds"), *bounds_o = PyObject_GetAttrString(guard, "bounds");
    PyObject *every = seconds && bounds_o ? PyObject_GetAttrString(guard, "check_every") : NULL;
    double s = seconds ? PyFloat_AsDouble(seconds) : -1;
    long e = every ? PyLong_AsLong(every) : -1;
    int bad = !every || (s == -1 && PyErr_Occurred()) || (e == -1 && PyErr_Occurred()) ||
              take(self, bounds_o, &bounds, &len, PyBUF_SIMPLE) < 0;
    Py_XDECREF(seconds);
    Py_XDECREF(bounds_o);
    Py_XDECREF(every);
    if (bad) return -1;
    self->check = PyObject_GetAttrString(guard, "check");
    self->bound = self->check ? PyObject_GetAttrString(guard, "bound") : NULL;
    if (!self->bound) return -1;
    if (len != 8 * self->n_shards) {
        PyErr_SetString(PyExc_ValueError, "the guard's bounds do not match the index's shards");
        return -1;
    }
    self->bounds = (const uint64_t *)bounds;
    self->check_ns = (int64_t)(s * 1e9);
    self->due = clock_ns() + self->check_ns;
    self->check_every = e > 0 ? e : 1;
    self->countdown = 0;
    return 0;
}

/* The fields of a tarindex._native.ReaderConfig, in the order reader_setup takes them. */
static const char *const config_fields[] = {"blocks", "block_samples", "n_samples", "exts", "names", "handles",
                                            "fallback", "error", "fork", "runs", "guard"};
#define N_CONFIG_FIELDS 11

static int reader_setup(Reader *self, PyObject *fields);

/* Each extension's Tail (the exts tuple holds str: anything else is an error). */
static int make_tails(Reader *self) {
    for (Py_ssize_t e = 0; e < self->n_exts; e++) {
        PyObject *ext = PyTuple_GET_ITEM(self->exts, e);
        Py_ssize_t len;
        if (!PyUnicode_Check(ext)) {
            PyErr_SetString(PyExc_TypeError, "exts must be a tuple of str");
            return -1;
        }
        const char *utf8 = PyUnicode_AsUTF8AndSize(ext, &len);
        if (!utf8) {
            PyErr_Clear(); /* not UTF-8 (surrogates): the Python check compares it */
            continue;
        }
        if (len + 2 > TAIL_MAX || memchr(utf8, '/', (size_t)len) || (len >= 2 && utf8[0] == '_' && utf8[1] == '_')) continue;
        Tail *t = &self->tails[e];
        t->bytes[0] = '.';
        memcpy(t->bytes + 1, utf8, (size_t)len);
        t->len = (unsigned char)(len + 1);
    }
    return 0;
}

/* Reader(config): one tarindex._native.ReaderConfig, its fields read once here. */
static int Reader_init(Reader *self, PyObject *args, PyObject *kw) {
    PyObject *config;
    if (!IndexFormatError) {
        PyErr_SetString(PyExc_RuntimeError, "tarindex._speedups.init() was not called (tarindex._native calls it)");
        return -1;
    }
    if (kw && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "Reader(config) takes no keywords");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "O:Reader", &config)) return -1;
    PyObject *fields = PyTuple_New(N_CONFIG_FIELDS);
    if (!fields) return -1;
    for (Py_ssize_t k = 0; k < N_CONFIG_FIELDS; k++) {
        PyObject *v = PyObject_GetAttrString(config, config_fields[k]);
        if (!v) {
            Py_DECREF(fields);
            return -1;
        }
        PyTuple_SET_ITEM(fields, k, v);
    }
    int r = reader_setup(self, fields);
    Py_DECREF(fields);
    return r;
}

static int reader_setup(Reader *self, PyObject *fields) {
    PyObject *blocks, *exts, *urls, *opener, *fallback, *error, *fork, *view = Py_None, *guard = Py_None;
    Py_ssize_t per, n;
    if (self->exts) {
        PyErr_SetString(PyExc_RuntimeError, "Reader is already initialised");
        return -1;
    }
    if (!IndexFormatError) {
        PyErr_SetString(PyExc_RuntimeError, "tarindex._speedups.init() was not called (tarindex._native calls it)");
        return -1;
    }
    if (!PyArg_ParseTuple(fields, "OnnO!O!OOOO!|OO:ReaderConfig", &blocks, &per, &n, &PyTuple_Type, &exts, &PyList_Type, &urls,
                          &opener, &fallback, &error, &PyList_Type, &fork, &view, &guard))
        return -1;
    if (PyList_GET_SIZE(fork) != 1 || !PyLong_Check(PyList_GET_ITEM(fork, 0))) {
        PyErr_SetString(PyExc_ValueError, "fork must be a list of one int");
        return -1;
    }
    if (per <= 0 || n < 0) {
        PyErr_Format(IndexFormatError, "bad record blocks: %zd samples per block, %zd samples", per, n);
        return -1;
    }
    self->gen = PyLong_AsLong(PyList_GET_ITEM(fork, 0));
    self->blocks = Py_NewRef(blocks);
    self->fork = Py_NewRef(fork);
    self->exts = Py_NewRef(exts);
    self->urls = Py_NewRef(urls);
    self->opener = Py_NewRef(opener);
    self->fallback = Py_NewRef(fallback);
    self->error = Py_NewRef(error);
    self->n = self->len = n;
    self->per = per;
    self->n_blocks = n / per + (n % per != 0);
    self->n_exts = PyTuple_GET_SIZE(self->exts);
    self->n_shards = PyList_GET_SIZE(self->urls);
    self->bobj = PyMem_Calloc(self->n_blocks ? self->n_blocks : 1, sizeof(PyObject *)); /* pages touched as blocks are read */
    self->bhead = PyMem_Calloc(self->n_blocks ? self->n_blocks : 1, sizeof(Block *));
    self->modes = PyMem_Calloc(self->n_shards ? (size_t)self->n_shards : 1, 1); /* BIO_NOWAIT each */
    self->tails = PyMem_Calloc(self->n_exts ? (size_t)self->n_exts : 1, sizeof(Tail));
    if (!self->bobj || !self->bhead || !self->modes || !self->tails) {
        PyErr_NoMemory();
        return -1;
    }
    if (make_tails(self) < 0) return -1;
    if (adopt_opener(self, opener) < 0 || (guard != Py_None && adopt_guard(self, guard) < 0)) return -1;
    return view == Py_None ? 0 : adopt_view(self, view);
}

/* Block b's header, from its bytes `b` (checked by `blocks`: the header, columns and patterns fit). */
static Block *copy_head(const char *b) {
    uint32_t m = ld32(b + 4), npat = ld32(b + 8), plen = ld32(b + 14);
    size_t ncols = 5 + 2 * (size_t)m, npats = 2 * (size_t)npat * (m + 1);
    Block *h = PyMem_Malloc(sizeof(Block) + 8 * ncols + npats + ncols + plen);
    if (!h) return (Block *)PyErr_NoMemory();
    const unsigned char *w = (const unsigned char *)b + BLOCK_HEAD;
    const char *bases = b + BLOCK_HEAD + ncols, *pats = bases + 8 * ncols, *prefix = pats + npats;
    char *tail = (char *)h->tail;
    memcpy(tail, bases, 8 * ncols);
    memcpy(tail + 8 * ncols, pats, npats);
    memcpy(tail + 8 * ncols + npats, w, ncols);
    memcpy(tail + 8 * ncols + npats + ncols, prefix, plen);
    h->bases = (const uint64_t *)tail;
    h->pats = tail + 8 * ncols;
    h->w = (const unsigned char *)tail + 8 * ncols + npats;
    h->prefix = tail + 8 * ncols + npats + ncols;
    h->m = m;
    h->npat = npat;
    h->plen = plen;
    h->heap_len = ld32(b + 18);
    h->mode = (unsigned char)b[12];
    h->digits = (unsigned char)b[13];
    size_t base = plen;
    while (base > 0 && h->prefix[base - 1] != '/') base--;
    h->plain_prefix = !memchr(h->prefix + base, '.', plen - base);
    h->rowlen = h->key_at = 0;
    for (size_t c = 0; c < ncols; c++) {
        if (c == 4) h->key_at = h->rowlen;
        h->rowlen += w[c];
    }
    h->rows = prefix + plen;
    h->heap = h->rows + (size_t)ld32(b) * (size_t)h->rowlen;
    return h;
}

/* Block b's header: its bytes asked of `blocks` once (it checks the block's checksum and layout), then kept. */
static const Block *block(Reader *self, Py_ssize_t b) {
    if (!self->bhead[b]) {
        PyObject *view = PyObject_CallFunction(self->blocks, "n", b);
        if (!view) return NULL;
        if (!PyMemoryView_Check(view) || !PyBuffer_IsContiguous(PyMemoryView_GET_BUFFER(view), 'C')) {
            Py_DECREF(view);
            PyErr_SetString(PyExc_TypeError, "blocks() must return a contiguous memoryview");
            return NULL;
        }
        Block *h = self->bhead[b] ? NULL : copy_head(PyMemoryView_GET_BUFFER(view)->buf);
        if (self->bhead[b] || !h) { /* another thread got it meanwhile, or no memory */
            Py_DECREF(view);
            if (!h) return self->bhead[b];
            PyMem_Free(h);
        } else {
            self->bobj[b] = view;
            self->bhead[b] = h;
        }
    }
    return self->bhead[b];
}

static const uint64_t POW10[20] = {1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL, 100000000ULL,
                                   1000000000ULL, 10000000000ULL, 100000000000ULL, 1000000000000ULL, 10000000000000ULL,
                                   100000000000000ULL, 1000000000000000ULL, 10000000000000000ULL, 100000000000000000ULL,
                                   1000000000000000000ULL, 10000000000000000000ULL};

static inline uint64_t round512(uint64_t x) { return (x + 511) & ~(uint64_t)511; }

/* The index file checked again (check(): one fstat, IndexChangedError once it changed) at the first read
 * past `due` (the clock read every check_every reads): the blocks held here are this process's copies,
 * checked when read, and this makes a changed file an error for them too. 0, or -1 with the error set. */
static int recheck(Reader *self) {
    if (!self->check || --self->countdown >= 0) return 0;
    if (clock_ns() >= self->due) {
        PyObject *ok = PyObject_CallNoArgs(self->check);
        if (!ok) return -1; /* the countdown stays below 0: every later read checks (and raises) again */
        Py_DECREF(ok);
        self->due = clock_ns() + self->check_ns;
    }
    self->countdown = self->check_every;
    return 0;
}

/* Whether a record lies inside what its shard's record allows (bounds[shard], asked of bound() the first
 * time): 0 inside, -2 outside (the Python path names it), -1 on error. A read never allocates for a range
 * the index's own shard record rules out. */
static int within(Reader *self, const Record *r) {
    if (!self->bounds) return 0;
    uint64_t bound = self->bounds[r->shard];
    if (!bound) {
        PyObject *got = PyObject_CallFunction(self->bound, "I", r->shard);
        if (!got) return -1;
        Py_DECREF(got);
        bound = self->bounds[r->shard];
    }
    return r->size > bound || r->offset > bound - r->size ? -2 : 0;
}

/* Record i, decoded from its block's row (layout: tarindex/index/records.py) and checked: every member
 * inside the sample's range, in order; a known pattern, shard and key; the range inside the shard's
 * recorded size. The block's header and layout were checked when it was first read. Returns 0, -1 (an
 * error set) or -2 (a damaged record: the Python path makes the same checks, and its error names the
 * index file). */
static int load(Reader *self, Py_ssize_t i, Record *r) {
    if (recheck(self) < 0) return -1;
    const Block *b = block(self, i / self->per);
    if (!b) return -1;
    Py_ssize_t j = i % self->per;
    uint32_t m = b->m, npat = b->npat;
    const unsigned char *w = b->w;
    const uint64_t *bases = b->bases;
    r->prefix = b->prefix;
    r->plen = b->plen;
    const char *row = b->rows + j * b->rowlen, *p = row;
    uint64_t f[5];
    for (int c = 0; c < 5; c++) {
        f[c] = bases[c] + ldw(p, w[c]);
        p += w[c];
    }
    if (f[0] >= (uint64_t)self->n_shards || f[3] >= npat) goto bad;
    r->shard = (uint32_t)f[0];
    r->offset = f[1];
    const char *pat = b->pats + 2 * (size_t)f[3] * (m + 1);
    uint16_t count = ld16(pat);
    r->nm = count;
    uint64_t pos = 0;
    if (count <= READER_MAX_MEMBERS) {
        for (Py_ssize_t k = 0; k < count; k++) {
            uint64_t predicted = k ? round512(pos) + 512 : 512;
            uint64_t mo = predicted + bases[5 + 2 * k] + ldw(p, w[5 + 2 * k]);
            p += w[5 + 2 * k];
            uint64_t ms = bases[6 + 2 * k] + ldw(p, w[6 + 2 * k]);
            p += w[6 + 2 * k];
            if (mo < pos) goto bad;
            r->mo[k] = mo;
            r->ms[k] = ms;
            r->ext[k] = ld16(pat + 2 + 2 * k);
            pos = mo + ms;
            if (pos < mo) goto bad;
        }
    }
    r->size = f[2] + (count && count <= READER_MAX_MEMBERS ? round512(pos) : 0);
    if (count > READER_MAX_MEMBERS) return 0; /* the Python path reads (and checks) it */
    if (r->size > PY_SSIZE_T_MAX) goto bad;
    for (Py_ssize_t k = 0; k < count; k++)
        if (r->mo[k] > r->size || r->ms[k] > r->size - r->mo[k]) goto bad;
    int inside = within(self, r);
    if (inside < 0) return inside;
    if (b->mode == 1) {
        r->digits = b->digits;
        r->plain_prefix = b->plain_prefix;
        r->number = f[4] + (uint64_t)j;
        if (r->digits < 20 && r->number >= POW10[r->digits]) goto bad;
        r->suffix = NULL;
        r->slen = 0;
    } else {
        uint64_t start = j ? bases[4] + ldw(row - b->rowlen + b->key_at, w[4]) : 0;
        if (start > f[4] || f[4] > b->heap_len) goto bad;
        r->digits = 0;
        r->suffix = b->heap + start;
        r->slen = (Py_ssize_t)(f[4] - start);
    }
    return 0;
bad: /* the Python path reads it again and raises the error that names the index and the damage */
    return -2;
}

/* Eight decimal digits of v (below 10**8) as ASCII, the first digit in the lowest byte (little-endian: first
 * in memory): the two halves of four digits split into pairs, then into digits, all lanes at once (a
 * multiply and shift divides each lane by 100 for values below 10,000 and by 10 below 100: exact there). */
static inline uint64_t digits8(uint64_t v) {
    uint64_t x = v / 10000 | (v % 10000) << 32, q;
    q = (x * 10486 >> 20) & 0x0000007F0000007FULL;
    x = q | (x - q * 100) << 16;
    q = (x * 103 >> 10) & 0x000F000F000F000FULL;
    x = q | (x - q * 10) << 8;
    return x + 0x3030303030303030ULL;
}

/* The `d` decimals of v (d <= 20, v below 10**d) at out, eight at a time; writes up to 8 bytes past them. */
static void put_digits(char *out, uint64_t v, int d) {
    uint64_t groups[2]; /* the last eight digits, then the eight before them */
    int full = d / 8, lead = d % 8;
    for (int i = 0; i < full; i++) {
        groups[i] = v % 100000000;
        v /= 100000000;
    }
    if (lead) {
        uint64_t w = digits8(v) >> (8 * (8 - lead)); /* the lead digits, NULs after them */
        memcpy(out, &w, 8);
        out += lead;
    }
    for (int i = full - 1; i >= 0; i--, out += 8) {
        uint64_t w = digits8(groups[i]);
        memcpy(out, &w, 8);
    }
}

/* The record's key (prefix + suffix, or prefix + number in `digits` decimals) at buf, which holds its length
 * + 8 bytes. */
static void put_key(const Record *r, char *buf) {
    memcpy(buf, r->prefix, (size_t)r->plen);
    if (r->suffix) memcpy(buf + r->plen, r->suffix, (size_t)r->slen);
    else put_digits(buf + r->plen, r->number, r->digits);
}

/* The record's key into k, once per read: the read check compares its bytes and the sample's __key__ is made
 * of them. A key longer than KEY_MAX is only measured (len): the check leaves it to the Python path,
 * record_key spells it apart. */
static void key_text(const Record *r, KeyText *k) {
    k->len = (size_t)(r->plen + (r->suffix ? r->slen : r->digits));
    if (k->len <= KEY_MAX) put_key(r, k->bytes);
}

/* The key of a record as str (utf-8, surrogateescape), from its text k. */
static PyObject *record_key(const Record *r, const KeyText *k) {
    if (k->len <= KEY_MAX) return PyUnicode_DecodeUTF8(k->bytes, (Py_ssize_t)k->len, "surrogateescape");
    char *buf = PyMem_Malloc(k->len + 8);
    if (!buf) return PyErr_NoMemory();
    put_key(r, buf);
    PyObject *key = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)k->len, "surrogateescape");
    PyMem_Free(buf);
    return key;
}

/* A new sample dict with __key__ (from k), __url__ and __index__ and member k's bytes from vals[k]
 * (references stolen, all of them, also on error); NULL on error. */
static PyObject *new_sample(Reader *self, const Record *r, const KeyText *k, PyObject *index, PyObject **vals) {
    PyObject *d = _PyDict_NewPresized(3 + r->nm);
    PyObject *key = record_key(r, k);
    int bad = !d || !key || PyDict_SetItem(d, k_key, key) < 0 ||
              PyDict_SetItem(d, k_url, PyList_GET_ITEM(self->urls, r->shard)) < 0 || PyDict_SetItem(d, k_index, index) < 0;
    Py_XDECREF(key);
    for (Py_ssize_t k = 0; k < r->nm; k++) {
        if (!bad && PyDict_SetItem(d, PyTuple_GET_ITEM(self->exts, r->ext[k]), vals[k]) < 0) bad = 1;
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
        vals[k] = PyBytes_FromStringAndSize(base + r->mo[k], (Py_ssize_t)r->ms[k]);
        if (!vals[k]) {
            for (Py_ssize_t q = 0; q < k; q++) Py_DECREF(vals[q]);
            return -1;
        }
    }
    return 0;
}

/* Whether a key is one the common split makes (the packer's, _tarscan.c): no leading "__", a base name (after
 * the last '/') that is not empty and has no dot. Then key + '.' + ext splits into this key and ext. */
static int plain_key(const char *key, size_t klen) {
    size_t base = klen;
    while (base > 0 && key[base - 1] != '/') base--;
    return base < klen && !memchr(key + base, '.', klen - base) && !(klen >= 2 && key[0] == '_' && key[1] == '_');
}

/* Whether a member's name (its header's, PAX and GNU long names applied) is the record's key (its `klen`
 * bytes in key, a plain_key), a dot and the extension `ext` (the index's, lower-cased, UTF-8): the name the
 * packer's split turns into this key and extension. Letters after the dot may differ from `ext` in ASCII
 * case only; 0 for anything else (the Python check judges other spellings, other keys, an extension with a
 * '/' or a leading "__"). */
static int name_agrees(const char *key, size_t klen, const unsigned char *name, size_t len, const char *ext, Py_ssize_t ext_len) {
    if (len != klen + 1 + (size_t)ext_len || memcmp(name, key, klen) != 0 || name[klen] != '.') return 0;
    if (ext_len >= 2 && ext[0] == '_' && ext[1] == '_') return 0;
    const unsigned char *got = name + klen + 1;
    for (Py_ssize_t c = 0; c < ext_len; c++) {
        unsigned char b = got[c];
        if (b >= 'A' && b <= 'Z') b += 'a' - 'A';
        if (b != (unsigned char)ext[c] || b == '/') return 0;
    }
    return 1;
}

static int readcheck_on = 1; /* _readcheck(False): tools/bench_readcheck.py measures the check's cost against reads without it */

/* Every read checks the headers it holds: whether each member's headers in the sample's bytes say what
 * record r says (a regular file whose data starts where the record says, of the record's size and name, every
 * checksum valid): a plain header directly after the previous member's data, or after one PAX header whose
 * records cannot rename or resize it, field by field in one call (tar_plain_member, _tarcore.c: the records
 * searched, not parsed; the name as the key and the extension's Tail, the size, both checksums), any other
 * shape with tar_step (_tarcore.c: PAX and GNU long names and PAX sizes applied, a directory or link between
 * members skipped). Member k's headers lie in its gap: the bytes from the end of member k-1's data (0 for
 * k = 0) to its own data, at base + that offset, or, when `gaps` is given (a sample read straight into its
 * members' bytes), one gap after the other in `gaps`. 1: they agree; 0: not shown here (the read goes to the
 * Python path, whose check judges and names any difference: tarindex._readcheck). */
static int headers_agree(Reader *self, const Record *r, const KeyText *kt, const unsigned char *base, const unsigned char *gaps) {
    if (!readcheck_on) return 1;
    uint64_t pos = 0, acc = 0;
    tar_member m;
    const char *key = kt->bytes;
    size_t klen = kt->len;
    if (r->nm == 0 || klen > KEY_MAX) return 0; /* the Python check compares these */
    if (r->suffix || !r->digits ? !plain_key(key, klen) : !r->plain_prefix || (klen >= 2 && key[0] == '_' && key[1] == '_'))
        return 0; /* a key of prefix + digits: plain as its block's prefix is (the digits hold no '/' or '.') */
    for (Py_ssize_t k = 0; k < r->nm; k++) {
        uint64_t mo = r->mo[k], len = mo - pos;
        const unsigned char *g = gaps ? gaps + acc : base + pos;
        size_t at = (size_t)(round512(pos) - pos), need;
        acc += len;
        const Tail *t = &self->tails[r->ext[k]];
        tar_expect want = {(const unsigned char *)key, (const unsigned char *)t->bytes, klen, t->len, r->ms[k]};
        if (t->len && at <= len && tar_plain_member(g + at, (size_t)(len - at), &want)) {
            pos = mo + r->ms[k]; /* a plain header, alone or after a PAX header that changes neither its name nor its size */
            continue;
        }
        PyObject *e = PyTuple_GET_ITEM(self->exts, r->ext[k]);
        Py_ssize_t ext_len;
        const char *ext = PyUnicode_IS_ASCII(e) ? (ext_len = PyUnicode_GET_LENGTH(e), (const char *)PyUnicode_DATA(e))
                                                : PyUnicode_AsUTF8AndSize(e, &ext_len);
        if (!ext) {
            PyErr_Clear(); /* an extension that is not UTF-8 (surrogates): the Python check compares it */
            return 0;
        }
        for (;;) { /* the member's headers, after any non-regular member between (a directory, a link) */
            if (at > len || tar_step(g + at, (size_t)len - at, &m, &need) != TAR_MEMBER) return 0;
            uint64_t data = (uint64_t)at + m.data;
            if (data >= len) {
                if (data > len) return 0;
                break;
            }
            if (m.regular) return 0; /* a regular file the record does not list: the Python check judges */
            at = (size_t)(data + round512(m.size));
        }
        if (!m.regular || m.size != r->ms[k] || !name_agrees(key, klen, m.name, m.name_len, ext, ext_len)) return 0;
        pos = mo + r->ms[k];
    }
    return 1;
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
    KeyText key;
    key_text(r, &key);
    if (!base || got != r->size || !headers_agree(self, r, &key, (const unsigned char *)base, NULL)) {
        Py_DECREF(buf); /* a short read, or headers the Python check must judge: the Python path reads it */
        return PyObject_CallOneArg(self->fallback, index);
    }
    PyObject *vals[READER_MAX_MEMBERS];
    int rc = slice_members(r, base, vals); /* at once: a view in the frame cache lasts until the next zstd read */
    Py_DECREF(buf);
    return rc < 0 ? NULL : new_sample(self, r, &key, index, vals);
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
    PyObject *vals[READER_MAX_MEMBERS];
    struct iovec iov[2 * READER_MAX_MEMBERS + 1];
    char stack[STACK_READ];
    int niov = 0, direct = r->size > DIRECT_READ;
    uint64_t pos = 0, area = r->size; /* bytes of the buffer: the sample, or its headers and padding */
    if (direct) {
        area = 0;
        for (Py_ssize_t k = 0; k < r->nm; k++) {
            uint64_t mo = r->mo[k], ms = r->ms[k];
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
            uint64_t mo = r->mo[k], ms = r->ms[k];
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
    KeyText key;
    key_text(r, &key);
    int err;
    ssize_t got = read_range(fd, iov, niov, r->offset, &err);
    if (err || got < 0 || (uint64_t)got < r->size) {
        PyMem_Free(heap);
        if (direct)
            for (Py_ssize_t q = 0; q < r->nm; q++) Py_DECREF(vals[q]);
        if (err) {
            errno = err;
            return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, PyList_GET_ITEM(self->urls, r->shard));
        }
        return PyObject_CallOneArg(self->fallback, index); /* a short read: the Python path reports it */
    }
    if (!headers_agree(self, r, &key, (const unsigned char *)buf, direct ? (const unsigned char *)buf : NULL)) {
        PyMem_Free(heap); /* headers the Python check must judge: the Python path reads it */
        if (direct)
            for (Py_ssize_t q = 0; q < r->nm; q++) Py_DECREF(vals[q]);
        return PyObject_CallOneArg(self->fallback, index);
    }
    int bad = !direct && slice_members(r, buf, vals) < 0;
    PyMem_Free(heap);
    return bad ? NULL : new_sample(self, r, &key, index, vals);
}

/* The handle of a shard for one read (the caller has counted the read in busy): the descriptor (>= 0), or -1
 * with *handle a new reference to an object with read_at, or -2 on error. A shard not open here is opened
 * by opener.open; its handle is used for this read even if another thread evicts it before the read
 * (the count keeps the opener from closing it meanwhile). */
static int shard_handle(Reader *self, uint32_t shard, PyObject **handle) {
    int fd = self->fds[shard];
    if (fd >= 0) return fd;
    PyObject *h = PyList_GET_ITEM(self->handles, shard);
    if (h != Py_None) {
        *handle = Py_NewRef(h);
        return -1;
    }
    PyObject *got = PyObject_CallFunction(self->open, "I", shard);
    if (!got) return -2;
    if (!PyLong_CheckExact(got)) {
        fd = self->fds[shard]; /* a reader with a descriptor: the table holds it now, read with pread */
        if (fd >= 0) {
            Py_DECREF(got);
            return fd;
        }
        *handle = got;
        return -1;
    }
    long v = PyLong_AsLong(got);
    Py_DECREF(got);
    if (v < 0 || v > INT32_MAX) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "not a file descriptor: %ld", v);
        return -2;
    }
    return (int)v;
}

/* Whether the shard's name (the sample's __url__) is resolved: its handle's open resolves it (the handle table's
 * opener, tarindex.access.open.IndexOpener, reads the shard's record through tarindex.naming.ShardNames), so it
 * is after shard_handle. */
static inline int named(const Reader *self, uint32_t shard) { return PyList_GET_ITEM(self->urls, shard) != Py_None; }

static PyObject *Reader_read(Reader *self, PyObject *arg) {
    if (!self->fds || !self->busy || !self->handles) {
        PyErr_SetString(PyExc_RuntimeError, "Reader is not initialised");
        return NULL;
    }
    PyObject *now = PyList_GET_SIZE(self->fork) == 1 ? PyList_GET_ITEM(self->fork, 0) : NULL;
    if (!now || !PyLong_Check(now) || PyLong_AsLong(now) != self->gen) return PyObject_CallOneArg(self->fallback, arg);
    Py_ssize_t asked = PyLong_CheckExact(arg) ? PyLong_AsSsize_t(arg) : PyNumber_AsSsize_t(arg, PyExc_IndexError); /* numpy ints too */
    if (asked == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) return NULL;
        PyErr_Clear(); /* not an integer: the Python read names what to pass */
        return PyObject_CallOneArg(self->fallback, arg);
    }
    Py_ssize_t i = asked;
    int given = i >= 0 && PyLong_CheckExact(arg); /* then arg itself is __index__ */
    if (i < 0) i += self->len;
    if (i < 0 || i >= self->len) {
        PyErr_Format(PyExc_IndexError, "sample %zd out of range for %zd sample%s", asked, self->len, self->len == 1 ? "" : "s");
        return NULL;
    }
    Record r;
    int loaded = load(self, self->rview ? to_index(self, i) : i, &r);
    if (loaded == -1) return NULL;
    if (loaded == -2) {
        PyObject *index = PyLong_FromSsize_t(i), *out = index ? PyObject_CallOneArg(self->fallback, index) : NULL;
        Py_XDECREF(index);
        if (out) { /* the reference must agree that the record is damaged */
            Py_DECREF(out);
            PyErr_Format(IndexFormatError, "the index record of sample %zd is damaged; rebuild the index", i);
        }
        return NULL;
    }

    if ((Py_ssize_t)r.shard >= PyList_GET_SIZE(self->urls)) { /* a shard the index lacks: the Python path names it */
        PyObject *index = given ? Py_NewRef(arg) : PyLong_FromSsize_t(i), *out = index ? PyObject_CallOneArg(self->fallback, index) : NULL;
        Py_XDECREF(index);
        return out;
    }
    PyObject *handle = NULL, *out = NULL;
    /* From here to the end of the read, the opener closes no handle of this shard (other threads may evict
     * it meanwhile: it is closed once the count is back to zero). */
    self->busy[r.shard]++;
    int fd = r.nm > READER_MAX_MEMBERS ? -3 : shard_handle(self, r.shard, &handle);
    if (fd >= -1 && !named(self, r.shard)) fd = -3; /* the open left the name unresolved: the Python path reads it */
    else __builtin_prefetch(PyList_GET_ITEM(self->urls, r.shard), 1); /* the sample's __url__, written after the read:
                                                                         * in cache by then, not one more miss */
    PyObject *index = fd == -2 ? NULL : given ? Py_NewRef(arg) : PyLong_FromSsize_t(i);
    if (index) {
        if (fd == -3)
            out = PyObject_CallOneArg(self->fallback, index); /* more members than the C path takes */
        else if (fd == -1)
            out = read_handle(self, handle, &r, index);
        else
            out = read_fd(self, fd, &r, index);
        Py_DECREF(index);
    }
    self->busy[r.shard]--;
    Py_XDECREF(handle);
    if (out && self->busy[self->n_shards]) { /* handles wait for their reads to end: maybe this one */
        PyObject *done = PyObject_CallNoArgs(self->reap);
        if (!done) Py_CLEAR(out);
        Py_XDECREF(done);
    }
    return out;
}

/* One sample of read_batch: read with the batch (fd >= 0) or alone by Reader_read (fd < 0). */
typedef struct {
    PyObject *index;   /* __index__ (a new reference), for a sample read with the batch */
    Py_ssize_t range;  /* its range among the batch's (sorted) ranges */
    int fd, counted;   /* counted: busy[shard] holds this sample */
    char *heap;        /* the sample's bytes, or (direct) its headers and padding */
    PyObject **vals;   /* direct: each member's bytes, read in place */
} BatchItem;

typedef struct {
    uint32_t shard;
    uint64_t offset;
    Py_ssize_t item;
} BatchKey;

static int batch_key_cmp(const void *a, const void *b) {
    const BatchKey *x = a, *y = b;
    if (x->shard != y->shard) return x->shard < y->shard ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Sample i's record and handle for a batch (the GIL held): 1 read with the batch (it->fd, it->counted), 0 read
 * alone (a record, shard or handle the plain path does not take), -1 on error. */
static int batch_plan(Reader *self, PyObject *arg, Record *r, BatchItem *it) {
    Py_ssize_t asked = PyLong_CheckExact(arg) ? PyLong_AsSsize_t(arg) : PyNumber_AsSsize_t(arg, PyExc_IndexError);
    if (asked == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) return -1;
        PyErr_Clear(); /* not an integer: Reader_read's fallback names what to pass */
        return 0;
    }
    Py_ssize_t i = asked < 0 ? asked + self->len : asked;
    if (i < 0 || i >= self->len) {
        PyErr_Format(PyExc_IndexError, "sample %zd out of range for %zd sample%s", asked, self->len, self->len == 1 ? "" : "s");
        return -1;
    }
    int loaded = load(self, self->rview ? to_index(self, i) : i, r);
    if (loaded == -1) return -1;
    if (loaded == -2 || r->nm > READER_MAX_MEMBERS || (Py_ssize_t)r->shard >= PyList_GET_SIZE(self->urls)) return 0;
    PyObject *handle = NULL;
    self->busy[r->shard]++;
    it->counted = 1;
    int fd = shard_handle(self, r->shard, &handle);
    if (fd == -2) return -1;
    if (fd == -1 || !named(self, r->shard)) {
        Py_XDECREF(handle); /* a read_at object (zstd, gzip, a URL), or a name left unresolved: read alone */
        return 0;
    }
    it->index = asked >= 0 && PyLong_CheckExact(arg) ? Py_NewRef(arg) : PyLong_FromSsize_t(i);
    if (!it->index) return -1;
    it->fd = fd;
    return 1;
}

/* A planned sample's buffers and iovecs (as read_fd lays them out): `iov` has room for 2 * nm + 1. */
static int batch_buffers(const Record *r, BatchItem *it, struct iovec *iov) {
    int niov = 0;
    if (r->size <= DIRECT_READ) {
        it->heap = PyMem_Malloc(r->size ? r->size : 1);
        if (!it->heap) return PyErr_NoMemory(), -1;
        iov[niov++] = (struct iovec){.iov_base = it->heap, .iov_len = r->size};
        return niov;
    }
    uint64_t pos = 0, area = 0;
    for (Py_ssize_t k = 0; k < r->nm; k++) {
        area += r->mo[k] - pos;
        pos = r->mo[k] + r->ms[k];
    }
    area += r->size - pos;
    it->heap = PyMem_Malloc(area ? area : 1);
    it->vals = PyMem_Calloc(r->nm ? (size_t)r->nm : 1, sizeof(PyObject *));
    if (!it->heap || !it->vals) return PyErr_NoMemory(), -1;
    char *gap = it->heap;
    pos = 0;
    for (Py_ssize_t k = 0; k < r->nm; k++) {
        uint64_t mo = r->mo[k], ms = r->ms[k];
        it->vals[k] = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)ms);
        if (!it->vals[k]) return -1;
        if (mo > pos) {
            iov[niov++] = (struct iovec){.iov_base = gap, .iov_len = mo - pos};
            gap += mo - pos;
        }
        if (ms) iov[niov++] = (struct iovec){.iov_base = PyBytes_AS_STRING(it->vals[k]), .iov_len = ms};
        pos = mo + ms;
    }
    if (r->size > pos) iov[niov++] = (struct iovec){.iov_base = gap, .iov_len = r->size - pos};
    return niov;
}

/* A sample read with the batch, as read_fd finishes one: an error of its read, a short read or headers to
 * judge go the Python path's way. */
static PyObject *batch_sample(Reader *self, const Record *r, BatchItem *it, const bio_range *got) {
    if (got->err) {
        errno = got->err;
        return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, PyList_GET_ITEM(self->urls, r->shard));
    }
    int direct = it->vals != NULL;
    KeyText key;
    key_text(r, &key);
    if (got->got < r->size || !headers_agree(self, r, &key, (const unsigned char *)it->heap, direct ? (const unsigned char *)it->heap : NULL))
        return PyObject_CallOneArg(self->fallback, it->index);
    PyObject *vals[READER_MAX_MEMBERS];
    if (direct) {
        memcpy(vals, it->vals, (size_t)r->nm * sizeof(PyObject *));
        memset(it->vals, 0, (size_t)r->nm * sizeof(PyObject *)); /* new_sample takes them */
    } else if (slice_members(r, it->heap, vals) < 0) {
        return NULL;
    }
    return new_sample(self, r, &key, it->index, vals);
}

static void batch_release(Reader *self, const Record *recs, BatchItem *items, Py_ssize_t n) {
    for (Py_ssize_t k = 0; k < n; k++) {
        BatchItem *it = &items[k];
        PyMem_Free(it->heap);
        if (it->vals) {
            for (Py_ssize_t q = 0; q < recs[k].nm; q++) Py_XDECREF(it->vals[q]);
            PyMem_Free(it->vals);
        }
        Py_XDECREF(it->index);
        if (it->counted) self->busy[recs[k].shard]--;
    }
}

/* read_batch(indices, max_in_flight, coalesce_gap) -> [sample dict], in the order asked: as [read(i) for i in
 * indices], with the plain tar samples' ranges read together by bio_read (_batchio.c) without the GIL: sorted
 * by shard and offset, neighbours merged, the page cache's read inline, the rest max_in_flight at a time. */
static PyObject *Reader_read_batch(Reader *self, PyObject *const *args, Py_ssize_t nargs) {
    long in_flight;
    long long gap;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "read_batch() takes exactly 3 arguments (%zd given)", nargs);
        return NULL;
    }
    if ((in_flight = PyLong_AsLong(args[1])) == -1 && PyErr_Occurred()) return NULL;
    if ((gap = PyLong_AsLongLong(args[2])) == -1 && PyErr_Occurred()) return NULL;
    if (!self->fds || !self->busy || !self->handles) {
        PyErr_SetString(PyExc_RuntimeError, "Reader is not initialised");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "indices must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), planned = 0, niov = 0;
    PyObject **asked = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(n), *now = PyList_GET_SIZE(self->fork) == 1 ? PyList_GET_ITEM(self->fork, 0) : NULL;
    int here = now && PyLong_Check(now) && PyLong_AsLong(now) == self->gen; /* else every read goes to the fallback */
    Record *recs = PyMem_Malloc((n ? (size_t)n : 1) * sizeof(Record));
    BatchItem *items = PyMem_Calloc(n ? (size_t)n : 1, sizeof(BatchItem));
    BatchKey *keys = NULL;
    bio_range *ranges = NULL;
    struct iovec *iov = NULL;
    int ok = 0;
    if (!out || !recs || !items) {
        if (out) PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        items[k].fd = -1;
        int got = here ? batch_plan(self, asked[k], &recs[k], &items[k]) : 0;
        if (got < 0) goto done;
        if (got) {
            planned++;
            niov += 2 * recs[k].nm + 1;
        }
    }
    if (planned) {
        keys = PyMem_Malloc((size_t)planned * sizeof(BatchKey));
        ranges = PyMem_Malloc((size_t)planned * sizeof(bio_range));
        iov = PyMem_Malloc((size_t)niov * sizeof(struct iovec));
        if (!keys || !ranges || !iov) {
            PyErr_NoMemory();
            goto done;
        }
        Py_ssize_t m = 0, used = 0;
        for (Py_ssize_t k = 0; k < n; k++)
            if (items[k].fd >= 0) keys[m++] = (BatchKey){.shard = recs[k].shard, .offset = recs[k].offset, .item = k};
        qsort(keys, (size_t)planned, sizeof(BatchKey), batch_key_cmp);
        for (m = 0; m < planned; m++) {
            Py_ssize_t k = keys[m].item;
            int got = batch_buffers(&recs[k], &items[k], iov + used);
            if (got < 0) goto done;
            items[k].range = m;
            ranges[m] = (bio_range){.fd = items[k].fd, .mode = &self->modes[recs[k].shard], .offset = recs[k].offset,
                                    .size = recs[k].size, .iov = iov + used, .niov = got};
            used += got;
        }
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = bio_read(ranges, (size_t)planned, in_flight > BIO_THREADS_MAX ? BIO_THREADS_MAX : (int)in_flight, gap);
        Py_END_ALLOW_THREADS
        if (rc < 0) {
            PyErr_NoMemory();
            goto done;
        }
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *s = items[k].fd >= 0 ? batch_sample(self, &recs[k], &items[k], &ranges[items[k].range]) : Reader_read(self, asked[k]);
        if (!s) goto done;
        PyList_SET_ITEM(out, k, s);
    }
    ok = 1;
done:
    if (items) batch_release(self, recs, items, n);
    PyMem_Free(keys);
    PyMem_Free(ranges);
    PyMem_Free(iov);
    PyMem_Free(items);
    PyMem_Free(recs);
    Py_DECREF(seq);
    if (self->busy[self->n_shards]) { /* handles wait for their reads to end: maybe these (an error kept) */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *reaped = PyObject_CallNoArgs(self->reap);
        if (!reaped) ok = 0;
        Py_XDECREF(reaped);
        if (type) {
            PyErr_Clear();
            PyErr_Restore(type, value, tb);
        }
    }
    if (!ok) Py_CLEAR(out);
    return out;
}

static PyMethodDef Reader_methods[] = {
    {"read", (PyCFunction)Reader_read, METH_O, "read(i) -> sample dict of bytes"},
    {"read_batch", (PyCFunction)(void (*)(void))Reader_read_batch, METH_FASTCALL,
     "read_batch(indices, max_in_flight, coalesce_gap) -> [sample dict], the ranges read together"},
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


/* init(index_format_error): the error classes the extension raises, handed in once from Python (the
 * extension imports no Python module of its own). */
static PyObject *module_init(PyObject *m, PyObject *args, PyObject *kw) {
    static char *names[] = {"index_format_error", NULL};
    PyObject *error;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "$O!", names, &PyType_Type, &error)) return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)error, (PyTypeObject *)PyExc_Exception)) {
        PyErr_SetString(PyExc_TypeError, "index_format_error must be an exception class");
        return NULL;
    }
    Py_INCREF(error);
    Py_XSETREF(IndexFormatError, error);
    Py_RETURN_NONE;
}

static PyObject *module_readcheck(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    (void)m;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "_readcheck([on]) takes at most one argument");
        return NULL;
    }
    if (nargs == 1) {
        int on = PyObject_IsTrue(args[0]);
        if (on < 0) return NULL;
        readcheck_on = on;
    }
    return PyBool_FromLong(readcheck_on);
}

static PyObject *module_plain_body(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    (void)m;
    if (nargs != 1 || (args[0] != Py_None && !PyUnicode_Check(args[0]))) {
        PyErr_SetString(PyExc_TypeError, "_plain_body(name) takes one argument, a str or None");
        return NULL;
    }
    const char *name = args[0] == Py_None ? NULL : PyUnicode_AsUTF8(args[0]);
    if (args[0] != Py_None && !name) return NULL;
    return PyBool_FromLong(tar_plain_use(name));
}

static PyMethodDef module_methods[] = {
    {"_plain_body", (PyCFunction)(void (*)(void))module_plain_body, METH_FASTCALL,
     "_plain_body(name) -> whether the read check's common-shape body is now the one named ('avx512', 'avx2', 'base'; "
     "None: the CPU's best): tests compare their decisions"},
    {"_readcheck", (PyCFunction)(void (*)(void))module_readcheck, METH_FASTCALL,
     "_readcheck([on]) -> whether the C reader checks each sample's headers (tools/bench_readcheck.py switches it off to measure it)"},
    {"init", (PyCFunction)(void (*)(void))module_init, METH_VARARGS | METH_KEYWORDS,
     "init(*, index_format_error) -> None: the error classes the extension raises (tarindex._native calls it once)"},
    {NULL, NULL, 0, NULL},
};

/* Runs once per import. The extension reads index records, tar numbers and zstd headers little-endian in
 * place: a big-endian host gets an ImportError here, and tarindex uses its pure-Python path. */
static int module_exec(PyObject *m) {
#if PY_BIG_ENDIAN
    PyErr_SetString(PyExc_ImportError,
                    "tarindex._speedups reads little-endian data in place; this big-endian host uses the Python path");
    return -1;
#endif
    if (PyType_Ready(&ReaderType) < 0) return -1;
    /* Constants Python shares with this module: tests/test_native.py checks each against the Python side. */
    if (PyModule_AddIntConstant(m, "BLOCK_HEAD", BLOCK_HEAD) < 0 ||
        PyModule_AddIntConstant(m, "READER_MAX_MEMBERS", READER_MAX_MEMBERS) < 0 ||
        PyModule_AddIntConstant(m, "TAR_BLOCK", TAR_BLOCK) < 0 ||
        PyModule_AddIntConstant(m, "TAR_WINDOW_LARGE", TAR_WINDOW_LARGE) < 0 ||
        PyModule_AddIntConstant(m, "TAR_WINDOW_SMALL", TAR_WINDOW_SMALL) < 0)
        return -1;
    PyObject *max_size = PyLong_FromUnsignedLongLong(TAR_MAX_SIZE);
    if (!max_size || PyModule_AddObject(m, "TAR_MAX_SIZE", max_size) < 0) {
        Py_XDECREF(max_size);
        return -1;
    }
    k_key = PyUnicode_InternFromString("__key__");
    k_url = PyUnicode_InternFromString("__url__");
    k_index = PyUnicode_InternFromString("__index__");
    k_read_at = PyUnicode_InternFromString("read_at");
    if (!k_key || !k_url || !k_index || !k_read_at) return -1;
    Py_INCREF(&ReaderType);
    if (PyModule_AddObject(m, "Reader", (PyObject *)&ReaderType) < 0) {
        Py_DECREF(&ReaderType);
        return -1;
    }
    return tarscan_add(m) < 0 || zstdread_add_types(m) < 0 || resample_add_functions(m) < 0 || exportfmt_add(m) < 0 ? -1 : 0;
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
#ifdef Py_mod_multiple_interpreters
    /* static types and process-wide state (the frame cache, libzstd): one interpreter */
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
#ifdef Py_mod_gil
    /* The free-threading stance: the GIL is needed. The reader's read counts (the opener's busy table),
     * the opener's tables and the frame cache are updated without locks of their own, under the GIL. */
    {Py_mod_gil, Py_MOD_GIL_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_speedups",
    .m_doc = "TarDataset's read path, the tar header walk's common case and the offset-table packer, in C.",
    .m_size = 0,
    .m_methods = module_methods,
    .m_slots = module_slots,
};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModuleDef_Init(&module); }
