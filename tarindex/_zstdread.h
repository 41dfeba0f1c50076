/* Random reads of zstd shards (_zstdread.c), as the rest of _speedups sees them. */
#ifndef TARINDEX_ZSTDREAD_H
#define TARINDEX_ZSTDREAD_H
#include <Python.h>
#include <stdint.h>

/* Add FrameCache and ZstdReader to the module; -1 with an exception set on failure. */
int zstdread_add_types(PyObject *module);
/* Whether handle is a ZstdReader. */
int zstdread_is_reader(PyObject *handle);
/* The bytes [offset, offset + size) of a ZstdReader (fewer only at the end of the shard), without a copy:
 * *ptr and *len, and *owner, a new reference to the object holding them, or NULL when they lie in the
 * frame cache, where they stay valid until the next zstd read. 0, or -1 with an exception set. */
int zstdread_view(PyObject *handle, uint64_t offset, uint64_t size, const char **ptr, size_t *len, PyObject **owner);

#endif
