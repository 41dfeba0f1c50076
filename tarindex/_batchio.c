/* Batches of positional reads from local files, many in flight: what TarDataset.__getitems__ reads through
 * the C reader (Reader.read_batch in _speedups.c). Python-free.
 *
 * A file system where a read is a round trip (NFS, Lustre, a FUSE-mounted bucket) or a cold disk serves
 * reads in parallel; a loop of preads waits for each. Here the ranges of a batch, sorted by the caller,
 * are first merged where neighbours of one file lie at most `gap` bytes apart (one preadv, the gap read into
 * a scratch buffer). Each merged read is then tried inline with preadv2(RWF_NOWAIT): served from the page
 * cache at the speed of a plain loop, so a warm batch costs what it cost before. What the cache misses goes
 * to a pool of threads, at most max_in_flight reads at once (the calling thread reads too).
 *
 * A file system without RWF_NOWAIT (EOPNOTSUPP: some FUSE mounts, older kernels) reads inline while each read
 * stays below BIO_SLOW_NS, then, after one slow read, hands every later range of the file to the pool (the
 * file's mode, kept by the caller per file).
 *
 * The pool belongs to the process: threads start when a batch needs more than are idle (at most
 * BIO_THREADS_MAX) and wait for work afterwards, with every signal blocked. A forked child starts with an
 * empty pool (pthread_atfork).
 */
#define _GNU_SOURCE
#include "_batchio.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef RWF_NOWAIT
#define RWF_NOWAIT 0x00000008
#endif

/* A merged read: ranges first[0..count) of one file, from `start` for `len` bytes into iov[0..niov). */
typedef struct {
    bio_range *first;
    size_t count;
    int fd;
    unsigned char *mode;
    uint64_t start, len, done;
    struct iovec *iov;
    int niov;
    int err;
} group;

/* The pool's work: a batch's misses, taken one by one by `tasks` threads. */
typedef struct job {
    group **miss;
    size_t nmiss;
    size_t next;    /* the next miss to take (atomic) */
    int unstarted;  /* tasks no thread has taken yet (under mu) */
    int running;    /* tasks not finished (under mu) */
    pthread_cond_t done;
    struct job *qnext;
} job;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work = PTHREAD_COND_INITIALIZER;
static job *qhead, *qtail;
static int nthreads, idle;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void forked_child(void) { /* the parent's threads do not exist here */
    pthread_mutex_init(&mu, NULL);
    pthread_cond_init(&work, NULL);
    qhead = qtail = NULL;
    nthreads = idle = 0;
}

static void register_fork(void) { pthread_atfork(NULL, NULL, forked_child); }

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* The group's iovecs past `got` more bytes. */
static void advance(group *g, uint64_t got) {
    while (got && g->niov) {
        if (got >= g->iov[0].iov_len) {
            got -= g->iov[0].iov_len;
            g->iov++;
            g->niov--;
        } else {
            g->iov[0].iov_base = (char *)g->iov[0].iov_base + got;
            g->iov[0].iov_len -= got;
            got = 0;
        }
    }
}

/* Read the rest of the group: 0 (done, or the file ended), or an errno (EAGAIN: RWF_NOWAIT missed). */
static int group_read(group *g, int flags) {
    while (g->done < g->len) {
        ssize_t got = preadv2(g->fd, g->iov, g->niov, (off_t)(g->start + g->done), flags);
        if (got < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (got == 0) return 0;
        g->done += (uint64_t)got;
        advance(g, (uint64_t)got);
    }
    return 0;
}

/* Try the group in this thread as its file's mode says: 1 read (or failed) here, 0 for the pool. */
static int read_inline(group *g) {
    if (*g->mode == BIO_POOL) return 0;
    if (*g->mode == BIO_NOWAIT) {
        int e = group_read(g, RWF_NOWAIT);
        if (e == EAGAIN) return 0;
        if (e != EOPNOTSUPP && e != EINVAL && e != ENOSYS) {
            g->err = e;
            return 1;
        }
        *g->mode = BIO_TIMED;
    }
    int64_t t0 = now_ns();
    g->err = group_read(g, 0);
    if (now_ns() - t0 > BIO_SLOW_NS) *g->mode = BIO_POOL;
    return 1;
}

static void run_task(job *j) {
    for (;;) {
        size_t k = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (k >= j->nmiss) return;
        group *g = j->miss[k];
        g->err = group_read(g, 0);
    }
}

static void *worker(void *arg) {
    (void)arg;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (!qhead) {
            idle++;
            pthread_cond_wait(&work, &mu);
            idle--;
        }
        job *j = qhead;
        if (--j->unstarted == 0) {
            qhead = j->qnext;
            if (!qhead) qtail = NULL;
        }
        pthread_mutex_unlock(&mu);
        run_task(j);
        pthread_mutex_lock(&mu);
        if (--j->running == 0) pthread_cond_signal(&j->done);
    }
    return NULL;
}

/* Threads so that `tasks` more find one idle (as many as can start; under mu). */
static void grow(int tasks) {
    int want = tasks - idle;
    if (want <= 0 || nthreads >= BIO_THREADS_MAX) return;
    if (want > BIO_THREADS_MAX - nthreads) want = BIO_THREADS_MAX - nthreads;
    pthread_attr_t attr;
    sigset_t all, old;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 << 10);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int k = 0; k < want; k++) {
        pthread_t t;
        if (pthread_create(&t, &attr, worker, NULL) != 0) break;
        nthreads++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
}

