/* The tar header step (see _tarcore.h). Plain C: no Python here; _tarscan.c drives it over a buffer,
 * a file read with pread and a socket or pipe, and packs what it finds. */
#include "_tarcore.h"

#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__) && (!defined(__clang__) || __clang_major__ >= 8)
#include <immintrin.h>
#define TAR_SUM_AVX2 1
#else
#define TAR_SUM_AVX2 0
#endif

int tar_octal(const unsigned char *f, int len, uint64_t *out) {
    int i = 0, start = 0;
    uint64_t v = 0;
    if (len >= 8 && f[0] != ' ') { /* the common spelling: digits from the field's start, eight bytes at once */
        uint64_t x, bad;
        memcpy(&x, f, 8);
        bad = (x & 0xF8F8F8F8F8F8F8F8ULL) ^ 0x3030303030303030ULL; /* a nonzero byte is no octal digit */
        i = bad ? __builtin_ctzll(bad) / 8 : 8;
        if (i) /* the digits moved to the top: the bytes after them (and their borrows) fall off */
            v = tar_octal8((x - 0x3030303030303030ULL) << (8 * (8 - i)));
    } else {
        while (i < len && f[i] == ' ') i++;
        start = i;
    }
    for (; i < len; i++) {
        unsigned d = (unsigned)f[i] - '0';
        if (d > 7) break;
        if (i - start >= 21 && v >> 60) return -1; /* 21 octal digits fit in 63 bits: checked past them */
        v = v * 8 + d;
    }
    if (i == start) return -1;
    for (; i < len; i++)
        if (f[i] != 0 && f[i] != ' ') return -1;
    *out = v;
    return 0;
}

/* Sixteen bytes at a time with SSE2's sum of absolute differences from zero (every x86-64 has it), four
 * sums in flight; thirty-two at a time with AVX2's where the CPU has it (half the instructions: a plain
 * header's check is mostly this sum); elsewhere eight bytes at a time in 16-bit lanes (64 words x 2 x 255
 * fits in a lane). */
#ifdef __SSE2__
static uint64_t header_sum_sse2(const unsigned char *h) {
    const __m128i zero = _mm_setzero_si128();
    __m128i a = zero, b = zero, c = zero, d = zero;
#pragma GCC unroll 8
    for (int i = 0; i < TAR_BLOCK; i += 64) {
        a = _mm_add_epi64(a, _mm_sad_epu8(_mm_loadu_si128((const __m128i *)(h + i)), zero));
        b = _mm_add_epi64(b, _mm_sad_epu8(_mm_loadu_si128((const __m128i *)(h + i + 16)), zero));
        c = _mm_add_epi64(c, _mm_sad_epu8(_mm_loadu_si128((const __m128i *)(h + i + 32)), zero));
        d = _mm_add_epi64(d, _mm_sad_epu8(_mm_loadu_si128((const __m128i *)(h + i + 48)), zero));
    }
    a = _mm_add_epi64(_mm_add_epi64(a, b), _mm_add_epi64(c, d));
    a = _mm_sub_epi64(a, _mm_sad_epu8(_mm_loadl_epi64((const __m128i *)(h + 148)), zero)); /* less the field */
    return (uint64_t)_mm_cvtsi128_si64(a) + (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(a, a)) + 8 * 32;
}
#endif

