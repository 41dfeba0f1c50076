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

/* Whether p holds a PAX 'x' header (checksum valid, a plain octal size) and its records, all within `avail`
 * bytes, whose records cannot rename or resize the member after it: none holds "path=", "size=" or
 * "GNU.sparse" (a record that sets one holds its key and '=' side by side). Then *skip is the bytes they take
 * (the header and its padded records) and the member's own header follows. The records are not parsed: the
 * read check's fast path for webdataset's TarWriter and GNU tar --format=posix, which write only times there. */
int tar_pax_inert(const unsigned char *p, size_t avail, size_t *skip);

/* The header checksum's unsigned sum (the checksum field counted as spaces). */
uint64_t tar_header_sum(const unsigned char *h);

/* An octal field as the C walk takes it (leading blanks, digits, then only NULs and blanks): 0, or -1. */
int tar_octal(const unsigned char *f, int len, uint64_t *out);

#endif
