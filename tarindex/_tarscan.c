/* The Python face of the tar walk (_tarwalk.c) and the packer that groups members while the walk goes.
 *
 * Part of the optional _speedups extension (module init in _speedups.c calls tarscan_add). Here are the
 * sinks (entry tuples; offset tables or sample dicts) and the cursors' GIL hooks; the walk itself, its
 * cursors and every rule of it are in _tarwalk.c. The Python walker, tarindex.tar._walk, stays the
 * authority on everything unusual; the references are tarindex.grouping.TablePacker and
 * tarindex.tar.iter_tar + tarindex.grouping.group_members.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "_tarscan.h"
#include "_tarwalk.h"

static PyObject *k_key, *k_url, *k_index; /* "__key__", "__url__", "__index__", interned by tarscan_add */

/* The cursors' blocking reads run without the GIL. */
static void *gil_release(void) { return PyEval_SaveThread(); }
static void gil_take(void *t) { PyEval_RestoreThread((PyThreadState *)t); }

/* ---- scan_headers: the walk over a buffer, entry tuples out ---------------------------------
 *
 * scan_headers(buf, pos, base, with_data, limit) -> (entries, pos, last_header, last_size)
 *
 * Walks consecutive members from buf[pos:] and returns the regular members as
 * (name, header_offset, data_offset, size, data-or-None) with absolute offsets (base + position),
 * the position after the last member walked (its padded data may end past the buffer), and that
 * member's first header position and size (for the caller's truncation error); at most `limit` entries.
 * It stops, without consuming it, at the first member the step does not vouch for (a zero block, a
 * global PAX header, a sparse member, a damaged header or record: tarindex.tar._walk judges those and
 * names every error), whose headers do not fit in the buffer, or (with_data) whose data does not.
 */
typedef struct {
    PyObject *entries, *data; /* data: the member's bytes being filled */
    Py_ssize_t limit;
    int with_data;
} Entries;

static int entry_put(Entries *e, const tar_member *m, uint64_t h, uint64_t d, PyObject *data) {
    PyObject *name = PyUnicode_DecodeUTF8((const char *)m->name, (Py_ssize_t)m->name_len, "surrogateescape");
    PyObject *entry = name ? Py_BuildValue("(NKKKO)", name, (unsigned long long)h, (unsigned long long)d, (unsigned long long)m->size, data)
                           : NULL;
    int rc = entry ? PyList_Append(e->entries, entry) : -1;
    Py_XDECREF(entry);
    return rc;
}

static int entries_member(void *ctx, const tar_member *m, uint64_t h, uint64_t d, uint64_t cap, unsigned char **dst) {
    Entries *e = ctx;
    if (!e->with_data) return entry_put(e, m, h, d, Py_None);
    if (!(e->data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)cap))) return -1; /* cap: the size, in hand */
    *dst = (unsigned char *)PyBytes_AS_STRING(e->data);
    return 0;
}

static int entries_commit(void *ctx, const tar_member *m, uint64_t h, uint64_t d) {
    Entries *e = ctx;
    int rc = entry_put(e, m, h, d, e->data);
    Py_CLEAR(e->data);
    return rc;
}

static int entries_stop(void *ctx) {
    Entries *e = ctx;
    return PyList_GET_SIZE(e->entries) >= e->limit;
}

static PyObject *scan_headers(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, limit;
    long long base;
    int with_data;
    if (!PyArg_ParseTuple(args, "y*nLpn", &view, &pos, &base, &with_data, &limit)) return NULL;
    Entries e = {PyList_New(0), NULL, limit, with_data};
    tar_sink sink = {&e, with_data, entries_member, NULL, entries_commit, entries_stop, NULL};
    tar_cursor c;
    tar_walk_state w = {.max_member = TAR_MAX_SIZE, .last_at = (uint64_t)base + (uint64_t)pos};
    tar_cursor_buffer(&c, view.buf, (size_t)view.len, (size_t)pos, (uint64_t)base);
    int rc = e.entries ? tar_walk(&c, &sink, &w) : TAR_WALK_SINK;
    PyBuffer_Release(&view);
    Py_XDECREF(e.data);
    if (rc != TAR_WALK_STOP) {
        Py_XDECREF(e.entries);
        return NULL;
    }
    return Py_BuildValue("(NnnK)", e.entries, (Py_ssize_t)(c.at - (uint64_t)base), (Py_ssize_t)(w.last_at - (uint64_t)base),
                         (unsigned long long)w.last_size);
}

