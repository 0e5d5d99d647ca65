// Where a token's time goes, per kind of operation of the forward pass
// (`kvrun bench --profile`): wall time on the calling thread, calls, and the
// bytes each op reads from memory (its weight matrix, or the KV slots that
// attention reads). Each op is timed around its backend call, so the figures
// mean something only where a call has finished its work when it returns: the
// CPU backend (a CUDA backend queues work and returns).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>

namespace kvrun {

enum class Op : uint8_t {
    attn_q,
    attn_k,
    attn_v,
    attn_output,
    ffn_gate,
    ffn_up,
    ffn_down,
    ffn_router,  // a mixture of experts' router (ffn_gate_inp)
    ffn_gate_up, // a generated token's experts' gate and up rows, one loop
    output,
    attention, // scores, softmax, weighted values, and the new K/V rows stored
    norms,     // RMSNorm before attention, before the FFN, before the output
    other,     // embedding row, RoPE, K/V conversion, biases, residual adds, SwiGLU
    count
};
// The weights' GGUF names (attn_q, ..., output) and attention, norms, other.
inline const char* op_name(Op op) {
    static constexpr const char* kNames[] = {
        "attn_q",       "attn_k",      "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
        "ffn_gate_inp", "ffn_gate_up", "output", "attention",   "norms",    "other"};
    static_assert(std::size(kNames) == static_cast<size_t>(Op::count));
    return op < Op::count ? kNames[static_cast<size_t>(op)] : "?";
}

struct OpProfile {
    struct Entry {
        double seconds = 0;
        double bytes = 0;
        uint64_t calls = 0;
    };
    std::array<Entry, static_cast<size_t>(Op::count)> ops{};

    Entry& operator[](Op op) { return ops[static_cast<size_t>(op)]; }
    const Entry& operator[](Op op) const { return ops[static_cast<size_t>(op)]; }
};

// Adds the time from construction to destruction, one call and `bytes` to
// op's entry of `profile`; does nothing (no clock read) when it is null.
class OpTimer {
  public:
    OpTimer(OpProfile* profile, Op op, double bytes = 0)
        : profile_(profile), op_(op), bytes_(bytes) {
        if (profile_) t0_ = Clock::now();
    }
    ~OpTimer() {
        if (!profile_) return;
        OpProfile::Entry& e = (*profile_)[op_];
        e.seconds += std::chrono::duration<double>(Clock::now() - t0_).count();
        e.bytes += bytes_;
        e.calls++;
    }
    OpTimer(const OpTimer&) = delete;
    OpTimer& operator=(const OpTimer&) = delete;

  private:
    using Clock = std::chrono::steady_clock;
    OpProfile* profile_;
    Op op_;
    double bytes_;
    Clock::time_point t0_{};
};

} // namespace kvrun
