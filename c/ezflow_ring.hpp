// ezflow_ring.hpp - a thin C++17 RAII wrapper over ezflow_ring.h (ezring v1 writer).
//
// Define EZFLOW_RING_IMPLEMENTATION in exactly one translation unit before including
// this header (or ezflow_ring.h). Errors from construction throw std::system_error
// carrying the errno; loan() returns nullptr when every slot is held (a counted drop).
//
//     ezflow::RingWriter ring(ezflow::RingWriter::config("cam0", "/cam0", 16, 1100000));
//     if (void* p = ring.loan(n)) { fill(p); ring.commit(n, "|u1", {n}); }
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "ezflow_ring.h"

namespace ezflow {

class RingWriter {
public:
    static ezr_config config(const char* name, const char* topic, uint32_t slot_count,
                             uint64_t slot_size, uint32_t max_readers = 16) {
        ezr_config c = ezr_config_default(name);
        c.topic = topic;
        c.slot_count = slot_count;
        c.slot_size = slot_size;
        c.max_readers = max_readers;
        return c;
    }

    explicit RingWriter(const ezr_config& cfg) {
        int rc = ezr_create(&w_, &cfg);
        if (rc < 0) throw std::system_error(-rc, std::generic_category(), "ezr_create");
    }
    RingWriter(const RingWriter&) = delete;
    RingWriter& operator=(const RingWriter&) = delete;
    RingWriter(RingWriter&& other) noexcept : w_(std::exchange(other.w_, nullptr)) {}
    RingWriter& operator=(RingWriter&& other) noexcept {
        if (this != &other) {
            reset();
            w_ = std::exchange(other.w_, nullptr);
        }
        return *this;
    }
    ~RingWriter() { reset(); }

    // Pointer into the next free slot, or nullptr (every slot held: dropped and counted).
    void* loan(uint64_t nbytes) noexcept { return ezr_loan(w_, nbytes); }

    // Publish the loaned slot and wake readers; never blocks. Returns 0 or -errno.
    int commit(uint64_t nbytes, const char* typestr, std::initializer_list<uint64_t> shape,
               uint64_t t_ns = 0) noexcept {
        std::vector<uint64_t> dims(shape);
        return ezr_commit(w_, nbytes, typestr, static_cast<uint32_t>(dims.size()), dims.data(),
                          t_ns);
    }
    int commit(uint64_t nbytes, const char* typestr, uint32_t ndim, const uint64_t* shape,
               uint64_t t_ns = 0, const void* meta = nullptr, uint32_t meta_len = 0) noexcept {
        return ezr_commit_meta(w_, nbytes, typestr, ndim, shape, t_ns, meta, meta_len);
    }

    ezr_stats stats() const noexcept { return ezr_get_stats(w_); }
    // Wait up to timeout_ms for `readers` registered readers: 0, -ETIMEDOUT, or -EINTR
    // when a signal handler ran (frames committed before any reader are read by nobody).
    int wait_readers(uint32_t readers, uint32_t timeout_ms) noexcept {
        return ezr_wait_readers(w_, readers, timeout_ms);
    }
    std::string path() const { return w_ ? std::string(ezr_path(w_)) : std::string(); }

    // Close now (CLOSED, wake readers, unlink); the destructor does it otherwise.
    void close() {
        int rc = reset();
        if (rc < 0) throw std::system_error(-rc, std::generic_category(), "ezr_close");
    }

private:
    int reset() noexcept { return w_ ? ezr_close(std::exchange(w_, nullptr)) : 0; }
    ezr_writer* w_ = nullptr;
};

}  // namespace ezflow
