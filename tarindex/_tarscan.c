/* The tar header walk's common case and the packer that groups members while the walk goes, in C.
 *
 * Part of the optional _speedups extension (module init in _speedups.c calls tarscan_add). The
 * Python walker, tarindex.tar._walk, stays the authority on everything unusual; the references are
 * tarindex.grouping.TablePacker and tarindex.tar.iter_tar + tarindex.grouping.group_members.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <poll.h>
#include <sys/uio.h>
#include <unistd.h>

#include "_tarcore.h"
#include "_tarscan.h"

static PyObject *k_key, *k_url, *k_index; /* "__key__", "__url__", "__index__", interned by tarscan_add */

/* ---- the walk over a buffer ------------------------------------------------------------
 *
 * scan_headers(buf, pos, base, with_data, limit) -> (entries, pos, last_header, last_size)
 *
 * Walks consecutive members from buf[pos:] with the header step (tar_step, _tarcore.c: checksums first,
 * PAX 'x' and GNU 'L'/'K' headers applied) and returns the regular members as
 * (name, header_offset, data_offset, size, data-or-None) with absolute offsets (base + position),
 * the position after the last member walked (its padded data may end past the buffer), and that
 * member's first header position and size (for the caller's truncation error).
 * It stops, without consuming it, at the first member the step does not vouch for (a zero block, a
 * global PAX header, a sparse member, a damaged header or record: tarindex.tar._walk judges those and
 * names every error), whose headers do not fit in the buffer, or (with_data) whose data does not.
 */