/* ---- members -> offset tables or sample dicts, while the walk goes -----------------------
 *
 * Packer(sample_key, duplicate): a shard's offset tables, fed member by member.
 *   scan(buf, pos, base) -> (pos, last_header, last_size): walks plain headers like scan_headers
 *       (without data) and packs each regular member at once: no Python object per member.
 *   add(name, header_offset, data_offset, size): one member the Python walker found.
 *   finish() -> (sample_offset, sample_size, sample_nmembers, member_ext, member_offset,
 *                member_size, keys, exts): bytearrays of little-endian u64/u64/u32/u16/u64/u64.
 *
 * Packer(sample_key, duplicate, url, index): sample dicts instead (TarStream), members with data:
 *   {"__key__": key, "__url__": url, "__index__": index (when not None, counting up), ext: bytes}.
 *   scan(buf, pos, base, limit[, max_member]), add(name, header_offset, data_offset, size, data) as above, and
 *   scan_file(fd, offset, size, limit, buf, pos[, max_member]) -> (offset, last_header, last_size): the walk over
 *       a file of `size` bytes from `offset` (whose header the caller has at buf[pos]: nothing is read when the
 *       Python walker must take it), read with pread: headers through a small window, each large
 *       member's data straight into its own bytes object (one copy, as cat makes).
 *   scan_fd(fd, timeout_ms, remaining, limit, buf, pos, base[, max_member])
 *       -> (tail_offset, tail, next_header, last_header, last_size, received, timed_out): the same over a
 *       socket or pipe read with read() (at most `remaining` bytes; < 0: to the end), after the
 *       bytes buf[pos:] at absolute offset base + pos. A stream is read once, so it returns what it
 *       received and did not walk, `tail` (None when the first header is the Python walker's; it
 *       starts at tail_offset; the walk goes on at next_header, maybe past it when padding is still
 *       unread), the bytes it read from fd, and whether a wait for bytes timed out. Any trouble
 *       reading (the end, an error, a timeout, a signal) just stops it: the Python read that follows
 *       says which. Between members, once samples are complete, it returns rather than wait for the
 *       stream (a socket answered EAGAIN, or poll() says a pipe has nothing yet): the consumer gets
 *       them at once.
 *   All three are tar_walk (_tarwalk.c) over a buffer, file or stream cursor with this packer as the sink: they
 *   stop once `limit` data bytes are done, or at a repeated extension, and leave a member over
 *   `max_member` bytes (default TAR_MAX_SIZE; the caller's max_member_size) to the Python walker, which names it.
 *   take() -> ([sample_offset, ...], [dict, ...]) completed so far (no tuple per sample: the cyclic GC
 *       tracks tuples of dicts, and 16 MiB of small samples lived long enough to cost full collections); raises the recorded duplicate once
 *       the samples before it are taken. finish() completes the last sample (take() it after).
 *
 * tarindex.grouping.TablePacker is the reference. Names in the common case (a dot in the base
 * name after its first character, no leading "__") are split here, on bytes (the same split as
 * on the decoded str: '.' and '/' are ASCII); any other name goes to sample_key(name) (the exact
 * Python rules, metadata files included). A repeated extension in a sample stops the packing;
 * duplicate(header_offset, ext, key, name) makes the error, which finish() raises, so a walk
 * error later in the shard still wins, as it does for the reference (which groups at the end).
 */
typedef struct {
    char *p;
    size_t len, cap;
} Grow;

static int grow_put(Grow *g, const void *v, size_t n) {
    if (g->len + n > g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 4096;
        while (cap < g->len + n) cap *= 2;
        char *q = PyMem_Realloc(g->p, cap);
        if (!q) {
            PyErr_NoMemory();
            return -1;
        }
        g->p = q;
        g->cap = cap;
    }
    memcpy(g->p + g->len, v, n);
    g->len += n;
    return 0;
}

static PyObject *grow_take(Grow *g) {
    PyObject *out = PyByteArray_FromStringAndSize(g->p ? g->p : "", (Py_ssize_t)g->len);
    PyMem_Free(g->p);
    g->p = NULL;
    g->len = g->cap = 0;
    return out;
}

#define MAX_SPELLINGS 64 /* extension spellings looked up by memcmp; more go through a dict */

typedef struct {
    char *raw;
    Py_ssize_t len;
    long id;
} Spelling;