#if TAR_SUM_AVX2
__attribute__((target("avx2"))) static inline uint64_t header_sum_avx2(const unsigned char *h) {
    const __m256i zero = _mm256_setzero_si256();
    __m256i a = zero, b = zero;
#pragma GCC unroll 8
    for (int i = 0; i < TAR_BLOCK; i += 64) { /* zero first: the bytes are the operand a load folds into */
        a = _mm256_add_epi64(a, _mm256_sad_epu8(zero, _mm256_loadu_si256((const __m256i *)(h + i))));
        b = _mm256_add_epi64(b, _mm256_sad_epu8(zero, _mm256_loadu_si256((const __m256i *)(h + i + 32))));
        __asm__("" : "+x"(a), "+x"(b)); /* one add after another (reassociated, the sums spill to the stack) */
    }
    a = _mm256_add_epi64(a, b);
    __m128i s = _mm_add_epi64(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_sub_epi64(s, _mm_sad_epu8(_mm_setzero_si128(), _mm_loadl_epi64((const __m128i *)(h + 148)))); /* less the field */
    return (uint64_t)_mm_cvtsi128_si64(s) + (uint64_t)_mm_extract_epi64(s, 1) + 8 * 32;
}
#endif

#if TAR_SUM_AVX2
static inline int has_avx2(void) {
    static int avx2 = -1; /* asked once: every thread finds the same answer */
    if (__builtin_expect(avx2 < 0, 0)) avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
    return avx2;
}

static inline int has_avx512bw(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
}
#endif

uint64_t tar_header_sum(const unsigned char *h) {
#if TAR_SUM_AVX2
    if (has_avx2()) return header_sum_avx2(h);
#endif
#ifdef __SSE2__
    return header_sum_sse2(h);
#else
    const uint64_t lanes = 0x00FF00FF00FF00FFULL;
    uint64_t acc = 0, w;
    for (int i = 0; i < TAR_BLOCK; i += 8) {
        memcpy(&w, h + i, 8);
        acc += (w & lanes) + ((w >> 8) & lanes);
    }
    uint64_t sum = (acc & 0xFFFF) + ((acc >> 16) & 0xFFFF) + ((acc >> 32) & 0xFFFF) + (acc >> 48);
    for (int i = 148; i < 156; i++) sum -= h[i];
    return sum + 8 * 32;
#endif
}

/* The checksum first, then the size field (plain octal, at most TAR_MAX_SIZE); 0 when the C walk does not
 * vouch for the header (a zero block has no checksum digits). The common spellings are read without a loop. */
static int verified(const unsigned char *h, uint64_t *size) {
    uint64_t stored;
    if (!tar_plain_chksum(h + 148, &stored) && tar_octal(h + 148, 8, &stored) < 0) return 0;
    if (tar_header_sum(h) != stored) return 0;
    if (tar_plain_size(h + 124, size)) return 1; /* below 2**33 = TAR_MAX_SIZE */
    return !(h[124] & 0x80) && tar_octal(h + 124, 12, size) == 0 && *size <= TAR_MAX_SIZE;
}

/* A PAX size value: decimal digits only, at most TAR_MAX_SIZE; 0 otherwise (the Python walker judges). */
static int pax_size(const unsigned char *v, size_t n, uint64_t *out) {
    uint64_t s = 0;
    if (n == 0) return 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9') return 0;
        s = s * 10 + (uint64_t)(v[i] - '0');
        if (s > TAR_MAX_SIZE) return 0;
    }
    *out = s;
    return 1;
}

/* Whether the n bytes of PAX records at d may set a name or a size: a '=' after "path" or "size" (the key and
 * its '=' side by side, wherever they are), or a 'G' followed by "NU.sparse" (GNU.sparse.*). Conservative:
 * a value that holds such bytes counts too. With SSE2 (AVX2, AVX-512BW), one pass sixteen (32, 64) bytes a
 * step marks every '=' four bytes after a 'p' or an 's' and every 'G' before an 'N' (pax_marks), and only
 * those are compared (d is readable from 4 bytes before it up to 65 bytes past n rounded up to TAR_BLOCK:
 * the PAX header, the records' padding, the member's own header). */
static inline int pax_hit(const unsigned char *d, size_t n, size_t j) {
    return d[j] == '=' ? j >= 4 && (memcmp(d + j - 4, "path", 4) == 0 || memcmp(d + j - 4, "size", 4) == 0)
                       : n - j >= 10 && memcmp(d + j, "GNU.sparse", 10) == 0;
}

#ifdef __SSE2__
static inline uint32_t pax_marks_sse2(const unsigned char *d) {
    __m128i v = _mm_loadu_si128((const __m128i *)d), k = _mm_loadu_si128((const __m128i *)(d - 4)), after = _mm_loadu_si128((const __m128i *)(d + 1));
    __m128i key = _mm_and_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('=')), _mm_or_si128(_mm_cmpeq_epi8(k, _mm_set1_epi8('p')), _mm_cmpeq_epi8(k, _mm_set1_epi8('s'))));
    __m128i gnu = _mm_and_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('G')), _mm_cmpeq_epi8(after, _mm_set1_epi8('N')));
    return (uint32_t)_mm_movemask_epi8(_mm_or_si128(key, gnu));
}
#endif

