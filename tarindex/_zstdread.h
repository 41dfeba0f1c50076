/* Random reads of zstd shards (_zstdread.c), as the rest of _speedups sees them. */
#ifndef TARINDEX_ZSTDREAD_H
#define TARINDEX_ZSTDREAD_H
#include <Python.h>
#include <stdint.h>

/* Add FrameCache and ZstdReader to the module; -1 with an exception set on failure. */
int zstdread_add_types(PyObject *module);
/* Whether handle is a ZstdReader. */
int zstdread_is_reader(PyObject *handle);
/* handle.read_at(offset, size) of a ZstdReader, without the method call: a new bytes object, or NULL. */
PyObject *zstdread_read_at(PyObject *handle, uint64_t offset, uint64_t size);

#endif
