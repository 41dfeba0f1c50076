/* The DALI index formatter (_exportfmt.c), as the rest of _speedups sees it. */
#ifndef TARINDEX_EXPORTFMT_H
#define TARINDEX_EXPORTFMT_H
#include <Python.h>

/* Add dali_lines to the module; -1 with an exception set on failure. */
int exportfmt_add(PyObject *module);

#endif
