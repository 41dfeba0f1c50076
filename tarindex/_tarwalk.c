/* The tar walk and its cursors (see _tarwalk.h). Plain C: no Python here; _tarscan.c makes the cursors and
 * the sinks for the Python-facing methods. */
#include "_tarwalk.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

/* The next window's size once a member of `padded` bytes (padding included) ended, `in_hand` of its
 * data bytes having come with its header's window. */
static size_t next_window(uint64_t in_hand, uint64_t padded) {
    return in_hand < padded && padded > TAR_WINDOW_SMALL ? TAR_WINDOW_SMALL : TAR_WINDOW_LARGE;
}

int tar_walk(tar_cursor *c, const tar_sink *s, tar_walk_state *w) {
    size_t headers = TAR_BLOCK, want = TAR_WINDOW_LARGE, need; /* headers: the bytes the next member's headers need */
    tar_member *m = &w->m;
    if (c->skip > 0 || c->avail < TAR_BLOCK) return TAR_WALK_STOP; /* the caller's header is the Python walker's */
    while (!s->stop(s->ctx)) {
        if (c->skip > 0 || c->avail < headers) { /* between members: completed samples need not wait for a stream */
            int rc = c->fill ? c->fill(c, headers, want > headers ? want : headers, s->ready && s->ready(s->ctx)) : 0;
            if (rc < 0) return TAR_WALK_IOERR;
            if (rc == 0) break; /* the input's end: the Python walker says what is missing */
        }
        int k = tar_step(c->p, c->avail, m, &need);
        if (k == TAR_SHORT && need <= TAR_WINDOW_LARGE && need > headers) { /* extension headers: a window that holds them */
            headers = need;
            continue;
        }
        headers = TAR_BLOCK;
        if (k != TAR_MEMBER) break;
        uint64_t size = m->size, padded = (size + TAR_BLOCK - 1) & ~(uint64_t)(TAR_BLOCK - 1), data_at = c->at + m->data;
        uint64_t here = c->avail - m->data; /* data bytes in view */
        uint64_t head = here < size ? here : size, fetched = 0;
        if (size > w->max_member || size > (uint64_t)(SIZE_MAX >> 1) || (c->end != TAR_UNKNOWN && (data_at > c->end || padded > c->end - data_at)))
            break; /* over max_member or past the bytes that exist: the Python walker names it */
        if (m->regular && s->data && head < size && !c->copy) break; /* the data runs past the buffer: the Python walker joins it */
        if (m->regular) {
            /* a stream of unknown length: the member grows as its data arrives, never more than came */
            uint64_t cap = c->end == TAR_UNKNOWN && size - head > TAR_GROW_FIRST ? head + TAR_GROW_FIRST : size;
            unsigned char *dst = NULL;
            if (s->member(s->ctx, m, c->at, data_at, cap, &dst) < 0) return TAR_WALK_SINK;
            if (dst) {
                memcpy(dst, c->p + m->data, (size_t)head);
                while (head + fetched < size) { /* the rest straight from the input into the destination */
                    if (head + fetched == cap) {
                        cap = cap * 2 < size ? cap * 2 : size;
                        if (!(dst = s->grow(s->ctx, cap))) return TAR_WALK_SINK;
                    }
                    size_t n = (size_t)(cap - head - fetched);
                    ssize_t got = c->copy(c, dst + head + fetched, n);
                    if (got < 0) return TAR_WALK_IOERR;
                    fetched += (uint64_t)got;
                    if ((size_t)got < n) { /* stopped: the headers stay in view, the data so far in the sink's hands */
                        w->got = head + fetched;
                        return TAR_WALK_PARTIAL;
                    }
                }
                if (s->commit(s->ctx, m, c->at, data_at) < 0) return TAR_WALK_SINK;
            }
        }
        w->last_at = c->at;
        w->last_size = size;
        uint64_t used = here < padded ? here : padded;
        c->skip = padded - used - fetched; /* past the view: dropped by the next fill */
        c->p += m->data + (size_t)used;
        c->avail = (size_t)(here - used);
        c->at = data_at + padded;
        want = next_window(here, padded);
    }
    return TAR_WALK_STOP;
}

void tar_cursor_buffer(tar_cursor *c, const unsigned char *buf, size_t len, size_t pos, uint64_t base) {
    memset(c, 0, sizeof *c);
    c->p = buf + (pos <= len ? pos : len);
    c->avail = pos <= len ? len - pos : 0;
    c->at = base + pos;
    c->end = TAR_UNKNOWN;
}

/* ---- a file, read with pread ---- */

