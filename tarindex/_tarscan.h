/* The tar header walk and the packer (_tarscan.c), as the rest of _speedups sees them. */
#ifndef TARINDEX_TARSCAN_H
#define TARINDEX_TARSCAN_H
#include <Python.h>

/* Add scan_headers and Packer to the module; -1 with an exception set on failure. */
int tarscan_add(PyObject *module);

#endif
