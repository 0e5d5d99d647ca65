// Unicode helpers for the tokenizer: UTF-8 decoding that never throws,
// code point classes (letters, numbers, white space) from libutf8proc, the
// GPT-2 byte <-> printable-character table, and the BPE pre-tokenizers: the
// split regexes of the common GGUF `tokenizer.ggml.pre` values written out by
// hand over code points (no regex engine: the patterns need \p{L}/\p{N} and a
// lookahead, and a hand-written scanner is linear and easy to test).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvrun::unicode {

// Sentinel returned for a byte that does not start a well-formed UTF-8
// sequence (overlong, surrogate, > U+10FFFF, truncated or stray continuation).
// It is outside the code point range, so it never classifies as a letter etc.
inline constexpr uint32_t invalid_cp = 0xFFFFFFFFu;

// Decodes the code point starting at s[i] and advances i past it. An invalid
// sequence yields invalid_cp and advances exactly one byte, so the caller can
// keep the raw byte.
uint32_t next_cp(std::string_view s, size_t& i);

// Length of the well-formed UTF-8 sequence at s[i], 0 when it is invalid, or
// -1 when s ends before the sequence does but every byte so far is allowed.
// On 0, *bad_len gets the length of the maximal ill-formed subpart (what one
// U+FFFD replaces, per the Unicode recommendation): at least 1.
int valid_seq_len(std::string_view s, size_t i, size_t* bad_len = nullptr);

void append_utf8(std::string& out, uint32_t cp);

bool is_letter(uint32_t cp);       // \p{L}
bool is_number(uint32_t cp);       // \p{N}
bool is_whitespace(uint32_t cp);   // \s: the Unicode White_Space property
bool is_mark(uint32_t cp);         // \p{M}: Mn, Mc, Me
bool is_cased_letter(uint32_t cp); // Lu, Ll, Lt

// GPT-2 byte-level encoding: every byte maps to one printable code point.
uint32_t byte_to_cp(uint8_t b);
// The byte a code point stands for, or -1 when it is not in the table.
int cp_to_byte(uint32_t cp);
// Appends the byte-level encoding (UTF-8 of byte_to_cp) of every byte.
void byte_encode(std::string_view bytes, std::string& out);
// Inverse of byte_encode; code points outside the table are kept as UTF-8.
std::string byte_decode(std::string_view text);

enum class PreSplit { gpt2, llama3, qwen2, qwen35, smollm, deepseek_llm, gpt4o };
// The splitter for a `tokenizer.ggml.pre` value, nullopt when unknown.
std::optional<PreSplit> pre_split_from_name(std::string_view name);
// Splits text into the pieces BPE merges within; the pieces are consecutive
// views of `text` that cover it exactly (invalid bytes included).
std::vector<std::string_view> pre_split(PreSplit kind, std::string_view text);

// Valid UTF-8? On failure *bad_at is the offset of the first bad byte.
bool valid_utf8(std::string_view s, size_t* bad_at = nullptr);

} // namespace kvrun::unicode

namespace kvrun {
// Text from the user that must be UTF-8 (a system prompt): Error(Exit::usage)
// "WHAT is not valid UTF-8 (bad byte at offset N)" otherwise.
void check_utf8(std::string_view text, const char* what);
} // namespace kvrun
