/* ezflow_ring.h - single-file C11 writer for the ezring v1 shared-memory format.
 *
 * The format is specified in docs/ezring.md (normative); this header is one
 * implementation of its writer side. Linux only, no dependencies beyond libc.
 *
 * Use: in exactly one translation unit
 *
 *     #define EZFLOW_RING_IMPLEMENTATION
 *     #include "ezflow_ring.h"
 *
 * and include it without the macro everywhere else. In that file include this header
 * first (it defines _GNU_SOURCE for F_OFD_* and friends) or compile with -D_GNU_SOURCE.
 * The implementation compiles as C11 or C++17 with GCC or Clang (it uses the __atomic
 * builtins, which is what <stdatomic.h> maps to on both).
 *
 *     ezr_writer *w;
 *     ezr_config cfg = ezr_config_default("cam0");    // ring /dev/shm/ezflow-ring-cam0
 *     cfg.slot_size = 1100000; cfg.slot_count = 16;
 *     int rc = ezr_create(&w, &cfg);                   // 0 or -errno
 *     ezr_wait_readers(w, 1, 5000);                    // optional: see below
 *     void *p = ezr_loan(w, nbytes);                   // NULL: every slot held -> dropped
 *     if (p) { fill(p); ezr_commit(w, nbytes, "|u1", 1, shape, 0); }
 *     ezr_close(w);                                    // CLOSED, wake, unlink, unmap
 *
 * Guarantees: ezr_loan and ezr_commit never block (no locks, no waiting; commit sends
 * one non-blocking datagram per live reader). A crashed reader is reclaimed the next
 * time it holds a slot the writer needs (or its wake-up address is gone). Errors are
 * negative errno values. One writer per ring; a writer object is not thread-safe.
 *
 * Frames committed while no reader is registered are read by nobody: a reader receives
 * the frames committed after it registered. A producer that must not lose its first
 * frames calls ezr_wait_readers(w, n, timeout_ms) before publishing (the graph server
 * registers a ring within EZRING_WATCH_INTERVAL, 0.5 s, and its subscribers' readers
 * register as they open their channels).
 *
 * The ring lives in the directory named by the environment variable EZFLOW_SHM_DIR (an
 * absolute path), /dev/shm when it is unset or empty: the same directory as the ezflow
 * processes that read it.
 */
#ifndef EZFLOW_RING_H
#define EZFLOW_RING_H

#if defined(EZFLOW_RING_IMPLEMENTATION) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE 1 /* F_OFD_*; only effective if nothing was included before us */
#endif

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EZR_MAGIC 0x31474e49525a45ULL /* "EZRING1\0" little-endian */
#define EZR_MAJOR 1u
#define EZR_MINOR 1u /* 1: scan_count (docs/ezring.md, "Registration") */
#define EZR_HEADER_SIZE 384u
#define EZR_READER_ENTRY_SIZE 64u
#define EZR_SLOT_HEADER_SIZE 256u
#define EZR_MAX_NDIM 8u
#define EZR_TYPESTR_SIZE 8u
#define EZR_TOPIC_SIZE 128u
#define EZR_META_SIZE 128u
#define EZR_NAME_MAX 64u
#define EZR_FLAG_CLOSED 1ull

typedef struct ezr_config {
    const char *name;     /* [A-Za-z0-9_-]{1,64}: the ring is $EZFLOW_SHM_DIR/ezflow-ring-<name>
                             (/dev/shm/ezflow-ring-<name> by default) */
    const char *topic;    /* ezflow topic (UTF-8, < 128 bytes), "" if none */
    uint32_t slot_count;  /* >= 2 */
    uint64_t slot_size;   /* payload bytes per slot, >= 1 */
    uint32_t max_readers; /* 1..1024 */
    uint32_t mode;        /* file mode, 0600 by default */
} ezr_config;

typedef struct ezr_stats {
    uint64_t published;         /* frames committed (== write_seq) */
    uint64_t dropped_full;      /* ezr_loan calls that returned NULL: every slot held */
    uint32_t readers_live;      /* reader entries in state ACTIVE */
    uint64_t readers_reclaimed; /* entries of dead readers the writer freed */
} ezr_stats;

typedef struct ezr_writer ezr_writer;

