// cpp_writer.cpp - the C++ wrapper in use: publishes N frames of float32 [rows, cols].
// Usage: cpp_writer NAME COUNT   (rows=4, cols=8; element k of frame n is n*1000 + k)
#define EZFLOW_RING_IMPLEMENTATION
#include "ezflow_ring.hpp"

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s NAME COUNT\n", argv[0]);
        return 2;
    }
    const uint64_t rows = 4, cols = 8, n = rows * cols;
    ezflow::RingWriter ring(ezflow::RingWriter::config(argv[1], "/cpp", 8, n * sizeof(float)));
    std::printf("ready %s\n", ring.path().c_str());
    std::fflush(stdout);
    uint64_t deadline = ezr_now_ns() + 10000000000ull;
    while (ring.stats().readers_live < 1 && ezr_now_ns() < deadline) {
    }
    long count = std::atol(argv[2]);
    for (long f = 0; f < count; f++) {
        auto* p = static_cast<float*>(ring.loan(n * sizeof(float)));
        if (!p) continue;
        for (uint64_t k = 0; k < n; k++) p[k] = static_cast<float>(f * 1000 + static_cast<long>(k));
        ring.commit(n * sizeof(float), "<f4", {rows, cols});
    }
    ring.close();
    return 0;
}
