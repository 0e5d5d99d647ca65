// Stop sequences: strings that end generation when the model writes them.
// A stop string can be split across tokens ("\nUs" + "er:"), so text that
// might be the start of one is held back until it is clearly not; a matched
// stop string and anything after it are never printed.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvrun {

class StopMatcher {
  public:
    explicit StopMatcher(std::vector<std::string> stops); // empty strings are ignored

    // Feed newly decoded text; returns the text that is safe to print now.
    // After a match stopped() is true and push() returns "".
    std::string push(std::string_view text);
    // End of generation without a match: the held-back text.
    std::string flush();

    bool stopped() const { return !matched_.empty(); }
    const std::string& matched() const { return matched_; }
    // Bytes released by push()/flush() so far: where the reply text ends.
    size_t released() const { return released_; }

  private:
    std::vector<std::string> stops_;
    std::string held_;
    std::string matched_;
    size_t released_ = 0;
};

} // namespace kvrun