typedef struct {
    PyObject_HEAD
    PyObject *sample_key; /* sample_key(name) -> (key, ext) | None */
    PyObject *duplicate;  /* duplicate(header_offset, ext, key, name) -> exception */
    PyObject *keys, *exts;
    PyObject *ext_ids;    /* lower-cased ext -> id */
    PyObject *spell_ids;  /* raw ext bytes -> id, past MAX_SPELLINGS */
    PyObject *error;      /* the first duplicate's exception, for finish() */
    PyObject *url;        /* sample dicts: their __url__; NULL: tables */
    int counting;         /* sample dicts: with __index__ ... */
    long long index;      /* ... the next one */
    PyObject *completed;  /* sample dicts: the completed ones, for take() ... */
    PyObject *offsets;    /* ... and their offsets */
    PyObject *sample;     /* sample dicts: the one being filled */
    uint64_t held;        /* sample dicts: data bytes added since the last take() */
    unsigned char *win;   /* the file and stream walks' window (TAR_WINDOW_LARGE bytes) */
    PyObject *pending;    /* sample dicts: the bytes of the member the walk is filling */
    long long limit;      /* sample dicts: the walk stops once this many data bytes are held (< 0: never) */
    Grow s_off, s_size, s_n, m_ext, m_off, m_size, key;
    int has_key, done;
    uint64_t start, end, samples;
    uint32_t count;
    uint64_t *seen; /* per ext id: the (1-based) sample it last appeared in */
    Py_ssize_t seen_cap;
    Spelling spell[MAX_SPELLINGS];
    int n_spell, hint;
} Packer;

static int Packer_traverse(Packer *self, visitproc visit, void *arg) {
    Py_VISIT(self->sample_key);
    Py_VISIT(self->duplicate);
    Py_VISIT(self->error);
    Py_VISIT(self->completed);
    Py_VISIT(self->offsets);
    Py_VISIT(self->sample);
    return 0;
}

static int Packer_clear(Packer *self) {
    Py_CLEAR(self->sample_key);
    Py_CLEAR(self->duplicate);
    Py_CLEAR(self->keys);
    Py_CLEAR(self->exts);
    Py_CLEAR(self->ext_ids);
    Py_CLEAR(self->spell_ids);
    Py_CLEAR(self->error);
    Py_CLEAR(self->url);
    Py_CLEAR(self->completed);
    Py_CLEAR(self->offsets);
    Py_CLEAR(self->sample);
    Py_CLEAR(self->pending);
    return 0;
}