/* The misses read by the pool and this thread, `tasks` readers in all. */
static void run_pool(group **miss, size_t nmiss, int tasks) {
    job j = {.miss = miss, .nmiss = nmiss, .next = 0, .unstarted = tasks - 1, .running = tasks - 1, .qnext = NULL};
    if (tasks > 1) {
        pthread_cond_init(&j.done, NULL);
        pthread_mutex_lock(&mu);
        if (qtail) qtail->qnext = &j;
        else qhead = &j;
        qtail = &j;
        grow(tasks - 1);
        if (tasks - 1 > 1) pthread_cond_broadcast(&work);
        else pthread_cond_signal(&work);
        pthread_mutex_unlock(&mu);
    }
    run_task(&j);
    if (tasks <= 1) return;
    pthread_mutex_lock(&mu);
    if (j.unstarted) { /* no thread came for them (none could start): every miss is read, take them back */
        job **p = &qhead, *prev = NULL;
        while (*p != &j) {
            prev = *p;
            p = &(*p)->qnext;
        }
        *p = j.qnext;
        if (qtail == &j) qtail = prev;
        j.running -= j.unstarted;
        j.unstarted = 0;
    }
    while (j.running) pthread_cond_wait(&j.done, &mu);
    pthread_mutex_unlock(&mu);
    pthread_cond_destroy(&j.done);
}

/* Whether range b extends the group that ends with range a (same file, after it, close enough, small enough). */
static int joins(const bio_range *a, const bio_range *b, const group *g, int niov, int64_t gap) {
    uint64_t end = a->offset + a->size;
    return gap >= 0 && b->fd == a->fd && b->offset >= end && b->offset - end <= (uint64_t)gap &&
           niov + b->niov + 1 <= BIO_IOV_MAX && b->offset + b->size - g->start <= BIO_SPAN_MAX;
}

int bio_read(bio_range *r, size_t n, int max_in_flight, int64_t gap) {
    pthread_once(&once, register_fork);
    size_t total_iov = 0;
    uint64_t widest = 0;
    for (size_t k = 0; k < n; k++) {
        total_iov += (size_t)r[k].niov + 1;
        r[k].err = 0;
        r[k].got = 0;
    }
    group *groups = malloc(n * sizeof(group) + n * sizeof(group *) + total_iov * sizeof(struct iovec) + 1);
    if (!groups) {
        errno = ENOMEM;
        return -1;
    }
    group **miss = (group **)(groups + n);
    struct iovec *iov = (struct iovec *)(miss + n);
    size_t ng = 0, used = 0;
    for (size_t k = 0; k < n;) { /* the plan: ranges merged into groups; the gaps' iovecs point at NULL for now */
        group *g = &groups[ng++];
        *g = (group){.first = &r[k], .count = 1, .fd = r[k].fd, .mode = r[k].mode, .start = r[k].offset, .iov = iov + used};
        memcpy(iov + used, r[k].iov, (size_t)r[k].niov * sizeof(struct iovec));
        used += (size_t)r[k].niov;
        for (k++; k < n && joins(&r[k - 1], &r[k], g, (int)(iov + used - g->iov), gap); k++) {
            uint64_t hole = r[k].offset - (r[k - 1].offset + r[k - 1].size);
            if (hole) {
                iov[used++] = (struct iovec){.iov_base = NULL, .iov_len = hole};
                if (hole > widest) widest = hole;
            }
            memcpy(iov + used, r[k].iov, (size_t)r[k].niov * sizeof(struct iovec));
            used += (size_t)r[k].niov;
            g->count++;
        }
        const bio_range *last = &r[k - 1];
        g->len = last->offset + last->size - g->start;
        g->niov = (int)(iov + used - g->iov);
    }
    char *scratch = widest ? malloc(widest) : NULL; /* every gap is read into it (and dropped) */
    if (widest && !scratch) {
        free(groups);
        errno = ENOMEM;
        return -1;
    }
    for (size_t k = 0; k < used; k++)
        if (!iov[k].iov_base) iov[k].iov_base = scratch;

    size_t nmiss = 0, hits = 0;
    for (size_t k = 0; k < ng; k++) { /* the page cache's ranges here; after 8 misses and no hit, the rest by the pool */
        if (nmiss >= 8 && !hits && *groups[k].mode == BIO_NOWAIT) miss[nmiss++] = &groups[k];
        else if (read_inline(&groups[k])) hits++;
        else miss[nmiss++] = &groups[k];
    }
    if (nmiss) {
        int tasks = max_in_flight < 1 ? 1 : max_in_flight;
        if ((size_t)tasks > nmiss) tasks = (int)nmiss;
        run_pool(miss, nmiss, tasks);
    }
    for (size_t k = 0; k < ng; k++) { /* each range's share of its group's read */
        group *g = &groups[k];
        for (size_t q = 0; q < g->count; q++) {
            bio_range *x = &g->first[q];
            uint64_t at = x->offset - g->start;
            x->err = g->err;
            x->got = g->done <= at ? 0 : g->done - at < x->size ? g->done - at : x->size;
        }
    }
    free(scratch);
    free(groups);
    return 0;
}