#if TAR_SUM_AVX2
__attribute__((target("avx2"))) static inline uint32_t pax_marks_avx2(const unsigned char *d) {
    __m256i v = _mm256_loadu_si256((const __m256i *)d), k = _mm256_loadu_si256((const __m256i *)(d - 4)),
            after = _mm256_loadu_si256((const __m256i *)(d + 1));
    __m256i key = _mm256_and_si256(_mm256_cmpeq_epi8(v, _mm256_set1_epi8('=')),
                                   _mm256_or_si256(_mm256_cmpeq_epi8(k, _mm256_set1_epi8('p')), _mm256_cmpeq_epi8(k, _mm256_set1_epi8('s'))));
    __m256i gnu = _mm256_and_si256(_mm256_cmpeq_epi8(v, _mm256_set1_epi8('G')), _mm256_cmpeq_epi8(after, _mm256_set1_epi8('N')));
    return (uint32_t)_mm256_movemask_epi8(_mm256_or_si256(key, gnu));
}
#endif

#if TAR_SUM_AVX2
/* pax_marks for 64 bytes with AVX-512BW, as a bit mask. */
__attribute__((target("avx512bw,avx512f"))) static inline uint64_t pax_marks_avx512(const unsigned char *d) {
    __m512i v = _mm512_loadu_si512((const void *)d), k = _mm512_loadu_si512((const void *)(d - 4)), after = _mm512_loadu_si512((const void *)(d + 1));
    __mmask64 key = _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8('=')) &
                    (_mm512_cmpeq_epi8_mask(k, _mm512_set1_epi8('p')) | _mm512_cmpeq_epi8_mask(k, _mm512_set1_epi8('s')));
    __mmask64 gnu = _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8('G')) & _mm512_cmpeq_epi8_mask(after, _mm512_set1_epi8('N'));
    return (uint64_t)(key | gnu);
}
#endif

/* A mask of the low n bits (n <= 64): the bytes of a 64-byte step that lie before n. */
static inline uint64_t low_bits(size_t n) {
    return n >= 64 ? ~0ULL : (1ULL << n) - 1;
}

/* The marks of pax_marks for the 64 bytes at d, a bit a byte: one AVX-512BW step (wide 2), two AVX2 steps (1)
 * or four SSE2 steps (0). */
static inline __attribute__((always_inline)) uint64_t pax_marks64(const unsigned char *d, int wide) {
#if TAR_SUM_AVX2
    if (wide == 2) return pax_marks_avx512(d);
    if (wide == 1) return (uint64_t)pax_marks_avx2(d) | (uint64_t)pax_marks_avx2(d + 32) << 32;
#endif
    (void)wide;
    return (uint64_t)pax_marks_sse2(d) | (uint64_t)pax_marks_sse2(d + 16) << 16 | (uint64_t)pax_marks_sse2(d + 32) << 32 |
           (uint64_t)pax_marks_sse2(d + 48) << 48;
}

/* Whether any of the marks (bit j: the byte at d + at + j) is a record key that may set a name or a size. */
static inline int pax_hits(const unsigned char *d, size_t n, size_t at, uint64_t marks) {
    for (; marks; marks &= marks - 1)
        if (pax_hit(d, n, at + (size_t)__builtin_ctzll(marks))) return 1;
    return 0;
}

static inline __attribute__((always_inline)) int pax_touchy(const unsigned char *d, size_t n, int wide) {
#ifdef __SSE2__
    if (n <= 64) { /* one time, as webdataset writes it: one step and one branch */
        uint64_t lo = pax_marks64(d, wide) & low_bits(n); /* less the padding after the records */
        return __builtin_expect(lo != 0, 0) && pax_hits(d, n, 0, lo);
    }
    if (n <= 128) { /* three times, as GNU tar writes them: two steps and one branch */
        uint64_t lo = pax_marks64(d, wide), hi = pax_marks64(d + 64, wide) & low_bits(n - 64);
        return __builtin_expect((lo | hi) != 0, 0) && (pax_hits(d, n, 0, lo) || pax_hits(d, n, 64, hi));
    }
    for (size_t i = 0; i < n; i += 64) {
        if (pax_hits(d, n, i, pax_marks64(d + i, wide) & low_bits(n - i))) return 1;
    }
    return 0;
#else
    (void)wide;
    const unsigned char *end = d + n, *p = d;
    while (p < end && (p = memchr(p, '=', (size_t)(end - p))) != NULL) {
        if (p - d >= 4 && (memcmp(p - 4, "path", 4) == 0 || memcmp(p - 4, "size", 4) == 0)) return 1;
        p++;
    }
    for (p = d; p < end && (p = memchr(p, 'G', (size_t)(end - p))) != NULL; p++)
        if ((size_t)(end - p) >= 10 && memcmp(p, "GNU.sparse", 10) == 0) return 1;
    return 0;
#endif
}