static void Packer_dealloc(Packer *self) {
    PyObject_GC_UnTrack(self);
    Packer_clear(self);
    Grow *g[] = {&self->s_off, &self->s_size, &self->s_n, &self->m_ext, &self->m_off, &self->m_size, &self->key};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) PyMem_Free(g[i]->p);
    for (int i = 0; i < self->n_spell; i++) PyMem_Free(self->spell[i].raw);
    PyMem_Free(self->seen);
    PyMem_Free(self->win);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Packer_init(Packer *self, PyObject *args, PyObject *kw) {
    PyObject *sample_key, *duplicate, *url = NULL, *index = Py_None;
    if (self->keys) {
        PyErr_SetString(PyExc_RuntimeError, "Packer is already initialised");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OO|UO", &sample_key, &duplicate, &url, &index)) return -1;
    if (url) {
        if (index != Py_None) {
            self->index = PyLong_AsLongLong(index);
            if (self->index == -1 && PyErr_Occurred()) return -1;
            self->counting = 1;
        }
        Py_INCREF(url);
        self->url = url;
        if (!(self->completed = PyList_New(0)) || !(self->offsets = PyList_New(0))) return -1;
    }
    Py_INCREF(sample_key);
    self->sample_key = sample_key;
    Py_INCREF(duplicate);
    self->duplicate = duplicate;
    self->keys = PyList_New(0);
    self->exts = PyList_New(0);
    self->ext_ids = PyDict_New();
    self->spell_ids = PyDict_New();
    return self->keys && self->exts && self->ext_ids && self->spell_ids ? 0 : -1;
}

static int ready(Packer *self) {
    if (!self->keys) {
        PyErr_SetString(PyExc_RuntimeError, "Packer is not initialised");
        return 0;
    }
    if (self->done) {
        PyErr_SetString(PyExc_RuntimeError, "Packer is finished");
        return 0;
    }
    return 1;
}

/* The id of a lower-cased extension (a new one is appended); -1 on error. */
static long ext_id(Packer *self, PyObject *ext) {
    PyObject *got = PyDict_GetItemWithError(self->ext_ids, ext);
    if (got) return PyLong_AsLong(got);
    if (PyErr_Occurred()) return -1;
    Py_ssize_t id = PyList_GET_SIZE(self->exts);
    if (id > 65535 && !self->url) { /* tables number extensions in 16 bits; sample dicts name them */
        PyErr_SetString(PyExc_OverflowError, "more than 65536 distinct extensions in one shard");
        return -1;
    }
    if (id >= self->seen_cap) {
        Py_ssize_t cap = self->seen_cap ? self->seen_cap * 2 : 64;
        uint64_t *q = PyMem_Realloc(self->seen, (size_t)cap * sizeof(uint64_t));
        if (!q) {
            PyErr_NoMemory();
            return -1;
        }
        memset(q + self->seen_cap, 0, (size_t)(cap - self->seen_cap) * sizeof(uint64_t));
        self->seen = q;
        self->seen_cap = cap;
    }
    PyObject *v = PyLong_FromSsize_t(id);
    int bad = !v || PyDict_SetItem(self->ext_ids, ext, v) < 0 || PyList_Append(self->exts, ext) < 0;
    Py_XDECREF(v);
    return bad ? -1 : (long)id;
}

/* The id of an extension as spelled in a name (bytes after the dot); -1 on error. */
static long spelling_id(Packer *self, const char *raw, Py_ssize_t len) {
    for (int i = 0; i < self->n_spell; i++) {
        int j = (self->hint + i) % self->n_spell; /* samples repeat their extensions in order */
        if (self->spell[j].len == len && memcmp(self->spell[j].raw, raw, (size_t)len) == 0) {
            self->hint = j + 1 == self->n_spell ? 0 : j + 1;
            return self->spell[j].id;
        }
    }
    PyObject *bytes = PyBytes_FromStringAndSize(raw, len);
    if (!bytes) return -1;
    PyObject *got = PyDict_GetItemWithError(self->spell_ids, bytes);
    if (got || PyErr_Occurred()) {
        Py_DECREF(bytes);
        return got ? PyLong_AsLong(got) : -1;
    }
    PyObject *text = PyUnicode_DecodeUTF8(raw, len, "surrogateescape");
    PyObject *lower = text ? PyObject_CallMethod(text, "lower", NULL) : NULL; /* str.lower(), as split_key */
    long id = lower ? ext_id(self, lower) : -1;
    Py_XDECREF(text);
    Py_XDECREF(lower);
    if (id >= 0 && self->n_spell < MAX_SPELLINGS) {
        char *copy = PyMem_Malloc(len ? (size_t)len : 1);
        if (!copy) {
            Py_DECREF(bytes);
            PyErr_NoMemory();
            return -1;
        }
        memcpy(copy, raw, (size_t)len);
        self->spell[self->n_spell++] = (Spelling){copy, len, id};
    } else if (id >= 0) {
        PyObject *v = PyLong_FromLong(id);
        if (!v || PyDict_SetItem(self->spell_ids, bytes, v) < 0) id = -1;
        Py_XDECREF(v);
    }
    Py_DECREF(bytes);
    return id;
}

static int close_sample(Packer *self) {
    if (self->url) { /* the sample dict is complete; no (offset, dict) tuple: the GC would track each */
        PyObject *offset = PyLong_FromUnsignedLongLong((unsigned long long)self->start);
        int bad = !offset || PyList_Append(self->offsets, offset) < 0 || PyList_Append(self->completed, self->sample) < 0;
        Py_XDECREF(offset);
        Py_CLEAR(self->sample);
        return bad ? -1 : 0;
    }
    uint64_t size = self->end - self->start;
    return grow_put(&self->s_off, &self->start, 8) < 0 || grow_put(&self->s_size, &size, 8) < 0 ||
                   grow_put(&self->s_n, &self->count, 4) < 0
               ? -1
               : 0;
}

/* Record the first repeated extension (finish() raises it) and stop packing. */
static int duplicate(Packer *self, uint64_t header_offset, long id, const char *name, Py_ssize_t len, PyObject *name_obj) {
    PyObject *text = name_obj ? (Py_INCREF(name_obj), name_obj) : PyUnicode_DecodeUTF8(name, len, "surrogateescape");
    PyObject *key = self->url ? PyDict_GetItemWithError(self->sample, k_key)
                              : PyList_GET_ITEM(self->keys, PyList_GET_SIZE(self->keys) - 1);
    PyObject *exc = text && key ? PyObject_CallFunction(self->duplicate, "KOOO", (unsigned long long)header_offset,
                                                 PyList_GET_ITEM(self->exts, id), key, text)
                         : NULL;
    Py_XDECREF(text);
    if (!exc) return -1;
    self->error = exc;
    return 0;
}

/* A new sample dict: __key__, __url__ and, when counting, __index__. */
static int new_sample_dict(Packer *self, PyObject *key) {
    PyObject *d = PyDict_New();
    if (!d || PyDict_SetItem(d, k_key, key) < 0 || PyDict_SetItem(d, k_url, self->url) < 0) {
        Py_XDECREF(d);
        return -1;
    }
    if (self->counting) {
        PyObject *index = PyLong_FromLongLong(self->index++);
        int bad = !index || PyDict_SetItem(d, k_index, index) < 0;
        Py_XDECREF(index);
        if (bad) {
            Py_DECREF(d);
            return -1;
        }
    }
    self->sample = d;
    return 0;
}

/* Whether an extension is one of a sample's reserved fields (webdataset refuses these as duplicates too). */
static int reserved_ext(PyObject *ext) {
    return PyUnicode_Check(ext) && (PyUnicode_CompareWithASCIIString(ext, "__key__") == 0 ||
                                    PyUnicode_CompareWithASCIIString(ext, "__url__") == 0 ||
                                    PyUnicode_CompareWithASCIIString(ext, "__index__") == 0);
}

/* Pack one regular member (with its bytes in data, sample-dict mode), name its UTF-8
 * (surrogateescape) bytes, name_obj its str or NULL. */
static int pack(Packer *self, const char *name, Py_ssize_t len, PyObject *name_obj, uint64_t h, uint64_t d, uint64_t size,
                PyObject *data) {
    if (self->error) return 0; /* a repeated extension stopped the packing; the walk goes on */
    Py_ssize_t base = len;
    while (base > 0 && name[base - 1] != '/') base--;
    const char *dot = memchr(name + base, '.', (size_t)(len - base));
    const char *key = name;
    Py_ssize_t key_len = 0;
    long id;
    PyObject *split = NULL, *key_bytes = NULL, *key_obj = NULL;
    /* an extension starting "__" may name a reserved field (__key__, __url__, __index__): the full rules judge it */
    if (dot && dot > name + base && !(len >= 2 && name[0] == '_' && name[1] == '_') &&
        !(name + len - dot > 2 && dot[1] == '_' && dot[2] == '_')) {
        key_len = dot - name;
        id = spelling_id(self, dot + 1, len - key_len - 1);
    } else { /* the full rules: webdataset's pattern, metadata files */
        PyObject *text = name_obj ? (Py_INCREF(name_obj), name_obj) : PyUnicode_DecodeUTF8(name, len, "surrogateescape");
        split = text ? PyObject_CallOneArg(self->sample_key, text) : NULL;
        Py_XDECREF(text);
        if (!split) return -1;
        if (split == Py_None) {
            Py_DECREF(split);
            return 0;
        }
        if (!PyTuple_Check(split) || PyTuple_GET_SIZE(split) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(split, 0))) {
            Py_DECREF(split);
            PyErr_SetString(PyExc_TypeError, "sample_key must return (key, ext) or None");
            return -1;
        }
        key_obj = PyTuple_GET_ITEM(split, 0);
        key_bytes = PyUnicode_AsEncodedString(key_obj, "utf-8", "surrogateescape");
        id = key_bytes ? ext_id(self, PyTuple_GET_ITEM(split, 1)) : -1;
        if (key_bytes) {
            key = PyBytes_AS_STRING(key_bytes);
            key_len = PyBytes_GET_SIZE(key_bytes);
        }
    }
    int rc = -1;
    if (id < 0) goto out;
    if (!self->has_key || (size_t)key_len != self->key.len || memcmp(self->key.p, key, (size_t)key_len) != 0) {
        if (self->has_key && close_sample(self) < 0) goto out;
        PyObject *k = key_obj ? (Py_INCREF(key_obj), key_obj) : PyUnicode_DecodeUTF8(key, key_len, "surrogateescape");
        int bad = !k || (self->url ? new_sample_dict(self, k) : PyList_Append(self->keys, k)) < 0;
        Py_XDECREF(k);
        self->key.len = 0;
        if (bad || grow_put(&self->key, key, (size_t)key_len) < 0) goto out;
        self->has_key = 1;
        self->samples++;
        self->start = h;
        self->count = 0;
    } else if (self->seen[id] == self->samples) {
        rc = duplicate(self, h, id, name, len, name_obj);
        goto out;
    }
    if (split && reserved_ext(PyTuple_GET_ITEM(split, 1))) { /* would replace __key__, __url__ or __index__ */
        rc = duplicate(self, h, id, name, len, name_obj);
        goto out;
    }
    self->seen[id] = self->samples;
    if (self->url) {
        if (PyDict_SetItem(self->sample, PyList_GET_ITEM(self->exts, id), data) < 0) goto out;
        self->count++;
        self->held += size;
        rc = 0;
        goto out;
    }
    uint16_t id16 = (uint16_t)id;
    uint64_t rel = d - self->start;
    if (grow_put(&self->m_ext, &id16, 2) < 0 || grow_put(&self->m_off, &rel, 8) < 0 || grow_put(&self->m_size, &size, 8) < 0)
        goto out;
    self->count++;
    self->end = d + ((size + 511) & ~(uint64_t)511);
    rc = 0;
out:
    Py_XDECREF(split);
    Py_XDECREF(key_bytes);
    return rc;
}

