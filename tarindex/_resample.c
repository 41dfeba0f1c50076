/* The resize of tarindex.decode.Image: a box of an 8-bit image resized with a convolution filter (box,
 * bilinear, hamming, bicubic, lanczos), giving the pixels PIL's Image.resize gives, without PIL objects
 * and without the GIL, so a batch decodes and resizes in a thread pool straight into its rows.
 *
 * The algorithm is PIL's (its ImagingResample, the reference tests/test_resample.py compares with):
 * per output column and row a window of source pixels and its weights (the filter at the distance,
 * stretched by the scale when shrinking, normalized to sum 1, in double, then rounded to fixed point
 * with 22 fractional bits); two passes, each value rounded and clipped to 8 bits in between: across
 * (over the source rows the vertical pass will read) then down, or, where PIL does (Pillow 13: the
 * height shrinks by more than twice as many pixels as the width), down then across. Integer sums are exact in any order, so
 * the vector code below gives the same bytes as the scalar one.
 *
 * Speed: the vertical pass runs along whole rows (one multiply-add per byte, vectorized by the compiler
 * for AVX2 / SSE4.1 / the baseline, chosen at run time where the toolchain makes function clones); the
 * horizontal pass takes a pixel's bands as one SSE4.1 vector (chosen at run time), else band by band. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3") /* the loops below are written for the vectorizer; -O2's cost model skips them */
#endif
#include "_resample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define RS_X86 1
#include <immintrin.h>
#endif

#if defined(RS_X86) && defined(__GNUC__) && defined(__ELF__) && !defined(__clang__)
#define RS_CLONES __attribute__((target_clones("avx2", "sse4.1", "default")))
#else
#define RS_CLONES
#endif

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

#define FRAC_BITS 22 /* PIL's PRECISION_BITS: 32 bits less 8 for the value and 2 for the filters' overshoot */
#define HALF (1 << (FRAC_BITS - 1))

/* -- the filters (PIL's, expression for expression: the doubles must round alike) ---------------------- */

static double f_box(double x) { return (x > -0.5 && x <= 0.5) ? 1.0 : 0.0; }

