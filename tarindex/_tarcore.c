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
__attribute__((target("avx2"))) static uint64_t header_sum_avx2(const unsigned char *h) {
    const __m256i zero = _mm256_setzero_si256();
    __m256i a = zero, b = zero;
#pragma GCC unroll 8
    for (int i = 0; i < TAR_BLOCK; i += 64) {
        a = _mm256_add_epi64(a, _mm256_sad_epu8(_mm256_loadu_si256((const __m256i *)(h + i)), zero));
        b = _mm256_add_epi64(b, _mm256_sad_epu8(_mm256_loadu_si256((const __m256i *)(h + i + 32)), zero));
    }
    a = _mm256_add_epi64(a, b);
    __m128i s = _mm_add_epi64(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_sub_epi64(s, _mm_sad_epu8(_mm_loadl_epi64((const __m128i *)(h + 148)), _mm_setzero_si128())); /* less the field */
    return (uint64_t)_mm_cvtsi128_si64(s) + (uint64_t)_mm_extract_epi64(s, 1) + 8 * 32;
}
#endif

uint64_t tar_header_sum(const unsigned char *h) {
#if TAR_SUM_AVX2
    static int avx2 = -1; /* asked once: every thread finds the same answer */
    if (__builtin_expect(avx2 < 0, 0)) avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
    if (avx2) return header_sum_avx2(h);
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
 * a value that holds such bytes counts too. With SSE2, one pass sixteen bytes at a time finds every '=' and
 * 'G' (d is readable up to n rounded up to TAR_BLOCK: the records' padding). */
static int pax_touchy(const unsigned char *d, size_t n) {
#ifdef __SSE2__
    const __m128i eq = _mm_set1_epi8('='), g = _mm_set1_epi8('G');
    for (size_t i = 0; i < n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(d + i));
        unsigned hits = (unsigned)_mm_movemask_epi8(_mm_or_si128(_mm_cmpeq_epi8(v, eq), _mm_cmpeq_epi8(v, g)));
        if (n - i < 16) hits &= (1u << (n - i)) - 1; /* the padding after the records */
        for (; hits; hits &= hits - 1) {
            size_t j = i + (size_t)__builtin_ctz(hits);
            if (d[j] == '=' ? j >= 4 && (memcmp(d + j - 4, "path", 4) == 0 || memcmp(d + j - 4, "size", 4) == 0)
                            : n - j >= 10 && memcmp(d + j, "GNU.sparse", 10) == 0)
                return 1;
        }
    }
    return 0;
#else
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

int tar_pax_inert(const unsigned char *p, size_t avail, size_t *skip) {
    uint64_t size;
    if (avail < TAR_BLOCK || p[156] != 'x' || !verified(p, &size)) return 0;
    uint64_t padded = (size + TAR_BLOCK - 1) & ~(uint64_t)(TAR_BLOCK - 1);
    if (padded > avail - TAR_BLOCK || pax_touchy(p + TAR_BLOCK, (size_t)size)) return 0;
    *skip = TAR_BLOCK + (size_t)padded;
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