/* ---- the Packer as the walk's sink ---- */

static int packer_member(void *ctx, const tar_member *m, uint64_t h, uint64_t d, uint64_t cap, unsigned char **dst) {
    Packer *self = ctx;
    if (!self->url) return pack(self, (const char *)m->name, (Py_ssize_t)m->name_len, NULL, h, d, m->size, NULL);
    if (!(self->pending = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)cap))) return -1;
    *dst = (unsigned char *)PyBytes_AS_STRING(self->pending);
    return 0;
}

static unsigned char *packer_grow(void *ctx, uint64_t cap) {
    Packer *self = ctx;
    return _PyBytes_Resize(&self->pending, (Py_ssize_t)cap) < 0 ? NULL : (unsigned char *)PyBytes_AS_STRING(self->pending);
}

static int packer_commit(void *ctx, const tar_member *m, uint64_t h, uint64_t d) {
    Packer *self = ctx;
    int rc = pack(self, (const char *)m->name, (Py_ssize_t)m->name_len, NULL, h, d, m->size, self->pending);
    Py_CLEAR(self->pending);
    return rc;
}

static int packer_stop(void *ctx) {
    Packer *self = ctx;
    return self->limit >= 0 && (self->held >= (uint64_t)self->limit || self->error); /* the caller takes the samples */
}

