/* Batches of positional reads from local files, many in flight (tarindex/_batchio.c). Python-free. */
#ifndef TARINDEX_BATCHIO_H
#define TARINDEX_BATCHIO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* How the ranges of one file are read, kept per file by the caller and updated by bio_read. */
enum {
    BIO_NOWAIT = 0, /* first from the page cache inline (preadv2 RWF_NOWAIT); what misses, by the pool */
    BIO_TIMED = 1,  /* no RWF_NOWAIT here: read inline while a read stays fast (below BIO_SLOW_NS) */
    BIO_POOL = 2,   /* no RWF_NOWAIT and a read was slow: every range by the pool */
};

#define BIO_SLOW_NS 200000     /* an inline read this slow (0.2 ms) came from storage, not the page cache */
#define BIO_IOV_MAX 1024       /* iovecs of one coalesced read */
#define BIO_SPAN_MAX (8 << 20) /* bytes of one coalesced read */
#define BIO_THREADS_MAX 256    /* threads of the pool (a process's; grown on demand, never shrunk) */

/* One range: `size` bytes of `fd` at `offset` into iov[0..niov) (their lengths add up to `size`). */
typedef struct {
    int fd;
    unsigned char *mode; /* the file's BIO_* state (shared by the ranges of one file) */
    uint64_t offset, size;
    struct iovec *iov;
    int niov;
    int err;      /* out: 0, or the errno of a failed read */
    uint64_t got; /* out: bytes read (less than size: the file ended) */
} bio_range;

/* Read every range. Ranges next to each other in `r` (the caller sorts them by file and offset) of one file
 * at most `gap` bytes apart are read by one preadv (the gap read into a scratch buffer and dropped; gap < 0:
 * never merged). At most `max_in_flight` reads are in flight (the calling thread's among them); what the
 * page cache holds is read inline. Call without the GIL. Returns 0, or -1 with errno (ENOMEM) when the plan
 * could not be allocated (no range read). */
int bio_read(bio_range *r, size_t n, int max_in_flight, int64_t gap);

#endif