ezr_config ezr_config_default(const char *name);
int ezr_create(ezr_writer **w, const ezr_config *cfg);
void *ezr_loan(ezr_writer *w, uint64_t nbytes);
int ezr_commit(ezr_writer *w, uint64_t nbytes, const char *typestr, uint32_t ndim,
               const uint64_t *shape, uint64_t t_ns);
int ezr_commit_meta(ezr_writer *w, uint64_t nbytes, const char *typestr, uint32_t ndim,
                    const uint64_t *shape, uint64_t t_ns, const void *meta, uint32_t meta_len);
ezr_stats ezr_get_stats(ezr_writer *w);
int ezr_wait_readers(ezr_writer *w, uint32_t readers, uint32_t timeout_ms);
const char *ezr_path(const ezr_writer *w);
int ezr_close(ezr_writer *w);
uint64_t ezr_now_ns(void);

#ifdef __cplusplus
}
#endif
#endif /* EZFLOW_RING_H */

#ifdef EZFLOW_RING_IMPLEMENTATION
#ifndef EZFLOW_RING_IMPLEMENTED
#define EZFLOW_RING_IMPLEMENTED

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#ifndef F_OFD_GETLK /* libc headers included before _GNU_SOURCE: Linux's fixed values */
#define F_OFD_GETLK 36
#define F_OFD_SETLK 37
#endif

/* Header offsets (docs/ezring.md, "Segment header"). */
#define EZR_OFF_MAGIC 0
#define EZR_OFF_MAJOR 8
#define EZR_OFF_MINOR 10
#define EZR_OFF_HEADER_SIZE 12
#define EZR_OFF_FLAGS 16
#define EZR_OFF_SLOT_COUNT 24
#define EZR_OFF_MAX_READERS 28
#define EZR_OFF_SLOT_SIZE 32
#define EZR_OFF_SLOT_STRIDE 40
#define EZR_OFF_READER_TABLE 48
#define EZR_OFF_SLOT_TABLE 56
#define EZR_OFF_SEGMENT_SIZE 64
#define EZR_OFF_WRITER_PID 72
#define EZR_OFF_WRITER_START 80
#define EZR_OFF_CREATED_NS 88
#define EZR_OFF_TOPIC 96
#define EZR_OFF_WRITE_SEQ 256
#define EZR_OFF_DROPPED 320
#define EZR_OFF_RECLAIMED 328
#define EZR_OFF_SCAN_COUNT 336 /* v1.1: odd while the writer scans the reader table */
/* Reader entry offsets. */
#define EZR_R_STATE 0   /* u64: low 32 bits state, high 32 bits generation */
#define EZR_R_MODE 8    /* u32: 1 lossless, 2 leaky */
#define EZR_R_PID 12    /* u32 */
#define EZR_R_CURSOR 16 /* u64: every seq <= cursor is released */
#define EZR_R_ADDR 32   /* 32 bytes: abstract socket name without the leading NUL */
#define EZR_R_ADDR_SIZE 32
/* Slot header offsets. */
#define EZR_S_SEQ 0
#define EZR_S_LENGTH 8
#define EZR_S_T_NS 16
#define EZR_S_TYPESTR 24
#define EZR_S_NDIM 32
#define EZR_S_META_LEN 36
#define EZR_S_SHAPE 40
#define EZR_S_META 128

#define EZR_STATE_FREE 0u
#define EZR_STATE_ACTIVE 2u
#define EZR_MODE_LOSSLESS 1u

struct ezr_writer {
    unsigned char *base;
    size_t size;
    int fd;
    int sock;
    uint32_t slot_count, max_readers;
    uint64_t slot_size, slot_stride, reader_table, slot_table;
    uint64_t loaned_seq; /* seq of the outstanding loan, 0 if none */
    uint64_t published, dropped, reclaimed;
    uint64_t scans; /* reader-table scans begun: scan_count is 2 * scans - 1 during one */
    char path[512];
};

/* Atomics through the GCC/Clang __atomic builtins (what <stdatomic.h> maps to), so the
 * implementation also compiles as C++. Each names the order docs/ezring.md declares. */
#define EZR_U64(p) ((uint64_t *)(void *)(p))
#define EZR_AT64(w, off) EZR_U64((w)->base + (off))