/* Whether the n bytes at a and b are the same, eight at a time; both are readable up to n rounded up to 8
 * (bytes past n are masked off). */
static inline int same(const unsigned char *a, const unsigned char *b, size_t n) {
    uint64_t x, y, diff = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&x, a + i, 8);
        memcpy(&y, b + i, 8);
        diff |= x ^ y;
    }
    if (i < n) {
        memcpy(&x, a + i, 8);
        memcpy(&y, b + i, 8);
        diff |= (x ^ y) & (~0ULL >> (8 * (8 - (n - i)))); /* little-endian: the first n - i bytes */
    }
    return diff == 0;
}

#if TAR_SUM_AVX2
/* Whether the name field's first n bytes (n <= 64) are e's key, then its tail and NUL: both parts loaded
 * into one register where they lie (the tail at lane klen, masked lanes neither read nor faulted), one
 * compare. */
__attribute__((target("avx512bw,avx512f"))) static inline int name_agrees_avx512(const unsigned char *h, const tar_expect *e, size_t n) {
    __mmask64 all = low_bits(n), key = low_bits(e->klen);
    __m512i want = _mm512_or_si512(_mm512_maskz_loadu_epi8(key, e->key),
                                   _mm512_maskz_loadu_epi8(all & ~key, (const void *)((uintptr_t)e->tail - e->klen)));
    return _mm512_mask_cmpneq_epi8_mask(all, _mm512_maskz_loadu_epi8(all, h), want) == 0;
}
#endif

/* A member's own header as tar_plain_member takes it, all but its checksum: a regular type, the name field
 * exactly the expected name (and a NUL after it unless it fills the field), no ustar prefix, the size field
 * as the common writers spell it and equal to the expected size; *stored: the checksum field's value. */
static inline __attribute__((always_inline)) int own_fields(const unsigned char *h, const tar_expect *e, uint64_t *stored, int wide) {
    unsigned char typ = h[156];
    size_t len = e->klen + e->tlen, n = len + (len < 100); /* the name and its NUL, unless it fills the field */
    uint64_t got;
    if (len > 100 || !(typ == '0' || typ == 0 || typ == '7') || (h[345] && memcmp(h + 257, "ustar\0", 6) == 0)) return 0;
#if TAR_SUM_AVX2
    if (wide == 2 && n <= 64) {
        if (!name_agrees_avx512(h, e, n)) return 0;
    } else
#endif
    {
        (void)wide;
        if (!same(h, e->key, e->klen) || !same(h + e->klen, e->tail, n - e->klen)) return 0;
    }
    return tar_plain_size(h + 124, &got) && got == e->size && tar_plain_chksum(h + 148, stored);
}

/* A PAX 'x' header's fields as tar_plain_member takes them, all but its checksum: the size field spelled
 * plainly, its records padded to `padded` bytes; *size: their length, *stored: the checksum field's value. */
static inline __attribute__((always_inline)) int pax_fields(const unsigned char *p, size_t padded, uint64_t *size, uint64_t *stored) {
    return p[156] == 'x' && tar_plain_size(p + 124, size) && ((*size + TAR_BLOCK - 1) & ~(uint64_t)(TAR_BLOCK - 1)) == padded &&
           tar_plain_chksum(p + 148, stored);
}

#if TAR_SUM_AVX2
/* Two headers' sums in one pass (a PAX header and the member's own): one sum in flight for each, one
 * reduction for both. */