static int packer_ready(void *ctx) {
    Packer *self = ctx;
    return self->completed && PyList_GET_SIZE(self->completed) > 0;
}

/* The walk into this packer, members up to max_member bytes: tar_walk's result (an error set when < 0). */
static int packer_walk(Packer *self, tar_cursor *c, tar_walk_state *w, long long limit, unsigned long long max_member) {
    tar_sink sink = {self, self->url != NULL, packer_member, packer_grow, packer_commit, packer_stop, packer_ready};
    self->limit = self->url ? limit : -1;
    *w = (tar_walk_state){.max_member = max_member, .last_at = c->at};
    int rc = tar_walk(c, &sink, w);
    if (rc == TAR_WALK_IOERR) PyErr_SetFromErrno(PyExc_OSError);
    return rc;
}

/* scan(buf, pos, base[, limit[, max_member]]): the walk over a buffer. */
static PyObject *Packer_scan(Packer *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos;
    long long base, limit = -1;
    unsigned long long max_member = TAR_MAX_SIZE;
    if (!ready(self) || !PyArg_ParseTuple(args, "y*nL|LK", &view, &pos, &base, &limit, &max_member)) return NULL;
    tar_cursor c;
    tar_walk_state w;
    tar_cursor_buffer(&c, view.buf, (size_t)view.len, (size_t)pos, (uint64_t)base);
    int rc = packer_walk(self, &c, &w, limit, max_member);
    PyBuffer_Release(&view);
    Py_CLEAR(self->pending);
    if (rc != TAR_WALK_STOP) return NULL;
    return Py_BuildValue("(nnK)", (Py_ssize_t)(c.at - (uint64_t)base), (Py_ssize_t)(w.last_at - (uint64_t)base),
                         (unsigned long long)w.last_size);
}

/* The caller's bytes buf[pos:] as the first view of a file or stream walk (sample dicts only); 0 with an
 * error set, or with *none set when the walk cannot start there (not a block in hand). */