static inline unsigned char *ezr__reader(ezr_writer *w, uint32_t i) {
    return w->base + w->reader_table + (uint64_t)i * EZR_READER_ENTRY_SIZE;
}
static inline unsigned char *ezr__slot(ezr_writer *w, uint64_t seq) {
    return w->base + w->slot_table + ((seq - 1) % w->slot_count) * w->slot_stride;
}

uint64_t ezr_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t ezr__realtime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

ezr_config ezr_config_default(const char *name) {
    ezr_config c;
    c.name = name;
    c.topic = "";
    c.slot_count = 16;
    c.slot_size = 1u << 20;
    c.max_readers = 16;
    c.mode = 0600;
    return c;
}

/* Field 22 of /proc/self/stat: the start time in clock ticks since boot. */
static uint64_t ezr__own_start(void) {
    char buf[1024];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p) return 0;
    p += 2; /* field 3 */
    for (int field = 3; field < 22 && *p; field++) {
        p = strchr(p, ' ');
        if (!p) return 0;
        p++;
    }
    return strtoull(p, NULL, 10);
}

/* 1 if someone else holds an OFD lock on byte *off* of the segment, 0 if not, -errno. */
static int ezr__locked(int fd, uint64_t off) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)off;
    fl.l_len = 1;
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0) return -errno;
    return fl.l_type != F_UNLCK;
}

static int ezr__valid_name(const char *name) {
    size_t n = name ? strlen(name) : 0;
    if (n < 1 || n > EZR_NAME_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* An existing ring whose writer is gone (no OFD lock on byte 0) is stale: remove it.
 * Only a regular file of our own user is considered (opened read-only, never following a
 * symbolic link, never blocking on a FIFO); anything else under the name is -EEXIST. */
static int ezr__remove_if_stale(const char *path) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 0 : -EEXIST;
    struct stat st;
    int rc = -EEXIST;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
        ezr__locked(fd, 0) == 0 && unlink(path) == 0)
        rc = 0;
    close(fd);
    return rc;
}

/* The shm directory: $EZFLOW_SHM_DIR if set and not empty (an absolute path), else
 * /dev/shm. NULL for a relative path. */
static const char *ezr__shm_dir(void) {
    const char *dir = getenv("EZFLOW_SHM_DIR");
    if (!dir || !*dir) return "/dev/shm";
    return dir[0] == '/' ? dir : NULL;
}

