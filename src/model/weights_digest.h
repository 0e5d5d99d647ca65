// A digest of a model's weights, for the files that must not be reused with
// other weights (prompt caches, chat saves): the header alone does not tell a
// fine-tune with identical metadata, or a file fixed in place, from the
// original.
//
// Every tensor's bytes are hashed (a fast, non-cryptographic 64-bit hash: it
// tells files apart, it does not authenticate them). So that a 4 GB model does
// not pay a full read on every run, the result is remembered per file
// identity (device, inode, size, mtime and ctime in ns: a file replaced or
// modified in place has another identity) in a small memo file,
// $XDG_CACHE_HOME/kvrun/weights-digests (default ~/.cache/kvrun); a file
// changed less than a second before it was opened is not remembered, since
// a second change within the timestamps' granularity would keep its
// identity. When that
// file cannot be read or written the digest is computed every time: slower,
// never wrong. A sampled hash would be cheaper without a memo but would miss
// an edit to one tensor, which is exactly the stale-cache case.
#pragma once

#include <cstdint>
#include <string>

#include "gguf.h"

namespace kvrun {

// The digest of f's tensor data (names, sizes and bytes, in file order).
uint64_t hash_weights(const GgufFile& f);

// hash_weights, through the memo when f is a file with a known identity.
uint64_t weights_digest(const GgufFile& f);

// Where the memo lives ("" when neither XDG_CACHE_HOME nor HOME is set).
std::string weights_memo_path();

} // namespace kvrun
