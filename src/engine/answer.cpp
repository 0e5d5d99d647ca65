#include "answer.h"

#include <algorithm>
#include <cstring>

#include "error.h"

namespace kvrun {

void check_finite_logits(const float* logits, int n_vocab) {
    // Every exponent field short of all ones. Integer ops without an early
    // exit, so the compiler vectorizes it: this runs on every generated
    // token over the whole vocabulary (262k logits for Gemma 3).
    uint32_t bad = 0;
    for (int i = 0; i < n_vocab; i++) {
        uint32_t b;
        std::memcpy(&b, logits + i, sizeof b);
        bad |= static_cast<uint32_t>((b & 0x7f800000u) == 0x7f800000u);
    }
    if (bad != 0)
        fail(Exit::bad_model, "the model produced non-finite logits (NaN or Inf weights?)");
}

Answer::Answer(const Tokenizer& tok, const GenerateParams& p)
    : tok_(tok), p_(p), dec_(tok), matcher_(p.stop) {}

Answer::Took Answer::take(int32_t id, std::string& text) {
    text.clear();
    const bool ends = tok_.is_eog(id) ||
                      std::find(p_.end_ids.begin(), p_.end_ids.end(), id) != p_.end_ids.end();
    if (ends && !p_.ignore_eos) {
        r_.stop = "eos";
        return Took::end_token;
    }
    r_.tokens.push_back(id);
    starts_.push_back(decoded_);
    std::string piece = dec_.push(id);
    if (p_.strip_leading_space && r_.generated == 0 && !piece.empty() && piece[0] == ' ')
        piece.erase(0, 1);
    decoded_ += piece.size();
    r_.generated++;
    text = matcher_.push(piece);
    if (!matcher_.stopped()) return Took::token;
    // Forget the tokens that spell the stop string: what follows continues
    // from the text the user saw.
    while (!starts_.empty() && starts_.back() >= matcher_.released()) {
        starts_.pop_back();
        r_.tokens.pop_back();
    }
    r_.stop = "stop string";
    return Took::stop_string;
}

std::string Answer::finish() {
    if (matcher_.stopped()) {
        r_.matched = matcher_.matched();
        return {};
    }
    std::string text = matcher_.push(dec_.flush());
    return text + matcher_.flush();
}

} // namespace kvrun
