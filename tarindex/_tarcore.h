/* The tar header step: one member (its extension headers included) from bytes in memory. Plain C, no Python.
 *
 * The reference is tarindex.tar (the Python walker, which also names every error): this step takes
 * exactly the members that walker takes, and on anything else (an end-of-archive block, a damaged
 * or unusual header, a global PAX header, a sparse member) says TAR_DEFER, so the walker looks.
 */
#ifndef TARINDEX_TARCORE_H
#define TARINDEX_TARCORE_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define TAR_BLOCK 512
#define TAR_MAX_SIZE (8ULL << 30) /* tarindex.tar.MAX_MEMBER_SIZE: larger sizes are the Python walker's to judge */

enum {
    TAR_MEMBER = 1, /* a member: see tar_member */
    TAR_DEFER = 0,  /* the Python walker must look at the header at p */
    TAR_SHORT = -1, /* the member's headers run past the bytes in hand: *need bytes from p hold them */
};

typedef struct {
    uint64_t size;             /* the data's size (a PAX size applied) */
    size_t data;               /* where the data starts, from the member's first header (512 per header block and payload) */
    size_t header;             /* where the member's own (last) header starts, from its first header */
    const unsigned char *name; /* the name's bytes (into the input, or into scratch) ... */
    size_t name_len;           /* ... and their count */
    int regular;               /* a regular file (else a directory, link, device, FIFO: skipped; its size is 0, its data absent) */
    unsigned char scratch[256]; /* a ustar prefix, '/', and the name */
} tar_member;

/* The member whose first header is at p, with `avail` bytes in hand. Every header's checksum is verified
 * before any of its fields is used; extension headers (PAX 'x': path and size applied, every other record
 * ignored, a record "<len> key=" with an empty value and no newline accepted; GNU 'L' long name, 'K' long
 * link name) are applied as tarfile applies them (the first header that sets a field wins). Returns
 * TAR_MEMBER, TAR_DEFER or TAR_SHORT (then *need, the bytes from p the headers take, is set; it may exceed
 * any window: then defer). Reads nothing past p + avail. */
int tar_step(const unsigned char *p, size_t avail, tar_member *m, size_t *need);

/* What the read check expects of a member (tar_plain_member): its name, the sample's key (klen bytes,
 * readable up to klen rounded up to 8) and then its tail ('.' and the extension: tlen bytes, a NUL after
 * them, readable up to tlen + 1 rounded up to 8), and its data's size. The two parts are compared where
 * they lie, never copied together: a name assembled per member would be loaded across the stores that just
 * made it (a load that spans fresh stores waits for them to reach the cache). */
typedef struct {
    const unsigned char *key, *tail;
    size_t klen, tlen;
    uint64_t size;
} tar_expect;

/* Whether the `len` bytes at g are a member's headers in the read check's common shape, saying what e says:
 * its own header alone (len 512), or after one PAX 'x' header whose records (its size field's length, padded
 * to the len - 1024 bytes between) cannot rename or resize it: none holds "path=", "size=" or "GNU.sparse" (a
 * record that sets one holds its key and '=' side by side; the records are searched, not parsed: webdataset's
 * TarWriter and GNU tar --format=posix write only times there). The own header: a regular file whose name
 * field holds exactly the name (a NUL after it unless it fills the field; no ustar prefix); both headers'
 * size and checksum fields spelled as GNU tar, tarfile and webdataset spell them (tar_plain_size,
 * tar_plain_chksum), the size the expected one, each checksum the sum tar_header_sum makes (both sums in one
 * pass). 0: not shown here (another shape or spelling, or a difference: tar_step reads the headers). A
 * pointer: the body for this CPU (AVX-512BW, AVX2 or neither), picked at the first call. */
extern int (*tar_plain_member)(const unsigned char *g, size_t len, const tar_expect *e);

/* tar_plain_member's body by name ("avx512", "avx2", "base": AVX-512BW, AVX2, SSE2 or plain C), for the tests
 * that compare their decisions; NULL: the CPU's best again (picked at the next call). 1: in use; 0: this CPU
 * lacks it (nothing changed). */
int tar_plain_use(const char *name);

/* The header checksum's unsigned sum (the checksum field counted as spaces): AVX2 where the CPU has it,
 * else SSE2 (every x86-64), else eight bytes at a time. */
uint64_t tar_header_sum(const unsigned char *h);

/* Eight octal digit values, one a byte in reading order (little-endian), as a number: adjacent digits,
 * then pairs, then quads, combined in place (no lane overflows: 63, 4095, 2**24 - 1). */
static inline __attribute__((always_inline)) uint64_t tar_octal8(uint64_t x) {
    x = (x * 8 + (x >> 8)) & 0x00FF00FF00FF00FFULL;
    x = (x * 64 + (x >> 16)) & 0x0000FFFF0000FFFFULL;
    return (x * 4096 + (x >> 32)) & 0xFFFFFFFFULL;
}

static inline __attribute__((always_inline)) uint64_t tar_load64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8); /* little-endian hosts, as octal8 reads it */
    return v;
}

/* A checksum field as GNU tar, tarfile and webdataset spell it ("%06o\0 ": six octal digits, a NUL, a
 * space): 1 and its value, without a loop; 0 for any other spelling (tar_octal reads those). */
static inline __attribute__((always_inline)) int tar_plain_chksum(const unsigned char *f, uint64_t *out) {
    uint64_t x = tar_load64(f), digits = x & 0xFFFFFFFFFFFFULL;
    if ((x >> 48) != 0x2000 || ((digits & 0xF8F8F8F8F8F8ULL) ^ 0x303030303030ULL)) return 0;
    *out = tar_octal8((digits - 0x303030303030ULL) << 16);
    return 1;
}

/* A size field as they spell it ("%011o\0": eleven octal digits and a NUL, below 2**33): 1 and its value;
 * 0 for any other spelling. */
static inline __attribute__((always_inline)) int tar_plain_size(const unsigned char *f, uint64_t *out) {
    uint64_t hi = tar_load64(f), lo = tar_load64(f + 4) >> 32; /* digits 1-8; digits 9-11 and the NUL */
    if (((hi & 0xF8F8F8F8F8F8F8F8ULL) ^ 0x3030303030303030ULL) | ((lo & 0xFFF8F8F8ULL) ^ 0x303030ULL)) return 0;
    *out = tar_octal8(hi - 0x3030303030303030ULL) << 9 | tar_octal8((lo - 0x303030ULL) << 40);
    return 1;
}

/* An octal field as the C walk takes it (leading blanks, digits, then only NULs and blanks): 0, or -1. */
int tar_octal(const unsigned char *f, int len, uint64_t *out);

#endif
