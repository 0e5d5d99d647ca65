#include "matcher.h"

#include <algorithm>
#include <unordered_map>

#include "error.h"

namespace kvrun {

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> g) : g_(std::move(g)) {
    reset();
}

void GrammarMatcher::reset() {
    arena_.clear();
    compacted_ = 0;
    tops_.clear();
    accepting_ = false;
    expanded_ = 0;
    walked_ = 0;
    for (uint32_t start : g_->alts[g_->root]) accepting_ |= expand(start, -1, tops_);
    dedupe(tops_);
}

namespace {
uint64_t stack_hash(uint32_t pos, uint64_t below) {
    uint64_t h = (below ^ pos) * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
}
} // namespace

int32_t GrammarMatcher::push(uint32_t pos, int32_t parent) const {
    arena_.push_back({pos, parent, stack_hash(pos, parent < 0 ? 0 : arena_[parent].hash)});
    return static_cast<int32_t>(arena_.size() - 1);
}

bool GrammarMatcher::expand(uint32_t pos, int32_t parent, std::vector<int32_t>& to) const {
    const std::vector<Grammar::Elem>& code = g_->code;
    bool complete = false;
    work_.clear();
    work_.emplace_back(pos, parent);
    while (!work_.empty()) {
        if (++expanded_ > kMaxGrammarExpansion)
            fail(Exit::usage, "grammar: too ambiguous (over {} expansions for one byte)",
                 kMaxGrammarExpansion);
        if (++walked_ > kMaxGrammarWalk)
            fail(Exit::usage, "grammar: too ambiguous (over {} expansions for one token)",
                 kMaxGrammarWalk);
        auto [p, par] = work_.back();
        work_.pop_back();
        const Grammar::Elem e = code[p];
        switch (e.op) {
        case Grammar::Op::bytes:
            to.push_back(push(p, par));
            break;
        case Grammar::Op::end: // the rule is done: go on where it was referenced
            if (par < 0)
                complete = true;
            else
                work_.emplace_back(arena_[par].pos, arena_[par].parent);
            break;
        case Grammar::Op::rule: {
            // A reference last in its alternative returns straight to the
            // caller's caller (a tail call): x* as R ::= x R does not grow
            // the stack with each repetition.
            const int32_t ret = code[p + 1].op == Grammar::Op::end ? par : push(p + 1, par);
            const std::vector<uint32_t>& alts = g_->alts[e.arg];
            for (auto it = alts.rbegin(); it != alts.rend(); ++it) work_.emplace_back(*it, ret);
            break;
        }
        }
    }
    return complete;
}

bool GrammarMatcher::same_stack(int32_t a, int32_t b) const {
    while (a != b) {
        if (a < 0 || b < 0 || arena_[a].pos != arena_[b].pos || arena_[a].hash != arena_[b].hash)
            return false;
        a = arena_[a].parent;
        b = arena_[b].parent;
    }
    return true;
}

// Stacks reached two ways (an ambiguity that has closed again) are kept once,
// or their number would double with each such choice. Sorted by hash, only
// equal hashes are compared node by node.
void GrammarMatcher::dedupe(std::vector<int32_t>& tops) const {
    if (tops.size() > 1) {
        std::sort(tops.begin(), tops.end(), [&](int32_t a, int32_t b) {
            return arena_[a].hash != arena_[b].hash ? arena_[a].hash < arena_[b].hash : a < b;
        });
        size_t kept = 0;
        for (size_t i = 0; i < tops.size(); i++) {
            bool dup = false;
            for (size_t j = kept; j-- > 0 && arena_[tops[j]].hash == arena_[tops[i]].hash;)
                if (same_stack(tops[j], tops[i])) {
                    dup = true;
                    break;
                }
            if (!dup) tops[kept++] = tops[i];
        }
        tops.resize(kept);
    }
    if (tops.size() > kMaxGrammarStacks)
        fail(Exit::usage, "grammar: too ambiguous (over {} parse stacks at once)",
             kMaxGrammarStacks);
}

bool GrammarMatcher::step(std::span<const int32_t> from, uint8_t b,
                          std::vector<int32_t>& to) const {
    to.clear();
    expanded_ = 0;
    bool complete = false;
    for (int32_t t : from) {
        const Node n = arena_[t];
        if (g_->sets[g_->code[n.pos].arg].has(b)) complete |= expand(n.pos + 1, n.parent, to);
    }
    dedupe(to);
    return complete;
}

bool GrammarMatcher::allows(std::string_view bytes) const {
    const size_t m = mark();
    std::span<const int32_t> cur = tops_;
    bool complete = accepting_, ok = true;
    int k = 0;
    for (char c : bytes) {
        if (cur.empty()) {
            ok = false;
            break;
        }
        complete = step(cur, static_cast<uint8_t>(c), scratch_[k]);
        cur = scratch_[k];
        k ^= 1;
    }
    rewind(m);
    return ok && (!cur.empty() || complete);
}

bool GrammarMatcher::advance(std::string_view bytes) {
    const size_t m = mark();
    std::vector<int32_t> cur(tops_.begin(), tops_.end()), next;
    bool complete = accepting_;
    for (char c : bytes) {
        if (cur.empty()) {
            rewind(m);
            return false;
        }
        complete = step(cur, static_cast<uint8_t>(c), next);
        std::swap(cur, next);
    }
    if (cur.empty() && !complete) {
        rewind(m);
        return false;
    }
    tops_ = std::move(cur);
    accepting_ = complete;
    walked_ = 0; // a new token's checks and mask begin
    if (arena_.size() > 2 * compacted_ + 4096) compact();
    return true;
}

// Copies the nodes the live stacks use into a fresh arena (iteratively:
// a stack may be thousands of nodes deep).
void GrammarMatcher::compact() {
    std::vector<Node> fresh;
    std::unordered_map<int32_t, int32_t> moved;
    std::vector<int32_t> chain;
    for (int32_t& t : tops_) {
        chain.clear();
        for (int32_t id = t; id >= 0 && !moved.count(id); id = arena_[id].parent)
            chain.push_back(id);
        for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
            const int32_t old_parent = arena_[*it].parent;
            fresh.push_back(
                {arena_[*it].pos, old_parent < 0 ? -1 : moved.at(old_parent), arena_[*it].hash});
            moved.emplace(*it, static_cast<int32_t>(fresh.size() - 1));
        }
        t = moved.at(t);
    }
    arena_ = std::move(fresh);
    compacted_ = arena_.size();
}

bool GrammarMatcher::matches(std::shared_ptr<const Grammar> g, std::string_view text) {
    GrammarMatcher m(std::move(g));
    if (text.empty()) return m.accepting();
    return m.advance(text) && m.accepting();
}

} // namespace kvrun
