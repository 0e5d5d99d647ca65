// One answer's text, token by token: what ends it (end tokens, stop
// strings), the streaming UTF-8 decoder, the stop matcher that holds back
// text that may begin a stop string, and the answer's tokens without those
// that spell a matched one. Session::generate drives one; the scheduler
// (kvrun batch) one per sequence, so both end answers the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "session.h"
#include "stop_sequences.h"
#include "tokenizer.h"

namespace kvrun {

// NaN or Inf weights reach the logits; sampled, they would print garbage
// (or nothing) and end "successfully": Error(bad_model) instead.
void check_finite_logits(const float* logits, int n_vocab);

class Answer {
  public:
    // Keeps references to tok and p.
    Answer(const Tokenizer& tok, const GenerateParams& p);

    enum class Took {
        token,       // part of the answer; `text` is what it releases
        end_token,   // an end-of-generation or end id (without ignore_eos): not part of it
        stop_string, // part of it, and a stop string is complete: the tokens spelling it dropped
    };
    Took take(int32_t id, std::string& text);
    // The answer ended (for any reason): the text still held back, none
    // after a stop string (result().matched says which).
    std::string finish();
    GenerateResult& result() { return r_; }

  private:
    const Tokenizer& tok_;
    const GenerateParams& p_;
    Tokenizer::Decoder dec_;
    StopMatcher matcher_;
    std::vector<size_t> starts_; // byte offset in the decoded answer where each token begins
    size_t decoded_ = 0;
    GenerateResult r_;
};

} // namespace kvrun