int ezr_create(ezr_writer **out, const ezr_config *cfg) {
    if (!out || !cfg || !ezr__valid_name(cfg->name)) return -EINVAL;
    *out = NULL;
    const char *topic = cfg->topic ? cfg->topic : "";
    if (strlen(topic) >= EZR_TOPIC_SIZE) return -ENAMETOOLONG;
    if (cfg->slot_count < 2 || cfg->slot_size < 1 || cfg->max_readers < 1 ||
        cfg->max_readers > 1024)
        return -EINVAL;
    if (cfg->slot_size > (UINT64_MAX / 4) / cfg->slot_count) return -EOVERFLOW;

    ezr_writer *w = (ezr_writer *)calloc(1, sizeof *w);
    if (!w) return -ENOMEM;
    w->fd = w->sock = -1;
    const char *dir = ezr__shm_dir();
    int len = dir ? snprintf(w->path, sizeof w->path, "%s/ezflow-ring-%s", dir, cfg->name) : -1;
    if (len < 0 || (size_t)len >= sizeof w->path) {
        free(w);
        return dir ? -ENAMETOOLONG : -EINVAL;
    }
    w->slot_count = cfg->slot_count;
    w->max_readers = cfg->max_readers;
    w->slot_size = cfg->slot_size;
    w->slot_stride = (EZR_SLOT_HEADER_SIZE + cfg->slot_size + 63) & ~(uint64_t)63;
    w->reader_table = EZR_HEADER_SIZE;
    w->slot_table = (w->reader_table + (uint64_t)cfg->max_readers * EZR_READER_ENTRY_SIZE + 4095) &
                    ~(uint64_t)4095;
    w->size = (size_t)(w->slot_table + w->slot_stride * cfg->slot_count);

    int rc;
    mode_t mode = cfg->mode ? (mode_t)cfg->mode : 0600;
    for (int attempt = 0;; attempt++) {
        w->fd = open(w->path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
        if (w->fd >= 0) break;
        rc = -errno;
        if (rc != -EEXIST || attempt > 0) goto fail;
        rc = ezr__remove_if_stale(w->path);
        if (rc != 0) goto fail;
    }
    fchmod(w->fd, mode); /* umask must not widen or narrow what the caller asked */
    {
        /* The writer's liveness lock: byte 0, held until ezr_close (or death). */
        struct flock fl;
        memset(&fl, 0, sizeof fl);
        fl.l_type = F_WRLCK;
        fl.l_whence = SEEK_SET;
        fl.l_start = 0;
        fl.l_len = 1;
        if (fcntl(w->fd, F_OFD_SETLK, &fl) != 0) {
            rc = -errno;
            goto fail_unlink;
        }
    }
    if (ftruncate(w->fd, (off_t)w->size) != 0) {
        rc = -errno;
        goto fail_unlink;
    }
    rc = posix_fallocate(w->fd, 0, (off_t)w->size); /* ENOSPC now, not SIGBUS later */
    if (rc != 0) {
        rc = -rc;
        goto fail_unlink;
    }
    w->base = (unsigned char *)mmap(NULL, w->size, PROT_READ | PROT_WRITE, MAP_SHARED, w->fd, 0);
    if (w->base == MAP_FAILED) {
        w->base = NULL;
        rc = -errno;
        goto fail_unlink;
    }
    w->sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (w->sock < 0) {
        rc = -errno;
        goto fail_unlink;
    }

    {
        unsigned char *h = w->base;
        uint16_t major = EZR_MAJOR, minor = EZR_MINOR;
        uint32_t hsize = EZR_HEADER_SIZE, pid = (uint32_t)getpid();
        uint64_t start = ezr__own_start(), created = ezr__realtime_ns(), segsize = w->size;
        memcpy(h + EZR_OFF_MAJOR, &major, 2);
        memcpy(h + EZR_OFF_MINOR, &minor, 2);
        memcpy(h + EZR_OFF_HEADER_SIZE, &hsize, 4);
        memcpy(h + EZR_OFF_SLOT_COUNT, &w->slot_count, 4);
        memcpy(h + EZR_OFF_MAX_READERS, &w->max_readers, 4);
        memcpy(h + EZR_OFF_SLOT_SIZE, &w->slot_size, 8);
        memcpy(h + EZR_OFF_SLOT_STRIDE, &w->slot_stride, 8);
        memcpy(h + EZR_OFF_READER_TABLE, &w->reader_table, 8);
        memcpy(h + EZR_OFF_SLOT_TABLE, &w->slot_table, 8);
        memcpy(h + EZR_OFF_SEGMENT_SIZE, &segsize, 8);
        memcpy(h + EZR_OFF_WRITER_PID, &pid, 4);
        memcpy(h + EZR_OFF_WRITER_START, &start, 8);
        memcpy(h + EZR_OFF_CREATED_NS, &created, 8);
        memcpy(h + EZR_OFF_TOPIC, topic, strlen(topic));
        /* The magic goes last, with release: a reader that sees it sees the whole header. */
        __atomic_store_n(EZR_AT64(w, EZR_OFF_MAGIC), EZR_MAGIC, __ATOMIC_RELEASE);
    }
    *out = w;
    return 0;

fail_unlink:
    unlink(w->path);
fail:
    if (w->base) munmap(w->base, w->size);
    if (w->sock >= 0) close(w->sock);
    if (w->fd >= 0) close(w->fd);
    free(w);
    return rc;
}

/* Free entry *i* if its reader has died (no OFD lock on its first byte). The state word
 * is compared-and-swapped, so a reader that re-registered meanwhile keeps its entry. */
static int ezr__reclaim_if_dead(ezr_writer *w, uint32_t i, uint64_t state_word) {
    unsigned char *r = ezr__reader(w, i);
    int locked = ezr__locked(w->fd, w->reader_table + (uint64_t)i * EZR_READER_ENTRY_SIZE);
    if (locked != 0) return 0;
    uint64_t expected = state_word;
    uint64_t freed = state_word & 0xffffffff00000000ull; /* keep the generation */
    if (__atomic_compare_exchange_n(EZR_U64(r + EZR_R_STATE), &expected, freed, 0,
                                    __ATOMIC_ACQ_REL,
                                                __ATOMIC_RELAXED)) {
        w->reclaimed++;
        __atomic_store_n(EZR_AT64(w, EZR_OFF_RECLAIMED), w->reclaimed, __ATOMIC_RELAXED);
        return 1;
    }
    return 0;
}

void *ezr_loan(ezr_writer *w, uint64_t nbytes) {
    if (!w || nbytes > w->slot_size) return NULL;
    uint64_t seq = w->published + 1;
    int scanned = seq > w->slot_count;
    if (scanned) {
        uint64_t previous = seq - w->slot_count; /* the frame this slot still holds */
        /* Announce the scan (scan_count odd), then the fence: pairs with a registering
         * reader's state store + full barrier + loads of write_seq and scan_count. */
        w->scans++;
        __atomic_store_n(EZR_AT64(w, EZR_OFF_SCAN_COUNT), 2 * w->scans - 1, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        for (uint32_t i = 0; i < w->max_readers; i++) {
            unsigned char *r = ezr__reader(w, i);
            uint64_t word = __atomic_load_n(EZR_U64(r + EZR_R_STATE),
                                                 __ATOMIC_ACQUIRE);
            if ((uint32_t)word != EZR_STATE_ACTIVE) continue;
            uint32_t mode;
            memcpy(&mode, r + EZR_R_MODE, 4);
            if (mode != EZR_MODE_LOSSLESS) continue;
            uint64_t cursor = __atomic_load_n(EZR_U64(r + EZR_R_CURSOR),
                                                   __ATOMIC_ACQUIRE);
            if (cursor >= previous) continue;
            if (ezr__reclaim_if_dead(w, i, word)) continue;
            /* The scan is over: the frame is held, nothing was written. */
            __atomic_store_n(EZR_AT64(w, EZR_OFF_SCAN_COUNT), 2 * w->scans, __ATOMIC_RELEASE);
            w->dropped++;
            __atomic_store_n(EZR_AT64(w, EZR_OFF_DROPPED), w->dropped, __ATOMIC_RELAXED);
            w->loaned_seq = 0;
            return NULL;
        }
    }
    unsigned char *s = ezr__slot(w, seq);
    /* Seqlock: mark the slot as being written before touching its payload. */
    __atomic_store_n(EZR_U64(s + EZR_S_SEQ), 0, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    /* The scan is over, after the slot's mark (a reader that sees it sees the mark). */
    if (scanned)
        __atomic_store_n(EZR_AT64(w, EZR_OFF_SCAN_COUNT), 2 * w->scans, __ATOMIC_RELEASE);
    w->loaned_seq = seq;
    return s + EZR_SLOT_HEADER_SIZE;
}

static void ezr__wake_all(ezr_writer *w) {
    for (uint32_t i = 0; i < w->max_readers; i++) {
        unsigned char *r = ezr__reader(w, i);
        uint64_t word = __atomic_load_n(EZR_U64(r + EZR_R_STATE),
                                             __ATOMIC_ACQUIRE);
        if ((uint32_t)word != EZR_STATE_ACTIVE) continue;
        struct sockaddr_un addr;
        memset(&addr, 0, sizeof addr);
        addr.sun_family = AF_UNIX;
        size_t n = strnlen((const char *)r + EZR_R_ADDR, EZR_R_ADDR_SIZE);
        if (n == 0) continue;
        memcpy(addr.sun_path + 1, r + EZR_R_ADDR, n);
        socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
        char byte = 1;
        if (sendto(w->sock, &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL, (struct sockaddr *)&addr, len) <
                0 &&
            (errno == ECONNREFUSED || errno == ENOENT))
            ezr__reclaim_if_dead(w, i, word); /* no socket: the reader may have died */
        /* EAGAIN: the reader has wake-ups queued already; nothing is lost. */
    }
}

int ezr_commit_meta(ezr_writer *w, uint64_t nbytes, const char *typestr, uint32_t ndim,
                    const uint64_t *shape, uint64_t t_ns, const void *meta, uint32_t meta_len) {
    if (!w) return -EINVAL;
    if (w->loaned_seq == 0) return -EINVAL; /* no ezr_loan, or it returned NULL */
    if (nbytes > w->slot_size || ndim > EZR_MAX_NDIM || meta_len > EZR_META_SIZE ||
        (ndim && !shape) || (meta_len && !meta))
        return -EINVAL;
    const char *ts = typestr ? typestr : "|u1";
    size_t tslen = strlen(ts);
    if (tslen == 0 || tslen >= EZR_TYPESTR_SIZE) return -EINVAL;
    uint64_t seq = w->loaned_seq;
    unsigned char *s = ezr__slot(w, seq);
    uint64_t t = t_ns ? t_ns : ezr_now_ns();
    memcpy(s + EZR_S_LENGTH, &nbytes, 8);
    memcpy(s + EZR_S_T_NS, &t, 8);
    memset(s + EZR_S_TYPESTR, 0, EZR_TYPESTR_SIZE);
    memcpy(s + EZR_S_TYPESTR, ts, tslen);
    memcpy(s + EZR_S_NDIM, &ndim, 4);
    memcpy(s + EZR_S_META_LEN, &meta_len, 4);
    memset(s + EZR_S_SHAPE, 0, 8 * EZR_MAX_NDIM);
    if (ndim) memcpy(s + EZR_S_SHAPE, shape, 8 * (size_t)ndim);
    if (meta_len) memcpy(s + EZR_S_META, meta, meta_len);
    /* Publish: slot seq, then write_seq, both with release (payload happens-before). */
    __atomic_store_n(EZR_U64(s + EZR_S_SEQ), seq, __ATOMIC_RELEASE);
    __atomic_store_n(EZR_AT64(w, EZR_OFF_WRITE_SEQ), seq, __ATOMIC_RELEASE);
    w->published = seq;
    w->loaned_seq = 0;
    /* Pairs with a reader's "arm, full barrier, re-check write_seq" before it sleeps. */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    ezr__wake_all(w);
    return 0;
}

int ezr_commit(ezr_writer *w, uint64_t nbytes, const char *typestr, uint32_t ndim,
               const uint64_t *shape, uint64_t t_ns) {
    return ezr_commit_meta(w, nbytes, typestr, ndim, shape, t_ns, NULL, 0);
}

ezr_stats ezr_get_stats(ezr_writer *w) {
    ezr_stats st;
    memset(&st, 0, sizeof st);
    if (!w) return st;
    st.published = w->published;
    st.dropped_full = w->dropped;
    st.readers_reclaimed = w->reclaimed;
    for (uint32_t i = 0; i < w->max_readers; i++) {
        uint64_t word = __atomic_load_n(
            EZR_U64(ezr__reader(w, i) + EZR_R_STATE), __ATOMIC_ACQUIRE);
        if ((uint32_t)word == EZR_STATE_ACTIVE) st.readers_live++;
    }
    return st;
}

int ezr_wait_readers(ezr_writer *w, uint32_t readers, uint32_t timeout_ms) {
    if (!w) return -EINVAL;
    uint64_t deadline = ezr_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        if (ezr_get_stats(w).readers_live >= readers) return 0;
        if (ezr_now_ns() >= deadline) return -ETIMEDOUT;
        struct timespec ts = {0, 1000000}; /* 1 ms */
        if (nanosleep(&ts, NULL) != 0 && errno == EINTR) return -EINTR; /* a signal handler ran */
    }
}

const char *ezr_path(const ezr_writer *w) { return w ? w->path : NULL; }

int ezr_close(ezr_writer *w) {
    if (!w) return -EINVAL;
    __atomic_fetch_or(EZR_AT64(w, EZR_OFF_FLAGS), EZR_FLAG_CLOSED, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    ezr__wake_all(w);
    int rc = 0;
    /* Unlink before dropping the lock, so no sweeper can see a lock-free live name. */
    if (unlink(w->path) != 0 && errno != ENOENT) rc = -errno;
    munmap(w->base, w->size);
    close(w->sock);
    close(w->fd); /* releases the writer's OFD lock */
    free(w);
    return rc;
}

#endif /* EZFLOW_RING_IMPLEMENTED */
#endif /* EZFLOW_RING_IMPLEMENTATION */