static double f_bilinear(double x) {
    if (x < 0.0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

static double f_hamming(double x) {
    if (x < 0.0) x = -x;
    if (x == 0.0) return 1.0;
    if (x >= 1.0) return 0.0;
    x = x * M_PI;
    return sin(x) / x * (0.54f + 0.46f * cos(x)); /* float constants, as PIL writes them */
}

static double f_bicubic(double x) {
    const double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

static double sinc(double x) {
    if (x == 0.0) return 1.0;
    x = x * M_PI;
    return sin(x) / x;
}

static double f_lanczos(double x) { return (-3.0 <= x && x < 3.0) ? sinc(x) * sinc(x / 3) : 0.0; }

typedef struct {
    double (*at)(double);
    double support;
} filter;

static const filter *filter_of(int code) {
    static const filter box = {f_box, 0.5}, bilinear = {f_bilinear, 1.0}, hamming = {f_hamming, 1.0},
                        bicubic = {f_bicubic, 2.0}, lanczos = {f_lanczos, 3.0};
    switch (code) {
        case RS_BOX: return &box;
        case RS_BILINEAR: return &bilinear;
        case RS_HAMMING: return &hamming;
        case RS_BICUBIC: return &bicubic;
        case RS_LANCZOS: return &lanczos;
        default: return NULL;
    }
}

/* -- weights ---------------------------------------------------------------------------------------- */

typedef struct {
    int taps;       /* weights per output position (the widest window) */
    int *first;     /* per output position: the window's first source index */
    int *count;     /* ... and its length */
    int32_t *w;     /* taps weights per output position, fixed point, zero past count */
} weights;

static void weights_free(weights *ws) {
    free(ws->first);
    free(ws->count);
    free(ws->w);
    ws->first = ws->count = NULL;
    ws->w = NULL;
}

static int32_t fixed(double w) {
    return (int32_t)(w < 0 ? -0.5 + w * (1 << FRAC_BITS) : 0.5 + w * (1 << FRAC_BITS));
}

/* The windows and weights that map source positions [lo, hi) of an axis of in_size onto out_size. */
static int weights_make(weights *ws, const filter *f, int in_size, float lo, float hi, int out_size) {
    double scale = (double)(hi - lo) / out_size; /* the difference in float, as PIL's box is */
    double stretch = scale < 1.0 ? 1.0 : scale;
    double support = f->support * stretch;
    double inv = 1.0 / stretch;
    int taps = (int)ceil(support) * 2 + 1;
    double *row = malloc((size_t)taps * sizeof(double));
    ws->taps = taps;
    ws->first = malloc((size_t)out_size * sizeof(int));
    ws->count = malloc((size_t)out_size * sizeof(int));
    ws->w = malloc((size_t)out_size * (size_t)taps * sizeof(int32_t));
    if (!row || !ws->first || !ws->count || !ws->w) {
        free(row);
        weights_free(ws);
        return -1;
    }
    for (int o = 0; o < out_size; o++) {
        double center = lo + (o + 0.5) * scale;
        int start = (int)(center - support + 0.5);
        int end = (int)(center + support + 0.5);
        if (start < 0) start = 0;
        if (end > in_size) end = in_size;
        int n = end - start;
        double sum = 0.0;
        for (int t = 0; t < n; t++) {
            row[t] = f->at((t + start - center + 0.5) * inv);
            sum += row[t];
        }
        int32_t *w = ws->w + (size_t)o * taps;
        for (int t = 0; t < taps; t++) w[t] = t < n ? fixed(sum != 0.0 ? row[t] / sum : row[t]) : 0;
        ws->first[o] = start;
        ws->count[o] = n;
    }
    free(row);
    return 0;
}

static inline uint8_t clip8(int32_t acc) {
    int32_t v = acc >> FRAC_BITS;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* -- the horizontal pass ---------------------------------------------------------------------------- */

/* Where band b of output pixel (x, y) goes: HWC, or CHW (planar) of `rows` rows. */
static inline size_t at(int x, int y, int b, int width, int rows, int c, int planar) {
    return planar ? ((size_t)b * rows + y) * width + x : ((size_t)y * width + x) * c + b;
}

/* The horizontal pass's loops, around KERNEL(p, w, n, px): the bands of one output pixel, from the n source
 * pixels at p and their weights w, into uint8_t px[4]. */
#define HORIZONTAL_LOOPS(KERNEL)                                                                  \
    const int c = in->channels;                                                                   \
    for (int y = 0; y < rows; y++) {                                                              \
        const uint8_t *src = in->pixels + (ptrdiff_t)(row0 + y) * in->stride;                     \
        for (int o = 0; o < out_w; o++) {                                                         \
            uint8_t px[4];                                                                        \
            KERNEL(src + (ptrdiff_t)ws->first[o] * c, ws->w + (size_t)o * ws->taps, ws->count[o], px); \
            if (!planar) {                                                                        \
                memcpy(out + ((size_t)y * out_w + o) * c, px, (size_t)c);                         \
                continue;                                                                         \
            }                                                                                     \
            for (int b = 0; b < c; b++) out[at(o, y, b, out_w, rows, c, 1)] = px[b];              \
        }                                                                                         \
    }

#define SCALAR_KERNEL(p, w, n, px)                                           \
    for (int b = 0; b < c; b++) {                                            \
        int32_t acc = HALF;                                                  \
        for (int t = 0; t < (n); t++) acc += (int32_t)(p)[t * c + b] * (w)[t]; \
        (px)[b] = clip8(acc);                                                \
    }

static void horizontal_scalar(const rs_image *in, int row0, int rows, const weights *ws, uint8_t *out, int out_w,
                              int planar) {
    HORIZONTAL_LOOPS(SCALAR_KERNEL)
}

#ifdef RS_X86
/* Three or four bands as four 32-bit lanes: one pixel's (SSE4.1) or two pixels' (AVX2) multiply-adds per
 * instruction. Four (or eight) bytes are read where that stays inside the image; past it, byte by byte. */
typedef struct {
    const uint8_t *end; /* the image's last byte + 1 */
    int c;
} lanes;

__attribute__((target("sse4.1"))) static inline __m128i one_tap(const uint8_t *p, int32_t w, const lanes *l) {
    int32_t four = 0;
    memcpy(&four, p, p + 4 <= l->end ? 4 : (size_t)l->c);
    return _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(four)), _mm_set1_epi32(w));
}

__attribute__((target("sse4.1"))) static inline void to_bytes(__m128i acc, uint8_t px[4]) {
    acc = _mm_srai_epi32(_mm_add_epi32(acc, _mm_set1_epi32(HALF)), FRAC_BITS);
    int32_t v = _mm_cvtsi128_si32(_mm_packus_epi16(_mm_packs_epi32(acc, acc), acc));
    memcpy(px, &v, 4);
}

__attribute__((target("sse4.1"))) static inline void kernel_sse41(const uint8_t *p, const int32_t *w, int n, uint8_t px[4],
                                                                 const lanes *l) {
    __m128i acc = _mm_setzero_si128();
    for (int t = 0; t < n; t++) acc = _mm_add_epi32(acc, one_tap(p + (ptrdiff_t)t * l->c, w[t], l));
    to_bytes(acc, px);
}

__attribute__((target("avx2"))) static inline void kernel_avx2(const uint8_t *p, const int32_t *w, int n, uint8_t px[4],
                                                              const lanes *l) {
    const __m128i spread = l->c == 3 ? _mm_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, -1, -1, -1, -1, -1, -1, -1, -1)
                                     : _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, -1, -1, -1, -1, -1, -1, -1, -1);
    __m256i acc2 = _mm256_setzero_si256();
    int t = 0;
    for (; t + 1 < n && p + 8 <= l->end; t += 2, p += 2 * l->c) {
        __m128i two = _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)p), spread);
        __m256i k = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi32(w[t])), _mm_set1_epi32(w[t + 1]), 1);
        acc2 = _mm256_add_epi32(acc2, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(two), k));
    }
    __m128i acc = _mm_add_epi32(_mm256_castsi256_si128(acc2), _mm256_extracti128_si256(acc2, 1));
    for (; t < n; t++, p += l->c) acc = _mm_add_epi32(acc, one_tap(p, w[t], l));
    to_bytes(acc, px);
}