__attribute__((target("avx2"))) static inline void header_sums_avx2(const unsigned char *a, const unsigned char *b, uint64_t *sa, uint64_t *sb) {
    const __m256i zero = _mm256_setzero_si256();
    __m256i a0 = zero, b0 = zero;
#pragma GCC unroll 16
    for (int i = 0; i < TAR_BLOCK; i += 32) { /* zero first: the bytes are the operand a load folds into */
        a0 = _mm256_add_epi64(a0, _mm256_sad_epu8(zero, _mm256_loadu_si256((const __m256i *)(a + i))));
        b0 = _mm256_add_epi64(b0, _mm256_sad_epu8(zero, _mm256_loadu_si256((const __m256i *)(b + i))));
        __asm__("" : "+x"(a0), "+x"(b0)); /* one add after another (reassociated, the sums spill to the stack) */
    }
    const __m128i z = _mm_setzero_si128();
    __m128i x = _mm_add_epi64(_mm256_castsi256_si128(a0), _mm256_extracti128_si256(a0, 1));
    __m128i y = _mm_add_epi64(_mm256_castsi256_si128(b0), _mm256_extracti128_si256(b0, 1));
    x = _mm_sub_epi64(x, _mm_sad_epu8(z, _mm_loadl_epi64((const __m128i *)(a + 148)))); /* less the fields */
    y = _mm_sub_epi64(y, _mm_sad_epu8(z, _mm_loadl_epi64((const __m128i *)(b + 148))));
    __m128i s = _mm_add_epi64(_mm_unpacklo_epi64(x, y), _mm_unpackhi_epi64(x, y)); /* a's sum, b's sum */
    *sa = (uint64_t)_mm_cvtsi128_si64(s) + 8 * 32;
    *sb = (uint64_t)_mm_extract_epi64(s, 1) + 8 * 32;
}
#endif

#if TAR_SUM_AVX2
/* header_sum with AVX-512BW: eight 64-byte steps. */
__attribute__((target("avx512bw,avx512f,avx2"))) static inline uint64_t header_sum_avx512(const unsigned char *h) {
    const __m512i zero = _mm512_setzero_si512();
    __m512i a = zero;
#pragma GCC unroll 8
    for (int i = 0; i < TAR_BLOCK; i += 64) {
        a = _mm512_add_epi64(a, _mm512_sad_epu8(zero, _mm512_loadu_si512((const void *)(h + i))));
        __asm__("" : "+v"(a)); /* one add after another */
    }
    uint64_t field = (uint64_t)_mm_cvtsi128_si64(_mm_sad_epu8(_mm_setzero_si128(), _mm_loadl_epi64((const __m128i *)(h + 148))));
    return (uint64_t)_mm512_reduce_add_epi64(a) - field + 8 * 32;
}

/* The two sums of header_sums_avx2 with AVX-512BW: eight 64-byte steps a header. */
__attribute__((target("avx512bw,avx512f,avx2"))) static inline void header_sums_avx512(const unsigned char *a, const unsigned char *b, uint64_t *sa, uint64_t *sb) {
    const __m512i zero = _mm512_setzero_si512();
    __m512i a0 = zero, b0 = zero;
#pragma GCC unroll 8
    for (int i = 0; i < TAR_BLOCK; i += 64) {
        a0 = _mm512_add_epi64(a0, _mm512_sad_epu8(zero, _mm512_loadu_si512((const void *)(a + i))));
        b0 = _mm512_add_epi64(b0, _mm512_sad_epu8(zero, _mm512_loadu_si512((const void *)(b + i))));
        __asm__("" : "+v"(a0), "+v"(b0));
    }
    __m512i ab = _mm512_add_epi64(_mm512_unpacklo_epi64(a0, b0), _mm512_unpackhi_epi64(a0, b0)); /* a's, b's in turn */
    __m256i q = _mm256_add_epi64(_mm512_castsi512_si256(ab), _mm512_extracti64x4_epi64(ab, 1));
    __m128i t = _mm_add_epi64(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)); /* a's sum, b's sum */
    const __m128i z = _mm_setzero_si128();
    t = _mm_sub_epi64(t, _mm_unpacklo_epi64(_mm_sad_epu8(z, _mm_loadl_epi64((const __m128i *)(a + 148))),
                                            _mm_sad_epu8(z, _mm_loadl_epi64((const __m128i *)(b + 148))))); /* less the fields */
    *sa = (uint64_t)_mm_cvtsi128_si64(t) + 8 * 32;
    *sb = (uint64_t)_mm_extract_epi64(t, 1) + 8 * 32;
}
#endif