static int walk_start(Packer *self, Py_buffer *view, Py_ssize_t pos, int *none) {
    if (!self->url) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_RuntimeError, "the walk over a file or stream makes sample dicts: Packer(..., url, index)");
        return 0;
    }
    *none = pos < 0 || pos + TAR_BLOCK > view->len;
    if (!*none && !self->win && !(self->win = PyMem_Malloc(TAR_WINDOW_LARGE))) {
        PyBuffer_Release(view);
        PyErr_NoMemory();
        return 0;
    }
    return 1;
}

/* scan_file(fd, offset, size, limit, buf, pos[, max_member]): the walk over a file read with pread,
 * from `offset`, whose bytes the caller has at buf[pos:]. */
static PyObject *Packer_scan_file(Packer *self, PyObject *args) {
    int fd, none;
    unsigned long long offset, file_size, max_member = TAR_MAX_SIZE;
    long long limit;
    Py_buffer view;
    Py_ssize_t pos;
    if (!ready(self) || !PyArg_ParseTuple(args, "iKKLy*n|K", &fd, &offset, &file_size, &limit, &view, &pos, &max_member)) return NULL;
    if (!walk_start(self, &view, pos, &none)) return NULL;
    if (none) {
        PyBuffer_Release(&view);
        return Py_BuildValue("(KKK)", offset, offset, 0ULL);
    }
    tar_cursor c;
    tar_walk_state w;
    tar_cursor_file(&c, fd, file_size, self->win, view.buf, (size_t)view.len, (size_t)pos, offset);
    c.unlock = gil_release;
    c.relock = gil_take;
    int rc = packer_walk(self, &c, &w, limit, max_member);
    PyBuffer_Release(&view);
    Py_CLEAR(self->pending); /* a member cut short by the file's end: the Python walker says so */
    if (rc < 0) return NULL;
    return Py_BuildValue("(KKK)", (unsigned long long)c.at, (unsigned long long)w.last_at, (unsigned long long)w.last_size);
}

/* scan_fd(fd, timeout_ms, remaining, limit, buf, pos, base[, max_member]): the walk over a socket or pipe
 * after the caller's bytes buf[pos:] at base + pos; returns what it received and did not walk. */
static PyObject *Packer_scan_fd(Packer *self, PyObject *args) {
    int fd, timeout_ms, none;
    long long remaining, limit;
    unsigned long long base, max_member = TAR_MAX_SIZE;
    Py_buffer view;
    Py_ssize_t pos;
    if (!ready(self) ||
        !PyArg_ParseTuple(args, "iiLLy*nK|K", &fd, &timeout_ms, &remaining, &limit, &view, &pos, &base, &max_member))
        return NULL;
    if (!walk_start(self, &view, pos, &none)) return NULL;
    uint64_t start = base + (uint64_t)pos;
    tar_cursor c;
    tar_walk_state w;
    tar_cursor_stream(&c, fd, timeout_ms, remaining, self->win, view.buf, none ? 0 : (size_t)view.len, none ? 0 : (size_t)pos, start);
    c.unlock = gil_release;
    c.relock = gil_take;
    int rc = none ? TAR_WALK_STOP : packer_walk(self, &c, &w, limit, max_member);
    PyObject *tail = NULL;
    uint64_t tail_at = c.at - c.skip; /* when skip > 0, nothing is in view */
    if (rc == TAR_WALK_PARTIAL && (tail = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(w.m.data + w.got)))) {
        tail_at = c.at; /* the member's headers and the data so far */
        memcpy(PyBytes_AS_STRING(tail), c.p, w.m.data);
        memcpy(PyBytes_AS_STRING(tail) + w.m.data, PyBytes_AS_STRING(self->pending), (size_t)w.got);
    } else if (rc == TAR_WALK_STOP && (c.received || c.at != start)) {
        tail = PyBytes_FromStringAndSize((const char *)c.p, (Py_ssize_t)c.avail);
    } else if (rc == TAR_WALK_STOP) { /* nothing read, nothing walked: the caller's bytes stay */
        Py_INCREF(Py_None);
        tail = Py_None;
    }
    PyBuffer_Release(&view);
    Py_CLEAR(self->pending);
    if (!tail) return NULL;
    return Py_BuildValue("(KNKKKKO)", (unsigned long long)tail_at, tail, (unsigned long long)c.at,
                         (unsigned long long)(none ? 0 : w.last_at), (unsigned long long)(none ? 0 : w.last_size),
                         (unsigned long long)c.received, c.timed_out ? Py_True : Py_False);
}