#define SSE41_KERNEL(p, w, n, px) kernel_sse41(p, w, n, px, &l)
#define AVX2_KERNEL(p, w, n, px) kernel_avx2(p, w, n, px, &l)

__attribute__((target("sse4.1"))) static void horizontal_sse41(const rs_image *in, int row0, int rows, const weights *ws,
                                                              uint8_t *out, int out_w, int planar) {
    const lanes l = {in->pixels + (ptrdiff_t)(in->height - 1) * in->stride + (ptrdiff_t)in->width * in->channels,
                     in->channels};
    HORIZONTAL_LOOPS(SSE41_KERNEL)
}

__attribute__((target("avx2"))) static void horizontal_avx2(const rs_image *in, int row0, int rows, const weights *ws,
                                                           uint8_t *out, int out_w, int planar) {
    const lanes l = {in->pixels + (ptrdiff_t)(in->height - 1) * in->stride + (ptrdiff_t)in->width * in->channels,
                     in->channels};
    HORIZONTAL_LOOPS(AVX2_KERNEL)
}

/* 2: AVX2, 1: SSE4.1, 0: neither (the CPU's, found once) */
static int simd_level(void) {
    static int level = -1;
    if (level < 0) {
        __builtin_cpu_init();
        level = __builtin_cpu_supports("avx2") ? 2 : __builtin_cpu_supports("sse4.1") ? 1 : 0;
    }
    return level;
}
#endif

/* Rows [row0, row0 + rows) of `in`, resized across, into `out` (out_w wide, `rows` rows). */
static void horizontal(const rs_image *in, int row0, int rows, const weights *ws, uint8_t *out, int out_w, int planar) {
#ifdef RS_X86
    if (in->channels == 3 || in->channels == 4) {
        int level = simd_level();
        if (level == 2) {
            horizontal_avx2(in, row0, rows, ws, out, out_w, planar);
            return;
        }
        if (level == 1) {
            horizontal_sse41(in, row0, rows, ws, out, out_w, planar);
            return;
        }
    }
#endif
    horizontal_scalar(in, row0, rows, ws, out, out_w, planar);
}