static PyObject *scan_headers(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, limit;
    long long base;
    int with_data;
    if (!PyArg_ParseTuple(args, "y*nLpn", &view, &pos, &base, &with_data, &limit)) return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t end = view.len;
    PyObject *entries = PyList_New(0);
    Py_ssize_t last_at = pos;
    uint64_t last_size = 0;
    if (!entries) goto fail;
    while (pos >= 0 && pos + 512 <= end && PyList_GET_SIZE(entries) < limit) {
        tar_member m;
        size_t need;
        if (tar_step(buf + pos, (size_t)(end - pos), &m, &need) != TAR_MEMBER) break;
        uint64_t size = m.size, padded = (size + 511) & ~(uint64_t)511;
        Py_ssize_t data = pos + (Py_ssize_t)m.data;
        if (padded > (uint64_t)PY_SSIZE_T_MAX - (uint64_t)data) break;
        if (m.regular) {
            if (with_data && (uint64_t)(end - data) < size) break;
            PyObject *name = PyUnicode_DecodeUTF8((const char *)m.name, (Py_ssize_t)m.name_len, "surrogateescape");
            PyObject *payload = with_data ? PyBytes_FromStringAndSize((const char *)buf + data, (Py_ssize_t)size)
                                          : (Py_INCREF(Py_None), Py_None);
            PyObject *entry = (name && payload)
                                  ? Py_BuildValue("(NLLKN)", name, base + pos, base + data, (unsigned long long)size, payload)
                                  : NULL;
            if (!entry) {
                if (!name || !payload) {
                    Py_XDECREF(name);
                    Py_XDECREF(payload);
                }
                goto fail;
            }
            int rc = PyList_Append(entries, entry);
            Py_DECREF(entry);
            if (rc < 0) goto fail;
        }
        last_at = pos;
        last_size = size;
        pos = data + (Py_ssize_t)padded;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(NnnK)", entries, pos, last_at, (unsigned long long)last_size);
fail:
    Py_XDECREF(entries);
    PyBuffer_Release(&view);
    return NULL;
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
 *   All three stop once `limit` data bytes are done, or at a repeated extension, and leave a member over
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
    unsigned char *win;   /* scan_file's window */
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
    if (id > 65535) {
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

/* The data of a member at buf[data:], or NULL with no error set when it does not fit (end). */
static PyObject *member_data(const unsigned char *buf, Py_ssize_t end, Py_ssize_t data, uint64_t size) {
    if ((uint64_t)(end - data) < size) return NULL;
    return PyBytes_FromStringAndSize((const char *)buf + data, (Py_ssize_t)size);
}

static PyObject *Packer_scan(Packer *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos;
    long long base, limit = -1;
    unsigned long long max_member = TAR_MAX_SIZE;
    if (!ready(self) || !PyArg_ParseTuple(args, "y*nL|LK", &view, &pos, &base, &limit, &max_member)) return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t end = view.len, last_at = pos;
    uint64_t last_size = 0;
    while (pos >= 0 && pos + 512 <= end) {
        tar_member m;
        size_t need;
        if (tar_step(buf + pos, (size_t)(end - pos), &m, &need) != TAR_MEMBER) break;
        uint64_t size = m.size, padded = (size + 511) & ~(uint64_t)511;
        Py_ssize_t data = pos + (Py_ssize_t)m.data;
        if (padded > (uint64_t)PY_SSIZE_T_MAX - (uint64_t)data || size > max_member) break; /* over: the Python walker names it */
        if (m.regular) {
            PyObject *bytes = NULL;
            if (self->url && !(bytes = member_data(buf, end, data, size))) {
                if (PyErr_Occurred()) goto fail;
                break; /* the data runs past the buffer: the Python walker joins it */
            }
            int rc = pack(self, (const char *)m.name, (Py_ssize_t)m.name_len, NULL, (uint64_t)(base + pos), (uint64_t)(base + data), size, bytes);
            Py_XDECREF(bytes);
            if (rc < 0) goto fail;
        }
        last_at = pos;
        last_size = size;
        pos = data + (Py_ssize_t)padded;
        if (self->url && limit >= 0 && (self->held >= (uint64_t)limit || self->error)) break; /* the caller takes the samples */
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(nnK)", pos, last_at, (unsigned long long)last_size);
fail:
    PyBuffer_Release(&view);
    return NULL;
}

#define WINDOW_LARGE (64 << 10) /* headers of small members: several per read */
#define WINDOW_SMALL (8 << 10)  /* after a member larger than this outgrew the window: little data read twice; a
                                   * sample's small members with a PAX header each fit */

/* The next window's size once a member of `padded` bytes (padding included) ended, `in_hand` of its
 * data bytes having come with its header's window: both walks (file and stream) follow this rule. */
static size_t next_window(uint64_t in_hand, uint64_t padded) {
    return in_hand < padded && padded > WINDOW_SMALL ? WINDOW_SMALL : WINDOW_LARGE;
}

/* pread all of it unless the file ends (GIL released); the bytes read, or -1 with errno. */
static Py_ssize_t pread_full(int fd, void *buf, size_t n, uint64_t offset) {
    size_t got = 0;
    ssize_t r = 0;
    Py_BEGIN_ALLOW_THREADS
    while (got < n) {
        r = pread(fd, (char *)buf + got, n - got, (off_t)(offset + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    Py_END_ALLOW_THREADS
    return r < 0 ? -1 : (Py_ssize_t)got;
}

static PyObject *Packer_scan_file(Packer *self, PyObject *args) {
    int fd;
    unsigned long long offset, file_size;
    long long limit;
    Py_buffer view;
    Py_ssize_t pos;
    unsigned long long max_member = TAR_MAX_SIZE;
    if (!ready(self) || !PyArg_ParseTuple(args, "iKKLy*n|K", &fd, &offset, &file_size, &limit, &view, &pos, &max_member)) return NULL;
    tar_member first;
    size_t need;
    int plain = pos >= 0 && pos + 512 <= view.len && tar_step((const unsigned char *)view.buf + pos, (size_t)(view.len - pos), &first, &need) != TAR_DEFER;
    PyBuffer_Release(&view);
    if (!plain) return Py_BuildValue("(KKK)", offset, offset, 0ULL); /* the caller's header is the Python walker's */
    if (!self->url) {
        PyErr_SetString(PyExc_RuntimeError, "scan_file makes sample dicts: Packer(..., url, index)");
        return NULL;
    }
    if (!self->win && !(self->win = PyMem_Malloc(WINDOW_LARGE))) return PyErr_NoMemory();
    unsigned long long wbase = offset, last_at = offset, last_size = 0;
    Py_ssize_t wlen = 0, want = WINDOW_LARGE;
    size_t headers = 512; /* the bytes the next member's headers need in the window */
    while (self->held < (uint64_t)limit && !self->error) {
        if (offset < wbase || offset + headers > wbase + (unsigned long long)wlen) { /* the next member: a new window */
            wbase = offset;
            wlen = pread_full(fd, self->win, (size_t)(want > (Py_ssize_t)headers ? want : (Py_ssize_t)headers), offset);
            if (wlen < 0) return PyErr_SetFromErrno(PyExc_OSError);
            if ((size_t)wlen < headers) break; /* the end of the file: the Python walker says what is missing */
        }
        const unsigned char *h = self->win + (offset - wbase);
        tar_member m;
        int k = tar_step(h, (size_t)(wbase + (unsigned long long)wlen - offset), &m, &need);
        if (k == TAR_SHORT && need <= WINDOW_LARGE && need > headers) { /* extension headers: a window that holds them */
            headers = need;
            continue;
        }
        headers = 512;
        if (k != TAR_MEMBER) break;
        uint64_t size = m.size, padded = (size + 511) & ~(uint64_t)511, data = offset + m.data;
        if (size > (uint64_t)PY_SSIZE_T_MAX || padded > file_size || data > file_size - padded || size > max_member)
            break; /* truncated or over max_member: Python says so */
        Py_ssize_t in_window = (Py_ssize_t)(wbase + (unsigned long long)wlen - data); /* >= 0: the headers fit */
        want = (Py_ssize_t)next_window((uint64_t)in_window, padded);
        if (m.regular) {
            PyObject *bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
            if (!bytes) return NULL;
            Py_ssize_t head = (uint64_t)in_window < size ? in_window : (Py_ssize_t)size;
            memcpy(PyBytes_AS_STRING(bytes), self->win + (data - wbase), (size_t)head);
            if ((uint64_t)head < size) { /* the rest straight from the file into the member's bytes */
                Py_ssize_t got = pread_full(fd, PyBytes_AS_STRING(bytes) + head, (size_t)(size - (uint64_t)head), data + (uint64_t)head);
                if (got < 0 || (uint64_t)got < size - (uint64_t)head) {
                    Py_DECREF(bytes);
                    if (got < 0) return PyErr_SetFromErrno(PyExc_OSError);
                    break; /* truncated: the Python walker says so */
                }
            }
            int rc = pack(self, (const char *)m.name, (Py_ssize_t)m.name_len, NULL, offset, data, size, bytes);
            Py_DECREF(bytes);
            if (rc < 0) return NULL;
        }
        last_at = offset;
        last_size = size;
        offset = data + padded;
    }
    return Py_BuildValue("(KKK)", offset, last_at, last_size);
}

#define GROW_FIRST (16 << 20) /* past this, a member of a stream of unknown length grows as its data arrives */

/* ---- scan_fd: the walk over a socket or pipe, read with read() ---------------------------
 *
 * A stream cannot be read twice, so bytes already received stay in a window (self->win) until the
 * walk consumes them, and the call returns what it holds unconsumed for the Python walker. */

typedef struct {
    int fd, timeout_ms;           /* timeout_ms < 0: wait for ever */
    long long remaining;          /* bytes the stream may still deliver; < 0: until the end */
    unsigned long long received;  /* bytes read in this call */
    int yield_ok;                 /* samples are ready: return rather than wait for more bytes */
    int blocking;                 /* a blocking descriptor (a pipe): readiness is asked with poll() */
    int timed_out;                /* poll() waited timeout_ms for nothing */
} FdReader;

/* One read() of up to n bytes (GIL released by the caller), waiting with poll() on a non-blocking
 * descriptor (a Python socket with a timeout), unless yield_ok: then the samples ready go to the
 * consumer first, and the kernel keeps receiving meanwhile. 0 when nothing came: the end, an error,
 * a timeout, a signal, or nothing yet with yield_ok; the caller returns to Python, whose own read of
 * the stream then says which. */
static Py_ssize_t fd_read(FdReader *s, char *p, size_t n) {
    if (s->remaining >= 0 && (unsigned long long)s->remaining < n) n = (size_t)s->remaining;
    if (n == 0) return 0;
    if (s->yield_ok && s->blocking) {
        struct pollfd now = {s->fd, POLLIN, 0};
        if (poll(&now, 1, 0) == 0) return 0; /* nothing yet: the samples ready go first */
    }
    for (;;) {
        ssize_t r = read(s->fd, p, n);
        if (r > 0) {
            s->received += (unsigned long long)r;
            if (s->remaining >= 0) s->remaining -= r;
            return r;
        }
        if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK) || s->yield_ok) return 0; /* EINTR: Python's handlers */
        struct pollfd pfd = {s->fd, POLLIN, 0};
        int k = poll(&pfd, 1, s->timeout_ms);
        s->timed_out = k == 0;
        if (k <= 0) return 0;
    }
}

/* Read until n bytes are in p or the stream stops (GIL released); the bytes read. */
static size_t fd_read_full(FdReader *s, char *p, size_t n) {
    size_t got = 0;
    Py_BEGIN_ALLOW_THREADS
    while (got < n) {
        Py_ssize_t r = fd_read(s, p + got, n - got);
        if (r <= 0) break;
        got += (size_t)r;
    }
    Py_END_ALLOW_THREADS
    return got;
}

/* Bring the window up to `least` bytes (a member's headers): *src and *avail are the unconsumed bytes
 * (fewer than `least`, moved to the window's start), *skip bytes of the stream come first and are dropped.
 * Reads at most `want` (>= least) bytes of window (GIL released). 0 on success, -1 when the stream stopped first. */
static int fd_fill(FdReader *s, unsigned char *win, const unsigned char **src, size_t *avail, uint64_t *skip, size_t want,
                       size_t least) {
    memmove(win, *src, *avail);
    *src = win;
    int ok = 1;
    Py_BEGIN_ALLOW_THREADS
    while (*skip > 0 || *avail < least) {
        Py_ssize_t r = fd_read(s, (char *)win + *avail, want - *avail);
        if (r <= 0) {
            ok = 0;
            break;
        }
        size_t drop = *skip < (uint64_t)r ? (size_t)*skip : (size_t)r;
        if (drop) memmove(win + *avail, win + *avail + drop, (size_t)r - drop);
        *skip -= drop;
        *avail += (size_t)r - drop;
    }
    Py_END_ALLOW_THREADS
    return ok ? 0 : -1;
}

static PyObject *Packer_scan_fd(Packer *self, PyObject *args) {
    FdReader s = {.received = 0, .yield_ok = 0, .blocking = 0, .timed_out = 0};
    long long limit;
    unsigned long long base;
    Py_buffer view;
    Py_ssize_t pos;
    unsigned long long max_member = TAR_MAX_SIZE;
    if (!ready(self) ||
        !PyArg_ParseTuple(args, "iiLLy*nK|K", &s.fd, &s.timeout_ms, &s.remaining, &limit, &view, &pos, &base, &max_member))
        return NULL;
    tar_member m;
    size_t need;
    if (pos < 0 || pos + 512 > view.len || tar_step((const unsigned char *)view.buf + pos, (size_t)(view.len - pos), &m, &need) == TAR_DEFER) {
        PyBuffer_Release(&view); /* the caller's header is the Python walker's */
        return Py_BuildValue("(KOKKKKO)", base + (unsigned long long)pos, Py_None, base + (unsigned long long)pos, 0ULL, 0ULL, 0ULL,
                             Py_False);
    }
    if (!self->url) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_RuntimeError, "scan_fd makes sample dicts: Packer(..., url, index)");
        return NULL;
    }
    if (!self->win && !(self->win = PyMem_Malloc(WINDOW_LARGE))) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    int flags = fcntl(s.fd, F_GETFL);
    s.blocking = flags >= 0 && !(flags & O_NONBLOCK);
    /* src[0:avail]: unconsumed bytes at absolute offset `at` (the caller's buffer, then the window);
     * `skip` bytes after them (padding) are still to be read and dropped */
    const unsigned char *src = (const unsigned char *)view.buf + pos;
    size_t avail = (size_t)(view.len - pos), want = WINDOW_LARGE;
    uint64_t at = base + (uint64_t)pos, skip = 0, last_at = 0, last_size = 0;
    PyObject *tail = NULL;
    size_t headers = 512; /* the bytes the next member's headers need in hand */
    while (self->held < (uint64_t)limit && !self->error) {
        if (skip > 0 || avail < headers) { /* between members: completed samples need not wait for the network */
            s.yield_ok = PyList_GET_SIZE(self->completed) > 0;
            int rc = fd_fill(&s, self->win, &src, &avail, &skip, want > headers ? want : headers, headers);
            s.yield_ok = 0;
            if (rc < 0) break;
        }
        const unsigned char *h = src;
        int k = tar_step(h, avail, &m, &need);
        if (k == TAR_SHORT && need <= WINDOW_LARGE && need > headers) { /* extension headers: read until they are in hand */
            headers = need;
            continue;
        }
        headers = 512;
        if (k != TAR_MEMBER) break;
        uint64_t size = m.size, padded = (size + 511) & ~(uint64_t)511;
        size_t here = avail - m.data; /* data bytes after the headers in hand */
        uint64_t fetched = 0;      /* data bytes read past them, straight into the member */
        if (size > (uint64_t)PY_SSIZE_T_MAX || (s.remaining >= 0 && size > (uint64_t)here + (uint64_t)s.remaining) ||
            size > max_member)
            break; /* more than the stream holds or may hold: the Python walker says what is wrong */
        if (m.regular) {
            /* a stream of unknown length: the member's bytes grow as its data arrives, never more than came */
            uint64_t cap = s.remaining < 0 && size > (uint64_t)here + GROW_FIRST ? (uint64_t)here + GROW_FIRST : size;
            PyObject *bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)cap);
            if (!bytes) goto fail;
            size_t head = (uint64_t)here < size ? here : (size_t)size;
            memcpy(PyBytes_AS_STRING(bytes), h + m.data, head);
            while ((uint64_t)head + fetched < size) { /* the rest straight from the stream into the member's bytes */
                if ((uint64_t)head + fetched == cap) {
                    cap = cap * 2 < size ? cap * 2 : size;
                    if (_PyBytes_Resize(&bytes, (Py_ssize_t)cap) < 0) goto fail; /* bytes is NULL then */
                }
                size_t need = (size_t)(cap - (uint64_t)head - fetched);
                size_t got = fd_read_full(&s, PyBytes_AS_STRING(bytes) + head + fetched, need);
                fetched += got;
                if (got < need) { /* stopped: hand back the headers and the data so far */
                    tail = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(m.data + head + fetched));
                    if (tail) {
                        memcpy(PyBytes_AS_STRING(tail), h, m.data);
                        memcpy(PyBytes_AS_STRING(tail) + m.data, PyBytes_AS_STRING(bytes), head + fetched);
                    }
                    Py_DECREF(bytes);
                    if (!tail) goto fail;
                    src = NULL;
                    avail = 0;
                    break;
                }
            }
            if (tail) break;
            int rc = pack(self, (const char *)m.name, (Py_ssize_t)m.name_len, NULL, at, at + m.data, size, bytes);
            Py_DECREF(bytes);
            if (rc < 0) goto fail;
        }
        last_at = at;
        last_size = size;
        size_t used = (uint64_t)here < padded ? here : (size_t)padded;
        skip = padded - (uint64_t)used - fetched;
        src += m.data + used;
        avail = here - used;
        at += m.data + padded;
        want = next_window((uint64_t)here, padded);
    }
    /* the unconsumed bytes start at `at - skip` when skip > 0 (then none are in hand) */
    uint64_t tail_at = tail ? at : at - skip;
    if (!tail && !(tail = PyBytes_FromStringAndSize(avail ? (const char *)src : "", (Py_ssize_t)avail))) goto fail;
    PyBuffer_Release(&view);
    return Py_BuildValue("(KNKKKKO)", (unsigned long long)tail_at, tail, (unsigned long long)at, (unsigned long long)last_at,
                         (unsigned long long)last_size, s.received, s.timed_out ? Py_True : Py_False);
fail:
    PyBuffer_Release(&view);
    return NULL;
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
