#include "constraint.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "error.h"
#include "tokenizer.h"

namespace kvrun {

TokenBytes::TokenBytes(const Tokenizer& tok) {
    const int32_t n = tok.n_vocab();
    offsets_.reserve(n + 1);
    offsets_.push_back(0);
    eog_.resize(n);
    for (int32_t id = 0; id < n; id++) {
        text_ += tok.piece(id);
        offsets_.push_back(static_cast<uint32_t>(text_.size()));
        eog_[id] = tok.is_eog(id);
        if (!bytes(id).empty()) order_.push_back(id);
    }
    std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
        const std::string_view x = bytes(a), y = bytes(b);
        return x != y ? x < y : a < b;
    });
    lcp_.resize(order_.size());
    for (size_t k = 1; k < order_.size(); k++) {
        const std::string_view x = bytes(order_[k - 1]), y = bytes(order_[k]);
        uint32_t l = 0;
        while (l < x.size() && l < y.size() && x[l] == y[l]) l++;
        lcp_[k] = l;
    }
}

GrammarConstraint::GrammarConstraint(std::shared_ptr<const OutputGrammar> g)
    : g_(std::move(g)), m_(g_->grammar) {}

void GrammarConstraint::reset() {
    m_.reset();
    first_ = true;
}

bool GrammarConstraint::is_end(int32_t id) const {
    return g_->vocab->end_of_generation(id) ||
           std::find(g_->end_ids.begin(), g_->end_ids.end(), id) != g_->end_ids.end();
}

std::string_view GrammarConstraint::bytes(int32_t id) const {
    std::string_view b = g_->vocab->bytes(id);
    if (first_ && g_->strip_first_space && !b.empty() && b[0] == ' ') b.remove_prefix(1);
    return b;
}

bool GrammarConstraint::allows(int32_t id) const {
    if (id < 0 || id >= g_->vocab->n_vocab()) return false;
    if (is_end(id)) return m_.accepting();
    const std::string_view b = bytes(id);
    return !b.empty() && m_.allows(b);
}

void GrammarConstraint::accept(int32_t id) {
    if (is_end(id)) return; // the answer ends here
    const bool took = m_.advance(bytes(id));
    KV_ASSERT(took);
    first_ = false;
}

int32_t GrammarConstraint::mask(float* logits) const {
    const TokenBytes& v = *g_->vocab;
    const int32_t n = v.n_vocab();
    constexpr float kBanned = -std::numeric_limits<float>::infinity();
    std::vector<char> ok(n, 0);
    int32_t allowed = 0;
    if (first_ && g_->strip_first_space) { // once per answer: token by token
        for (int32_t id = 0; id < n; id++) allowed += ok[id] = allows(id);
    } else {
        for (int32_t id = 0; id < n; id++)
            if (is_end(id)) allowed += ok[id] = m_.accepting();
        const std::span<const int32_t> order = v.order();
        const std::span<const uint32_t> lcp = v.lcp();
        // levels_[d]: the stacks after the first d bytes of the current
        // token, valid for d <= valid; the next token reuses what it shares.
        if (levels_.empty()) levels_.resize(1), complete_at_.resize(1), marks_.resize(1);
        m_.begin_walk();
        levels_[0].assign(m_.tops().begin(), m_.tops().end());
        complete_at_[0] = m_.accepting();
        marks_[0] = m_.mark();
        size_t valid = 0;
        // What the token shares with the last one walked: lcp[k] is with
        // the one before it, so over end tokens skipped, the least of them.
        uint32_t shared = 0;
        for (size_t k = 0; k < order.size(); k++) {
            const int32_t id = order[k];
            shared = k == 0 ? 0 : std::min(shared, lcp[k]);
            if (is_end(id)) continue;
            const std::string_view b = v.bytes(id);
            size_t d = std::min<size_t>(shared, valid);
            shared = std::numeric_limits<uint32_t>::max();
            m_.rewind(marks_[d]);
            if (levels_.size() < b.size() + 1) {
                levels_.resize(b.size() + 1);
                complete_at_.resize(b.size() + 1);
                marks_.resize(b.size() + 1);
            }
            while (d < b.size() && !levels_[d].empty()) {
                complete_at_[d + 1] =
                    m_.step(levels_[d], static_cast<uint8_t>(b[d]), levels_[d + 1]);
                marks_[d + 1] = m_.mark();
                d++;
            }
            valid = d;
            if (d == b.size()) {
                allowed += ok[id] = !levels_[d].empty() || complete_at_[d];
                continue;
            }
            // No stack survives the first d bytes: nor does any token after
            // this one that begins with them.
            while (k + 1 < order.size() && lcp[k + 1] >= d) k++;
        }
        m_.rewind(marks_[0]);
    }
    for (int32_t id = 0; id < n; id++)
        if (!ok[id]) logits[id] = kBanned;
    return allowed;
}

} // namespace kvrun
