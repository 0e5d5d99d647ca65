// Where a match of a grammar stands after some bytes: the set of parse
// stacks those bytes leave alive (several when the grammar is ambiguous so
// far), each a chain of return positions ending in the byte set to match
// next. Stacks are persistent: nodes in an arena, a step adds nodes and
// never changes one, so a walk over many tokens from one state shares their
// common prefixes and takes a rejected branch back by rewinding the arena.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "grammar.h"

namespace kvrun {

class GrammarMatcher {
  public:
    explicit GrammarMatcher(std::shared_ptr<const Grammar> g);
    void reset(); // back to the start of the root rule

    const Grammar& grammar() const { return *g_; }
    bool accepting() const { return accepting_; }        // the bytes so far are a whole sentence
    bool can_continue() const { return !tops_.empty(); } // some byte may follow
    // Takes the bytes if the grammar allows them after the bytes so far
    // (as a prefix of a sentence); otherwise leaves the state as it was.
    bool advance(std::string_view bytes);
    bool allows(std::string_view bytes) const;
    // The whole of `text`, from the start: a full-text recogniser.
    static bool matches(std::shared_ptr<const Grammar> g, std::string_view text);

    // For a walk over many byte strings from this state (token_mask.cpp).
    // step() writes the stacks one byte takes `from` to into `to` and
    // returns whether one of them is complete. The arena only grows during a
    // walk; mark() and rewind() take back what a branch added.
    std::span<const int32_t> tops() const { return tops_; }
    bool step(std::span<const int32_t> from, uint8_t b, std::vector<int32_t>& to) const;
    size_t mark() const { return arena_.size(); }
    void begin_walk() const { walked_ = 0; } // a mask's walk has a budget of its own
    void rewind(size_t m) const { arena_.resize(m); }

  private:
    struct Node {
        uint32_t pos;   // into code: the byte set to match, or (below the top) where to return
        int32_t parent; // -1: the bottom
        uint64_t hash;  // of the whole stack from here down: equal stacks, equal hashes
    };
    // Expands (pos, parent) until every stack's top is a byte set.
    bool expand(uint32_t pos, int32_t parent, std::vector<int32_t>& to) const;
    int32_t push(uint32_t pos, int32_t parent) const;
    void dedupe(std::vector<int32_t>& tops) const;
    bool same_stack(int32_t a, int32_t b) const;
    void compact();

    std::shared_ptr<const Grammar> g_;
    mutable std::vector<Node> arena_;
    mutable std::vector<std::pair<uint32_t, int32_t>> work_; // expand()'s worklist
    mutable size_t expanded_ = 0;                            // expansions in this step (bounded)
    mutable size_t walked_ = 0; // since the last advance(): every check and mask (bounded)
    std::vector<int32_t> tops_;
    bool accepting_ = false;
    size_t compacted_ = 0; // arena size after the last compact()
    mutable std::vector<int32_t> scratch_[2];
};

// More live stacks than this after one byte, or more expansion work for one
// byte, and a
// match stops with Error(Exit::usage, "grammar: too ambiguous ..."): a
// grammar that is ambiguous without bound may not stall a run or a server.
inline constexpr size_t kMaxGrammarStacks = 4096;
inline constexpr size_t kMaxGrammarExpansion = size_t{1} << 18;
// And all the expansion one token's checks and mask may take (a JSON grammar
// over a 262k vocabulary takes a few million).
inline constexpr size_t kMaxGrammarWalk = size_t{1} << 27;

} // namespace kvrun
