// Prompt lookup: draft tokens copied from the context. For each sequence an index maps every
// n-gram (n = 1..kLookupMaxN) of its committed tokens to where its most recent occurrence
// ended; a proposal is the continuation of the longest suffix of the sequence that occurred
// before. No torch headers.
//
// The index is a direct-mapped table of `capacity` (a power of two) entries per sequence,
// each the full 64-bit hash of an n-gram and the position after it: bounded memory, O(1) per
// committed token (one entry per n), and a newer n-gram evicts an older one with the same slot.
// An n-gram is indexed only once the token after it is committed, so the suffix of the sequence
// itself is never its own match.
#pragma once

#include <cstdint>

namespace specdec {

constexpr int kLookupMaxN = 8;

struct LookupTable {
  uint64_t* keys;   // [capacity]; 0 = empty
  int64_t* next;    // [capacity]: position of the token after the n-gram
  int64_t capacity; // a power of two
};

// Hash of the n tokens ending at tokens[end - 1], never 0.
inline uint64_t ngram_key(const int64_t* tokens, int64_t end, int n) {
  uint64_t h = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(n + 1);
  for (int i = end - n; i < end; ++i) {
    h ^= static_cast<uint64_t>(tokens[i]) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xBF58476D1CE4E5B9ull;
  }
  h ^= h >> 31;
  return h | 1;
}

// Index the n-grams (n <= max_n) ending just before each newly committed token: tokens[from..to)
// are new, tokens[0..from) were indexed by earlier calls.
inline void lookup_add(const LookupTable& t, const int64_t* tokens, int64_t from, int64_t to, int max_n) {
  for (int64_t end = from > 0 ? from : 1; end < to; ++end)  // the n-grams ending at tokens[end - 1]
    for (int n = 1; n <= max_n && n <= end; ++n) {
      const uint64_t key = ngram_key(tokens, end, n);
      const int64_t slot = static_cast<int64_t>(key & static_cast<uint64_t>(t.capacity - 1));
      t.keys[slot] = key;
      t.next[slot] = end;
    }
}

// Up to k tokens continuing the longest suffix (n from max_n down to min_n) of tokens[0..length)
// seen before in `source[0..source_length)`, the sequence the table indexes (the sequence itself,
// or a corpus); writes them to out and returns how many (0: no match), and the suffix length
// matched to *matched.
inline int64_t lookup_propose(const LookupTable& t, const int64_t* tokens, int64_t length, const int64_t* source,
                              int64_t source_length, int min_n, int max_n, int64_t k, int64_t* out, int64_t* matched) {
  *matched = 0;
  for (int n = max_n < length ? max_n : static_cast<int>(length); n >= min_n && n >= 1; --n) {
    const uint64_t key = ngram_key(tokens, length, n);
    const int64_t slot = static_cast<int64_t>(key & static_cast<uint64_t>(t.capacity - 1));
    if (t.keys[slot] != key) continue;
    const int64_t start = t.next[slot];
    int64_t count = 0;
    for (; count < k && start + count < source_length; ++count) out[count] = source[start + count];
    *matched = n;
    return count;
  }
  return 0;
}

}  // namespace specdec