static PyObject *Packer_add(Packer *self, PyObject *args) {
    PyObject *name, *data = Py_None;
    unsigned long long h, d, size;
    if (!ready(self) || !PyArg_ParseTuple(args, "UKKK|O", &name, &h, &d, &size, &data)) return NULL;
    if (self->url && !PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "sample dicts need each member's bytes");
        return NULL;
    }
    PyObject *raw = PyUnicode_AsEncodedString(name, "utf-8", "surrogateescape");
    if (!raw) return NULL;
    int rc = pack(self, PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw), name, h, d, size, self->url ? data : NULL);
    Py_DECREF(raw);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Packer_take(Packer *self, PyObject *unused) {
    if (!self->completed) {
        PyErr_SetString(PyExc_RuntimeError, "take() is for sample dicts: Packer(..., url, index)");
        return NULL;
    }
    if (PyList_GET_SIZE(self->completed) == 0 && self->error) {
        PyErr_SetObject((PyObject *)Py_TYPE(self->error), self->error);
        return NULL;
    }
    PyObject *fresh = PyList_New(0), *fresh_offsets = PyList_New(0);
    if (!fresh || !fresh_offsets) {
        Py_XDECREF(fresh);
        Py_XDECREF(fresh_offsets);
        return NULL;
    }
    PyObject *out = Py_BuildValue("(NN)", self->offsets, self->completed); /* N takes both, even on failure */
    self->offsets = fresh_offsets;
    self->completed = fresh;
    if (!out) return NULL;
    self->held = 0;
    return out;
}

static PyObject *Packer_finish(Packer *self, PyObject *unused) {
    if (!ready(self)) return NULL;
    self->done = 1;
    if (self->error && !self->url) {
        PyErr_SetObject((PyObject *)Py_TYPE(self->error), self->error);
        return NULL;
    }
    if (self->has_key && !self->error && close_sample(self) < 0) return NULL;
    if (self->url) Py_RETURN_NONE;
    return Py_BuildValue("(NNNNNNOO)", grow_take(&self->s_off), grow_take(&self->s_size), grow_take(&self->s_n),
                         grow_take(&self->m_ext), grow_take(&self->m_off), grow_take(&self->m_size), self->keys, self->exts);
}

static PyMethodDef Packer_methods[] = {
    {"scan", (PyCFunction)Packer_scan, METH_VARARGS, "scan(buf, pos, base[, limit[, max_member]]) -> (pos, last_header, last_size)"},
    {"scan_file", (PyCFunction)Packer_scan_file, METH_VARARGS,
     "scan_file(fd, offset, size, limit, buf, pos[, max_member]) -> (offset, last_header, last_size)"},
    {"scan_fd", (PyCFunction)Packer_scan_fd, METH_VARARGS,
     "scan_fd(fd, timeout_ms, remaining, limit, buf, pos, base[, max_member]) -> (tail_offset, tail, next_header, last_header, last_size, received, timed_out)"},
    {"add", (PyCFunction)Packer_add, METH_VARARGS, "add(name, header_offset, data_offset, size[, data])"},
    {"take", (PyCFunction)Packer_take, METH_NOARGS, "take() -> ([sample_offset, ...], [sample dict, ...])"},
    {"finish", (PyCFunction)Packer_finish, METH_NOARGS, "finish() -> the offset tables; raises a recorded duplicate"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PackerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tarindex._speedups.Packer",
    .tp_basicsize = sizeof(Packer),
    .tp_dealloc = (destructor)Packer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Packer_traverse,
    .tp_clear = (inquiry)Packer_clear,
    .tp_doc = "A shard's offset tables, or its sample dicts, packed while the tar walk goes.",
    .tp_methods = Packer_methods,
    .tp_init = (initproc)Packer_init,
    .tp_new = PyType_GenericNew,
};

static PyMethodDef tarscan_methods[] = {
    {"scan_headers", scan_headers, METH_VARARGS, "scan_headers(buf, pos, base, with_data, limit) -> (entries, pos, last_header, last_size)"},
    {NULL, NULL, 0, NULL},
};

int tarscan_add(PyObject *module) {
    if (PyType_Ready(&PackerType) < 0) return -1;
    k_key = PyUnicode_InternFromString("__key__");
    k_url = PyUnicode_InternFromString("__url__");
    k_index = PyUnicode_InternFromString("__index__");
    if (!k_key || !k_url || !k_index || PyModule_AddFunctions(module, tarscan_methods) < 0) return -1;
    Py_INCREF(&PackerType);
    if (PyModule_AddObject(module, "Packer", (PyObject *)&PackerType) < 0) {
        Py_DECREF(&PackerType);
        return -1;
    }
    return 0;
}