/* -- the vertical pass ------------------------------------------------------------------------------ */

/* One output row: acc[j] = sum over the window of rows of src[j] * weight, for j < n. */
RS_CLONES static void vertical_row(const uint8_t *restrict src, ptrdiff_t stride, const int32_t *restrict w, int taps,
                                   int32_t *restrict acc, int n) {
    for (int j = 0; j < n; j++) acc[j] = HALF;
    for (int t = 0; t < taps; t++) {
        const uint8_t *restrict row = src + (ptrdiff_t)t * stride;
        const int32_t k = w[t];
        for (int j = 0; j < n; j++) acc[j] += (int32_t)row[j] * k;
    }
}

RS_CLONES static void put_row(const int32_t *restrict acc, int width, int c, uint8_t *restrict out, int y, int out_h,
                              int planar) {
    if (!planar) {
        uint8_t *restrict dst = out + (size_t)y * width * c;
        for (int j = 0; j < width * c; j++) dst[j] = clip8(acc[j]);
        return;
    }
    for (int b = 0; b < c; b++) {
        uint8_t *dst = out + ((size_t)b * out_h + y) * width;
        for (int x = 0; x < width; x++) dst[x] = clip8(acc[x * c + b]);
    }
}

static void copy_rows(const uint8_t *src, ptrdiff_t stride, int rows, int width, int c, uint8_t *out, int planar) {
    for (int y = 0; y < rows; y++) {
        const uint8_t *s = src + (ptrdiff_t)y * stride;
        if (!planar) {
            memcpy(out + (size_t)y * width * c, s, (size_t)width * c);
            continue;
        }
        for (int b = 0; b < c; b++) {
            uint8_t *dst = out + ((size_t)b * rows + y) * width;
            for (int x = 0; x < width; x++) dst[x] = s[x * c + b];
        }
    }
}

/* -- the two passes --------------------------------------------------------------------------------- */

/* `in` resized down its columns with the weights ws: out_h rows of in->width pixels into `out`. */
static int vertical(const rs_image *in, const weights *ws, uint8_t *out, int out_h, int planar) {
    const int n = in->width * in->channels;
    int32_t *acc = malloc((size_t)n * sizeof(int32_t));
    if (!acc) return -1;
    for (int y = 0; y < out_h; y++) {
        vertical_row(in->pixels + (ptrdiff_t)ws->first[y] * in->stride, in->stride, ws->w + (size_t)y * ws->taps,
                     ws->count[y], acc, n);
        put_row(acc, in->width, in->channels, out, y, out_h, planar);
    }
    free(acc);
    return 0;
}

int rs_resample(const rs_image *in, const float box[4], int filter_code, uint8_t *out, int out_h, int out_w, int planar,
                int vertical_first) {
    const filter *f = filter_of(filter_code);
    if (!f) return -2;
    const int c = in->channels;
    /* PIL's tests, its quirk included: the right and bottom edges are compared with the output's size */
    int need_h = out_w != in->width || box[0] != 0 || box[2] != out_w;
    int need_v = out_h != in->height || box[1] != 0 || box[3] != out_h;
    weights vw = {0}, hw = {0};
    uint8_t *temp = NULL;
    int rc = -1;
    if (!need_h && !need_v) {
        copy_rows(in->pixels, in->stride, in->height, in->width, c, out, planar);
        return 0;
    }
    if (need_v && weights_make(&vw, f, in->height, box[1], box[3], out_h) < 0) goto done;
    if (need_h && weights_make(&hw, f, in->width, box[0], box[2], out_w) < 0) goto done;
    if (!need_v) {
        horizontal(in, 0, in->height, &hw, out, out_w, planar);
    } else if (!need_h) {
        if (vertical(in, &vw, out, out_h, planar) < 0) goto done;
    } else if (vertical_first) {
        temp = malloc((size_t)out_h * in->width * c + 1);
        if (!temp || vertical(in, &vw, temp, out_h, 0) < 0) goto done;
        rs_image mid = {temp, out_h, in->width, c, (ptrdiff_t)in->width * c};
        horizontal(&mid, 0, out_h, &hw, out, out_w, planar);
    } else {
        /* across the source rows the vertical pass reads only */
        int row0 = vw.first[0], row1 = vw.first[out_h - 1] + vw.count[out_h - 1];
        temp = malloc((size_t)(row1 - row0) * out_w * c + 1);
        if (!temp) goto done;
        horizontal(in, row0, row1 - row0, &hw, temp, out_w, 0);
        for (int y = 0; y < out_h; y++) vw.first[y] -= row0;
        rs_image mid = {temp, row1 - row0, out_w, c, (ptrdiff_t)out_w * c};
        if (vertical(&mid, &vw, out, out_h, planar) < 0) goto done;
    }
    rc = 0;
done:
    free(temp);
    weights_free(&hw);
    weights_free(&vw);
    return rc;
}