/* tar_plain_member's body, made three times (wide 2: AVX-512BW's name compare, sums and search; 1: AVX2's
 * sums and search; 0: SSE2's or the plain loop's): the own header's fields first (a member of another shape
 * leaves before any sum), then the sums, then the PAX records' search. */
static inline __attribute__((always_inline)) int plain_member(const unsigned char *g, size_t len, const tar_expect *e, int wide) {
    const unsigned char *h = g + len - TAR_BLOCK;
    uint64_t own, pax, size, a, b;
    if (len < TAR_BLOCK || !own_fields(h, e, &own, wide)) return 0;
#if TAR_SUM_AVX2
    if (wide) {
        if (len == TAR_BLOCK) return (wide == 2 ? header_sum_avx512(h) : header_sum_avx2(h)) == own;
        if (!pax_fields(g, len - 2 * TAR_BLOCK, &size, &pax)) return 0;
        if (wide == 2) header_sums_avx512(g, h, &a, &b);
        else header_sums_avx2(g, h, &a, &b);
        return a == pax && b == own && !pax_touchy(g + TAR_BLOCK, (size_t)size, wide);
    }
#endif
    (void)wide;
    if (len == TAR_BLOCK) return tar_header_sum(h) == own;
    if (!pax_fields(g, len - 2 * TAR_BLOCK, &size, &pax)) return 0;
    a = tar_header_sum(g);
    b = tar_header_sum(h);
    return a == pax && b == own && !pax_touchy(g + TAR_BLOCK, (size_t)size, 0);
}

static int plain_member_base(const unsigned char *g, size_t len, const tar_expect *e) {
    return plain_member(g, len, e, 0);
}

#if TAR_SUM_AVX2
__attribute__((target("avx2"))) static int plain_member_avx2(const unsigned char *g, size_t len, const tar_expect *e) {
    return plain_member(g, len, e, 1);
}

__attribute__((target("avx512bw,avx512f,avx2"))) static int plain_member_avx512(const unsigned char *g, size_t len, const tar_expect *e) {
    return plain_member(g, len, e, 2);
}
#endif

/* The first call picks the body for this CPU (every thread picks the same) and calls it. */
static int plain_member_pick(const unsigned char *g, size_t len, const tar_expect *e) {
#if TAR_SUM_AVX2
    tar_plain_member = has_avx512bw() ? plain_member_avx512 : has_avx2() ? plain_member_avx2 : plain_member_base;
#else
    tar_plain_member = plain_member_base;
#endif
    return tar_plain_member(g, len, e);
}

int (*tar_plain_member)(const unsigned char *g, size_t len, const tar_expect *e) = plain_member_pick;

int tar_plain_use(const char *name) {
    if (!name) tar_plain_member = plain_member_pick;
    else if (strcmp(name, "base") == 0) tar_plain_member = plain_member_base;
#if TAR_SUM_AVX2
    else if (strcmp(name, "avx2") == 0 && has_avx2()) tar_plain_member = plain_member_avx2;
    else if (strcmp(name, "avx512") == 0 && has_avx512bw()) tar_plain_member = plain_member_avx512;
#endif
    else return 0;
    return 1;
}

typedef struct {
    const unsigned char *path;
    size_t path_len;
    uint64_t size;
    int has_path, has_size;
} Pax;

/* The records "<len> <key>=<value>\n" of one PAX header (NUL padding ends them), the last of a key
 * winning; 0 on anything the Python walker must judge: a malformed record, a bad size, a sparse member. */
