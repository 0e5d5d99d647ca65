#include "stop_sequences.h"

#include <algorithm>

namespace kvrun {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
    for (std::string& s : stops)
        if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopMatcher::push(std::string_view text) {
    if (stopped()) return {};
    held_.append(text);
    // The earliest complete match wins, whichever string it is.
    size_t at = std::string::npos;
    for (const std::string& s : stops_) {
        const size_t p = held_.find(s);
        if (p < at) at = p, matched_ = s;
    }
    if (at != std::string::npos) {
        std::string out = held_.substr(0, at);
        held_.clear();
        released_ += out.size();
        return out;
    }
    // Hold back the longest tail that is a proper prefix of some stop string.
    // (A tail starting inside a UTF-8 character cannot equal the start of a
    // valid UTF-8 string, so what is released stays whole characters.)
    size_t keep = 0;
    for (const std::string& s : stops_)
        for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; n--)
            if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
                keep = n;
                break;
            }
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    released_ += out.size();
    return out;
}

std::string StopMatcher::flush() {
    std::string out;
    out.swap(held_);
    released_ += out.size();
    return out;
}

} // namespace kvrun