/* -- Python ----------------------------------------------------------------------------------------- */

/* resample(src, out, box, filter, planar, vertical_first): src a C-contiguous uint8 buffer of shape (H, W) or (H, W, C),
 * out a writable C-contiguous one of (OH, OW[, C]) or, planar, (C, OH, OW); box (left, top, right, bottom)
 * as floats (PIL parses its box into C floats too); vertical_first: the pass order (the caller follows its
 * PIL's rule). The GIL is released while it resizes. */
static PyObject *py_resample(PyObject *module, PyObject *args) {
    PyObject *src_obj, *out_obj;
    float box[4];
    int filter_code, planar, vertical_first;
    if (!PyArg_ParseTuple(args, "OO(ffff)ipp:resample", &src_obj, &out_obj, &box[0], &box[1], &box[2], &box[3],
                          &filter_code, &planar, &vertical_first))
        return NULL;
    if (!filter_of(filter_code)) return PyErr_Format(PyExc_ValueError, "resample: unknown filter %d", filter_code);
    Py_buffer s, o;
    if (PyObject_GetBuffer(src_obj, &s, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    if (PyObject_GetBuffer(out_obj, &o, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&s);
        return NULL;
    }
    PyObject *result = NULL;
    int ok_format = s.itemsize == 1 && o.itemsize == 1 && (!s.format || strcmp(s.format, "B") == 0) &&
                    (!o.format || strcmp(o.format, "B") == 0);
    if (!ok_format || (s.ndim != 2 && s.ndim != 3) || o.ndim != s.ndim) {
        PyErr_SetString(PyExc_ValueError, "resample: src and out must be uint8 arrays of 2 or 3 dimensions alike");
        goto done;
    }
    rs_image in = {s.buf, (int)s.shape[0], (int)s.shape[1], s.ndim == 3 ? (int)s.shape[2] : 1, 0};
    in.stride = (ptrdiff_t)in.width * in.channels;
    int out_c = o.ndim == 3 ? (int)(planar ? o.shape[0] : o.shape[2]) : 1;
    int out_h = (int)(planar && o.ndim == 3 ? o.shape[1] : o.shape[0]);
    int out_w = (int)(planar && o.ndim == 3 ? o.shape[2] : o.shape[1]);
    if (out_c != in.channels || in.channels > 4 || in.height < 1 || in.width < 1 || out_h < 1 || out_w < 1) {
        PyErr_SetString(PyExc_ValueError, "resample: src and out must have the same bands (1 to 4) and no empty side");
        goto done;
    }
    if (!(box[0] >= 0 && box[1] >= 0 && box[2] <= in.width && box[3] <= in.height && box[2] - box[0] > 0 &&
          box[3] - box[1] > 0)) {
        PyErr_Format(PyExc_ValueError, "resample: box (%R) is not a non-empty region of the %dx%d image", args,
                     in.width, in.height);
        goto done;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = rs_resample(&in, box, filter_code, o.buf, out_h, out_w, planar, vertical_first);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&o);
    PyBuffer_Release(&s);
    return result;
}

static PyMethodDef resample_functions[] = {
    {"resample", py_resample, METH_VARARGS,
     "resample(src, out, box, filter, planar, vertical_first) -> None: the box of src resized into out as PIL resizes it"},
    {NULL, NULL, 0, NULL},
};

int resample_add_functions(PyObject *module) { return PyModule_AddFunctions(module, resample_functions); }