static int pax_records(const unsigned char *d, size_t n, Pax *x) {
    size_t pos = 0;
    while (pos < n && d[pos]) {
        size_t i = pos;
        uint64_t len = 0;
        while (i < n && d[i] >= '0' && d[i] <= '9') {
            len = len * 10 + (uint64_t)(d[i] - '0');
            if (len > n) return 0;
            i++;
        }
        if (i == pos || i >= n || d[i] != ' ' || len > n - pos) return 0;
        size_t key = i + 1, stop = pos + (size_t)len;
        if (stop <= key) return 0;
        const unsigned char *eq = memchr(d + key, '=', stop - key);
        int bare = eq == d + stop - 1; /* "<len> key=" ends the record: an empty value without its newline (as tarfile reads it) */
        if (!eq || eq == d + key || (d[stop - 1] != '\n' && !bare)) return 0;
        size_t klen = (size_t)(eq - (d + key));
        const unsigned char *value = eq + 1;
        size_t vlen = bare ? 0 : (size_t)(d + stop - 1 - value);
        if (klen == 4 && memcmp(d + key, "path", 4) == 0) {
            x->path = value;
            x->path_len = vlen;
            x->has_path = 1;
        } else if (klen == 4 && memcmp(d + key, "size", 4) == 0) {
            if (!pax_size(value, vlen, &x->size)) return 0;
            x->has_size = 1;
        } else if (klen >= 11 && memcmp(d + key, "GNU.sparse.", 11) == 0) {
            return 0; /* not stored contiguously: the Python walker skips it with a warning */
        }
        pos = stop;
    }
    return 1;
}

int tar_step(const unsigned char *p, size_t avail, tar_member *m, size_t *need) {
    size_t at = 0;
    Pax chain = {NULL, 0, 0, 0, 0}; /* what the extension headers so far set: the first to set a field wins */
    for (;;) {
        if (avail - at < TAR_BLOCK) {
            *need = at + TAR_BLOCK;
            return TAR_SHORT;
        }
        const unsigned char *h = p + at;
        uint64_t size;
        if (!verified(h, &size)) return TAR_DEFER;
        unsigned char typ = h[156];
        if (typ == 'x' || typ == 'L' || typ == 'K') {
            uint64_t padded = (size + TAR_BLOCK - 1) & ~(uint64_t)(TAR_BLOCK - 1);
            if (padded + TAR_BLOCK > (uint64_t)(avail - at - TAR_BLOCK)) { /* the payload and the next header */
                *need = at + TAR_BLOCK + (size_t)padded + TAR_BLOCK;
                return TAR_SHORT;
            }
            const unsigned char *d = h + TAR_BLOCK;
            if (typ == 'x') {
                Pax x = {NULL, 0, 0, 0, 0};
                if (!pax_records(d, (size_t)size, &x)) return TAR_DEFER;
                if (x.has_path && !chain.has_path) {
                    chain.path = x.path;
                    chain.path_len = x.path_len;
                    chain.has_path = 1;
                }
                if (x.has_size && !chain.has_size) {
                    chain.size = x.size;
                    chain.has_size = 1;
                }
            } else if (typ == 'L' && !chain.has_path) {
                const unsigned char *nul = memchr(d, 0, (size_t)size);
                chain.path = d;
                chain.path_len = nul ? (size_t)(nul - d) : (size_t)size;
                chain.has_path = 1;
            }
            at += TAR_BLOCK + (size_t)padded;
            continue;
        }
        int regular = typ == '0' || typ == 0 || typ == '7';
        if (!regular && !(typ >= '1' && typ <= '6')) return TAR_DEFER; /* 'g', sparse, unknown types */
        size_t n = 0;
        while (n < 100 && h[n]) n++;
        if (typ == 0 && n > 0 && h[n - 1] == '/') regular = 0; /* an old-style directory */
        m->regular = regular;
        m->header = at;
        m->data = at + TAR_BLOCK;
        m->size = !regular ? 0 : chain.has_size ? chain.size : size; /* links, devices, directories, FIFOs: no data, whatever
                                                                         * their size field says (as tarfile reads them) */
        if (chain.has_path) {
            m->name = chain.path;
            m->name_len = chain.path_len;
        } else if (h[345] && memcmp(h + 257, "ustar\0", 6) == 0) { /* the ustar prefix, '/', the name */
            size_t k = 0;
            while (k < 155 && h[345 + k]) k++;
            memcpy(m->scratch, h + 345, k);
            m->scratch[k] = '/';
            memcpy(m->scratch + k + 1, h, n);
            m->name = m->scratch;
            m->name_len = k + 1 + n;
        } else {
            m->name = h;
            m->name_len = n;
        }
        return TAR_MEMBER;
    }
}
