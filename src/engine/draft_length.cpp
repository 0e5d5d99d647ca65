#include "draft_length.h"

#include <algorithm>

namespace kvrun {

namespace {
constexpr double kKeep = 0.8; // weight of the past in the running averages
constexpr int kMaxPause = 64, kRecheck = 64;
double average(double past, double now) {
    return past < 0 ? now : kKeep * past + (1 - kKeep) * now;
}
} // namespace

DraftLength::DraftLength(int min, int max, bool timed)
    : min_(min), max_(max), timed_(timed), length_(std::min(max, std::max(min, 5))) {}

int DraftLength::next(int limit) {
    if (timed_) {
        // Know what a plain step costs before weighing rounds against it.
        if (step_s_ < 0 || rounds_since_step_ >= kRecheck) return 0;
        if (pause_left_ > 0) {
            pause_left_--;
            return 0;
        }
    }
    const int n = std::min(length_, limit);
    return n >= min_ ? n : 0;
}

void DraftLength::after_empty_draft(double seconds) {
    if (timed_ && step_s_ > 0) judge(1, seconds + step_s_);
}

void DraftLength::after_round(int drafted, int accepted, double seconds) {
    length_ = accepted == drafted ? std::min(length_ + 2, max_) : std::max(length_ - 1, min_);
    if (timed_) judge(accepted + 1, seconds);
}

void DraftLength::judge(int tokens, double seconds) {
    rounds_since_step_++;
    const bool first = round_s_ == 0;
    round_tokens_ = first ? tokens : kKeep * round_tokens_ + (1 - kKeep) * tokens;
    round_s_ = first ? seconds : kKeep * round_s_ + (1 - kKeep) * seconds;
    if (step_s_ <= 0) return;
    if (round_tokens_ / round_s_ < 1 / step_s_) {
        // Drafting loses here: plain steps for a while, longer each time.
        pause_left_ = pause_;
        pause_ = std::min(pause_ * 2, kMaxPause);
        round_tokens_ = round_s_ = 0; // the next probe is judged on its own
    } else {
        pause_ = 4;
    }
}

void DraftLength::after_plain_step(double seconds) {
    step_s_ = average(step_s_, seconds);
    rounds_since_step_ = 0;
}

} // namespace kvrun
