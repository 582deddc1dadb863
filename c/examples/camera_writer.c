/* camera_writer.c - a configurable frame producer for an ezring v1 ring.
 *
 * Build:  cc -O2 -Wall -Wextra -Werror -std=c11 -I c -o camera_writer c/examples/camera_writer.c
 * Run:    ./camera_writer --name cam0 --topic /cam0 --frame-size 1100000 --count 1000 --rate 30
 *
 * Publishes --count frames of --frame-size bytes ("|u1", shape [frame-size]) at --rate frames/s
 * (0: as fast as possible). Each payload starts with the frame number (u64, from 0) and is
 * filled with the byte (frame number & 0xff) (--fill none leaves the rest as it was).
 * A loan that finds every slot held is a drop: that frame number is skipped, not retried
 * (--on-full retry: a benchmark mode that waits 20 us and retries; each failed loan is still
 * counted in dropped_full).
 * Prints "ready <path>" once the ring exists, and one JSON line of statistics at the end.
 * --wait-readers N waits (up to 10 s) for N registered readers before the first frame.
 * SIGTERM/SIGINT stop early and close the ring cleanly.
 */
#define _GNU_SOURCE 1
#define EZFLOW_RING_IMPLEMENTATION
#include "ezflow_ring.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile sig_atomic_t stop = 0;
static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

static void sleep_until(uint64_t t_ns) {
    struct timespec ts;
    ts.tv_sec = (time_t)(t_ns / 1000000000ull);
    ts.tv_nsec = (long)(t_ns % 1000000000ull);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR && !stop) {
    }
}

int main(int argc, char **argv) {
    ezr_config cfg = ezr_config_default("camera");
    uint64_t frame_size = 1100000, count = 100;
    double rate = 0;
    unsigned wait_readers = 0;
    int fill = 1, retry = 0;
    cfg.slot_size = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--name")) cfg.name = v;
        else if (!strcmp(k, "--topic")) cfg.topic = v;
        else if (!strcmp(k, "--slots")) cfg.slot_count = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(k, "--slot-size")) cfg.slot_size = strtoull(v, NULL, 10);
        else if (!strcmp(k, "--max-readers")) cfg.max_readers = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(k, "--frame-size")) frame_size = strtoull(v, NULL, 10);
        else if (!strcmp(k, "--count")) count = strtoull(v, NULL, 10);
        else if (!strcmp(k, "--rate")) rate = strtod(v, NULL);
        else if (!strcmp(k, "--wait-readers")) wait_readers = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(k, "--fill")) fill = strcmp(v, "none") != 0;
        else if (!strcmp(k, "--on-full")) retry = !strcmp(v, "retry");
        else {
            fprintf(stderr, "unknown option %s\n", k);
            return 2;
        }
    }
    if (frame_size < 8) frame_size = 8;
    if (cfg.slot_size == 0) cfg.slot_size = frame_size;
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);

    ezr_writer *w;
    int rc = ezr_create(&w, &cfg);
    if (rc < 0) {
        fprintf(stderr, "ezr_create(%s): %s\n", cfg.name, strerror(-rc));
        return 1;
    }
    printf("ready %s\n", ezr_path(w));
    fflush(stdout);

    if (wait_readers) {
        uint64_t deadline = ezr_now_ns() + 10000000000ull;
        int waited = -EINTR;
        while (!stop && waited == -EINTR && ezr_now_ns() < deadline)
            waited = ezr_wait_readers(w, wait_readers, (uint32_t)((deadline - ezr_now_ns()) / 1000000));
        if (waited < 0 && !stop)
            fprintf(stderr, "fewer than %u readers after 10 s: publishing anyway\n", wait_readers);
    }

    uint64_t period = rate > 0 ? (uint64_t)(1e9 / rate) : 0, next = ezr_now_ns();
    uint64_t shape[1] = {frame_size};
    for (uint64_t n = 0; n < count && !stop; n++) {
        if (period) {
            sleep_until(next);
            next += period;
        }
        unsigned char *p = (unsigned char *)ezr_loan(w, frame_size);
        while (!p && retry && !stop) { /* benchmark mode: wait 20 us, try the frame again */
            sleep_until(ezr_now_ns() + 20000);
            p = (unsigned char *)ezr_loan(w, frame_size);
        }
        if (!p) continue; /* every slot held by a lossless reader: dropped and counted */
        if (fill) memset(p + 8, (int)(n & 0xff), frame_size - 8);
        memcpy(p, &n, 8);
        rc = ezr_commit(w, frame_size, "|u1", 1, shape, 0);
        if (rc < 0) {
            fprintf(stderr, "ezr_commit: %s\n", strerror(-rc));
            break;
        }
    }
    ezr_stats st = ezr_get_stats(w);
    printf("{\"published\": %llu, \"dropped_full\": %llu, \"readers_live\": %u, "
           "\"readers_reclaimed\": %llu}\n",
           (unsigned long long)st.published, (unsigned long long)st.dropped_full, st.readers_live,
           (unsigned long long)st.readers_reclaimed);
    fflush(stdout);
    rc = ezr_close(w);
    return rc < 0 ? 1 : 0;
}