/* pread all of n bytes unless the file ends; the bytes read, or -1 (errno). */
static ssize_t pread_full(tar_cursor *c, unsigned char *dst, size_t n, uint64_t offset) {
    size_t got = 0;
    ssize_t r = 0;
    void *t = c->unlock ? c->unlock() : NULL;
    while (got < n) {
        r = pread(c->fd, dst + got, n - got, (off_t)(offset + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    int saved = errno;
    if (c->relock) c->relock(t);
    errno = saved;
    return r < 0 ? -1 : (ssize_t)got;
}

/* A new window at `at` (the view's bytes are read again: a file can be). */
static int file_fill(tar_cursor *c, size_t least, size_t want, int idle) {
    (void)idle;
    ssize_t got = pread_full(c, c->win, want, c->at);
    if (got < 0) return -1;
    c->p = c->win;
    c->avail = (size_t)got;
    c->skip = 0;
    c->next = c->at + (uint64_t)got;
    return (size_t)got >= least;
}

static ssize_t file_copy(tar_cursor *c, unsigned char *dst, size_t n) {
    ssize_t got = pread_full(c, dst, n, c->next);
    if (got > 0) c->next += (uint64_t)got;
    return got;
}

void tar_cursor_file(tar_cursor *c, int fd, uint64_t size, unsigned char *win, const unsigned char *buf, size_t len, size_t pos,
                     uint64_t at) {
    tar_cursor_buffer(c, buf, len, pos, at - pos);
    c->end = size;
    c->fd = fd;
    c->win = win;
    c->next = at + c->avail;
    c->fill = file_fill;
    c->copy = file_copy;
}

/* ---- a socket or pipe, read with read() ----
 * A stream cannot be read twice: the bytes received stay in view until the walk takes them, and the
 * caller gets back what is left. Any trouble reading (the end, an error, a timeout, a signal) just stops
 * the walk: the Python read that follows says which. */

/* One read() of up to n bytes, waiting with poll() on a non-blocking descriptor (a Python socket with a
 * timeout), unless idle: then the samples ready go to the consumer first, and the kernel keeps receiving
 * meanwhile. 0 when nothing came. */
static size_t stream_read(tar_cursor *c, unsigned char *p, size_t n, int idle) {
    if (c->end != TAR_UNKNOWN && c->end - c->next < n) n = (size_t)(c->end - c->next);
    if (n == 0) return 0;
    if (idle && c->blocking) {
        struct pollfd now = {c->fd, POLLIN, 0};
        if (poll(&now, 1, 0) == 0) return 0; /* nothing yet: the samples ready go first */
    }
    for (;;) {
        ssize_t r = read(c->fd, p, n);
        if (r > 0) {
            c->received += (uint64_t)r;
            c->next += (uint64_t)r;
            return (size_t)r;
        }
        if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK) || idle) return 0; /* EINTR: Python's handlers */
        struct pollfd pfd = {c->fd, POLLIN, 0};
        int k = poll(&pfd, 1, c->timeout_ms);
        c->timed_out = k == 0;
        if (k <= 0) return 0;
    }
}

/* The view moves to the window's start, then reads until it holds `least` bytes, the `skip` bytes before
 * them dropped. */
static int stream_fill(tar_cursor *c, size_t least, size_t want, int idle) {
    memmove(c->win, c->p, c->avail);
    c->p = c->win;
    int ok = 1;
    void *t = c->unlock ? c->unlock() : NULL;
    while (c->skip > 0 || c->avail < least) {
        size_t r = stream_read(c, c->win + c->avail, want - c->avail, idle);
        if (r == 0) {
            ok = 0;
            break;
        }
        size_t drop = c->skip < r ? (size_t)c->skip : r;
        if (drop) memmove(c->win + c->avail, c->win + c->avail + drop, r - drop);
        c->skip -= drop;
        c->avail += r - drop;
    }
    if (c->relock) c->relock(t);
    return ok;
}

static ssize_t stream_copy(tar_cursor *c, unsigned char *dst, size_t n) {
    size_t got = 0;
    void *t = c->unlock ? c->unlock() : NULL;
    while (got < n) {
        size_t r = stream_read(c, dst + got, n - got, 0);
        if (r == 0) break;
        got += r;
    }
    if (c->relock) c->relock(t);
    return (ssize_t)got;
}

void tar_cursor_stream(tar_cursor *c, int fd, int timeout_ms, int64_t remaining, unsigned char *win, const unsigned char *buf,
                       size_t len, size_t pos, uint64_t at) {
    tar_cursor_buffer(c, buf, len, pos, at - pos);
    c->next = at + c->avail; /* the stream's position */
    c->end = remaining < 0 ? TAR_UNKNOWN : c->next + (uint64_t)remaining;
    c->fd = fd;
    c->timeout_ms = timeout_ms;
    int flags = fcntl(fd, F_GETFL);
    c->blocking = flags >= 0 && !(flags & O_NONBLOCK);
    c->win = win;
    c->fill = stream_fill;
    c->copy = stream_copy;
}
