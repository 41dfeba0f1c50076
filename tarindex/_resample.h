/* The image resize of tarindex.decode.Image (_resample.c), as the rest of _speedups sees it. */
#ifndef TARINDEX_RESAMPLE_H
#define TARINDEX_RESAMPLE_H
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

/* PIL's filter numbers (PIL.Image.Resampling), the convolution ones: nearest (0) is not resampled here. */
enum { RS_LANCZOS = 1, RS_BILINEAR = 2, RS_BICUBIC = 3, RS_BOX = 4, RS_HAMMING = 5 };

/* One image of `channels` interleaved uint8 bands, rows `stride` bytes apart. */
typedef struct {
    const uint8_t *pixels;
    int height, width, channels;
    ptrdiff_t stride;
} rs_image;

/* The region box (left, top, right, bottom, in source pixels) of `in` resized to out_h x out_w with the
 * filter, into `out`: HWC (planar 0) or CHW (planar 1), contiguous. The pixels PIL's Image.resize(...,
 * box=box) gives for an 8-bit image: the same coefficients (in double, then 22-bit fixed point), the
 * same two passes in the same order (across then down; down then across with vertical_first), clipped
 * to 8 bits in between. Needs no Python and no GIL. 0, -1 when memory ran out, -2 for a filter it does
 * not know. */
int rs_resample(const rs_image *in, const float box[4], int filter, uint8_t *out, int out_h, int out_w, int planar,
                int vertical_first);

/* Add resample() to the module; -1 with an exception set on failure. */
int resample_add_functions(PyObject *module);

#endif
