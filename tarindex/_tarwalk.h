/* The tar walk: tar_step (_tarcore.h) driven over a cursor into a sink. Plain C, no Python.
 *
 * One loop holds every rule of the walk: the size checks (under max_member, within the bytes that may
 * exist), the window rule (tar_next_window), the padding skip and the stop conditions. A cursor brings
 * bytes into view (a buffer in memory, a file read with pread, a socket or pipe read with read); a sink
 * takes the members (and, when it asks for them, their data, copied by the cursor into the destination
 * the sink hands out). Whatever the walk stops at (a header tar_step defers, truncated data, a size over a
 * bound) is left in place for the Python walker, tarindex.tar._walk, which names every error.
 */
#ifndef TARINDEX_TARWALK_H
#define TARINDEX_TARWALK_H
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "_tarcore.h"

#define TAR_UNKNOWN UINT64_MAX    /* a bound not known: a stream of unknown length */
#define TAR_WINDOW_LARGE (64 << 10) /* headers of small members: several per read */
#define TAR_WINDOW_SMALL (8 << 10)  /* after a member larger than this outgrew the window: little data read twice; a
                                     * sample's small members with a PAX header each fit */
#define TAR_GROW_FIRST (16 << 20)   /* past this, a member of a stream of unknown length grows as its data arrives */

typedef struct tar_cursor tar_cursor;

/* Where the walk reads. p[0:avail] are the bytes in view, starting at the absolute offset `at`, the next
 * header; when skip > 0 the view is empty and `skip` bytes (a member's rest, its padding) come before it. */
struct tar_cursor {
    const unsigned char *p;
    size_t avail;
    uint64_t at, skip;
    uint64_t end; /* no byte exists at or past this offset (a file's size, a stream's declared length), or TAR_UNKNOWN */
    /* Bring at least `least` bytes from `at` into view (dropping `skip` bytes first), reading up to `want`;
     * `idle`: the sink has samples ready, so a stream with nothing to read yet stops rather than wait.
     * 1: done; 0: the input stopped first; -1: an error (errno). NULL: nothing past the view (a buffer). */
    int (*fill)(tar_cursor *c, size_t least, size_t want, int idle);
    /* Copy the next n bytes after the view into dst: the count copied (fewer: the input stopped), or -1
     * (errno). NULL: nothing past the view. */
    ssize_t (*copy)(tar_cursor *c, unsigned char *dst, size_t n);
    /* Around a blocking read (NULL: none): unlock's result goes to relock (the Python wrapper releases
     * and retakes the GIL). */
    void *(*unlock)(void);
    void (*relock)(void *);
    /* the cursors' own state */
    int fd, timeout_ms;     /* file or stream; a stream's poll() timeout (< 0: wait for ever) */
    int blocking;           /* a blocking descriptor (a pipe): readiness is asked with poll() */
    int timed_out;          /* poll() waited timeout_ms for nothing */
    uint64_t next;          /* a file: the offset of the byte after the view */
    uint64_t received;      /* a stream: bytes read */
    unsigned char *win;     /* the window: TAR_WINDOW_LARGE bytes the caller owns */
};

/* Where the members go. Every callback returns -1 on failure (the wrapper's error set), else 0. */
typedef struct {
    void *ctx;
    int data; /* the sink takes members' data: a member whose data the cursor cannot bring ends the walk */
    /* A regular member at header_at (its first header), its data at data_at: *dst = where its first `cap`
     * data bytes go (cap < m->size: grow asks for more), or NULL (no data: the member is taken now). */
    int (*member)(void *ctx, const tar_member *m, uint64_t header_at, uint64_t data_at, uint64_t cap, unsigned char **dst);
    unsigned char *(*grow)(void *ctx, uint64_t cap); /* the destination, now of cap bytes; NULL on failure */
    int (*commit)(void *ctx, const tar_member *m, uint64_t header_at, uint64_t data_at); /* the data is in */
    int (*stop)(void *ctx);  /* nonzero: take no more members now */
    int (*ready)(void *ctx); /* nonzero: samples are complete (a stream then does not wait for bytes); may be NULL */
} tar_sink;

enum {
    TAR_WALK_STOP = 0,     /* stopped at the header at c->at (none, a deferred one, or past the bytes that exist) */
    TAR_WALK_PARTIAL = 1,  /* the input stopped inside a member's data: its headers are in view (w->m.data bytes),
                            * w->got of its data bytes in the sink's destination; c->at is still its first header */
    TAR_WALK_IOERR = -1,   /* a read failed: errno */
    TAR_WALK_SINK = -2,    /* a sink callback failed */
};

typedef struct {
    uint64_t max_member;          /* a larger member is left to the Python walker */
    uint64_t last_at, last_size;  /* the last member taken: its first header and size (the caller's truncation error) */
    uint64_t got;                 /* TAR_WALK_PARTIAL: data bytes received */
    tar_member m;                 /* the member in hand */
} tar_walk_state;

/* Walk members from c->at while the sink takes them. Nothing is read unless the view holds a block. */
int tar_walk(tar_cursor *c, const tar_sink *s, tar_walk_state *w);

/* The cursors: over buf[pos:len], buf[0] being at absolute offset base; over a file of `size` bytes, the
 * first view the caller's bytes buf[pos:len], at absolute offset `at`; over a stream (at most `remaining`
 * bytes more, < 0: to the end) after the caller's bytes buf[pos:len] at `at`. `win` (TAR_WINDOW_LARGE
 * bytes) is the window of the last two. */
void tar_cursor_buffer(tar_cursor *c, const unsigned char *buf, size_t len, size_t pos, uint64_t base);
void tar_cursor_file(tar_cursor *c, int fd, uint64_t size, unsigned char *win, const unsigned char *buf, size_t len, size_t pos,
                     uint64_t at);
void tar_cursor_stream(tar_cursor *c, int fd, int timeout_ms, int64_t remaining, unsigned char *win, const unsigned char *buf,
                       size_t len, size_t pos, uint64_t at);

#endif
