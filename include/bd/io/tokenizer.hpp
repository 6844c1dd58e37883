// bd/io/tokenizer.hpp — the byte-pair tokenizer of llama2.c's models (tokenizer.bin, tok512.bin),
// encoding and decoding as llama2.c's run.c does, so that ids agree with the models' own.
//
// File: int32 max_token_length, then per token (vocab_size of them, from the model's config):
// float32 merge score, int32 byte length, the bytes. Ids 0, 1, 2 are <unk>, BOS, EOS; ids 3 … 258
// are the byte tokens <0x00> … <0xFF>.
//
// encode: BOS, then (for a non-empty text) the token of " " (llama2.c's dummy prefix), then one
// token per UTF-8 code point where the vocabulary has it, else its bytes (byte fallback, id =
// byte + 3); then, repeatedly, the adjacent pair whose concatenation is in the vocabulary with the
// highest score (the leftmost among equals) is merged, until no pair merges.
// decode: a token's bytes; a byte token gives its byte; after BOS a leading space is dropped.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <unordered_map>
#include <vector>

#include "bd/base/error.hpp"

namespace bd::io {

class Tokenizer {
public:
  static constexpr int unk = 0, bos = 1, eos = 2;

  /// Reads llama2.c's tokenizer file for a vocabulary of `vocab_size` tokens (the model's
  /// config.json: vocab_size). A missing, truncated or longer file, or a token length outside
  /// 0 … max_token_length, is refused with the file and the token named.
  static Tokenizer read(const std::string& path, int vocab_size) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw IoError(bd::detail::message(path, ": cannot open the tokenizer"));
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return from_bytes(bytes, vocab_size, path);
  }

  static Tokenizer from_bytes(const std::string& bytes, int vocab_size, const std::string& name = "tokenizer") {
    if (vocab_size < 259)
      throw RangeError(bd::detail::message(name, ": vocab_size ", vocab_size, " is below 259 (<unk>, BOS, EOS and 256 bytes)"));
    std::size_t at = 0;
    auto take = [&](void* out, std::size_t n, const char* what, int token) {
      if (bytes.size() - at < n)
        throw FormatError(bd::detail::message(name, ": truncated at byte ", at, " reading ", what,
                                              token < 0 ? std::string() : " of token " + std::to_string(token)));
      std::memcpy(out, bytes.data() + at, n);
      at += n;
    };
    std::int32_t max_length = 0;
    take(&max_length, 4, "max_token_length", -1);
    if (max_length <= 0)
      throw FormatError(bd::detail::message(name, ": max_token_length is ", max_length, ", expected a positive length"));
    Tokenizer t;
    t.pieces_.resize(std::size_t(vocab_size));
    t.scores_.resize(std::size_t(vocab_size));
    for (int i = 0; i < vocab_size; ++i) {
      std::int32_t length = 0;
      take(&t.scores_[std::size_t(i)], 4, "the score", i);
      take(&length, 4, "the length", i);
      if (length < 0 || length > max_length)
        throw FormatError(bd::detail::message(name, ": token ", i, " has length ", length, ", expected 0 … ", max_length));
      t.pieces_[std::size_t(i)].resize(std::size_t(length));
      if (length) take(t.pieces_[std::size_t(i)].data(), std::size_t(length), "the bytes", i);
      t.ids_.emplace(t.pieces_[std::size_t(i)], i);  // the first of equal pieces, as a search of the sorted list finds one
    }
    if (at != bytes.size())
      throw FormatError(bd::detail::message(name, ": ", bytes.size() - at, " bytes after the ", vocab_size,
                                            " tokens: is vocab_size right?"));
    return t;
  }

  int size() const { return int(pieces_.size()); }
  const std::string& piece(int id) const { return pieces_.at(std::size_t(check(id))); }
  float score(int id) const { return scores_.at(std::size_t(check(id))); }

  /// Token ids of `text` (UTF-8), BOS first, EOS last when asked.
  std::vector<int> encode(const std::string& text, bool add_bos = true, bool add_eos = false) const {
    std::vector<int> ids;
    if (add_bos) ids.push_back(bos);
    if (!text.empty()) ids.push_back(id_of(" "));
    for (std::size_t i = 0; i < text.size();) {
      std::size_t j = i + 1;  // a code point: a leading byte and up to three continuation bytes
      while (j < text.size() && (static_cast<unsigned char>(text[j]) & 0xC0) == 0x80 && j - i < 4) ++j;
      const auto found = ids_.find(text.substr(i, j - i));
      if (found != ids_.end()) {
        ids.push_back(found->second);
      } else {
        for (std::size_t k = i; k < j; ++k) ids.push_back(static_cast<unsigned char>(text[k]) + 3);
      }
      i = j;
    }
    for (;;) {  // merge the best-scoring adjacent pair until none is in the vocabulary
      float best = -1e10f;
      std::size_t at = ids.size();
      int merged = -1;
      for (std::size_t k = 0; k + 1 < ids.size(); ++k) {
        const auto found = ids_.find(pieces_[std::size_t(ids[k])] + pieces_[std::size_t(ids[k + 1])]);
        if (found != ids_.end() && scores_[std::size_t(found->second)] > best) {
          best = scores_[std::size_t(found->second)];
          at = k;
          merged = found->second;
        }
      }
      if (merged < 0) break;
      ids[at] = merged;
      ids.erase(ids.begin() + std::ptrdiff_t(at) + 1);
    }
    if (add_eos) ids.push_back(eos);
    return ids;
  }

  /// The bytes of `id` following `previous` (a byte token gives its byte; after BOS a leading
  /// space is dropped).
  std::string decode(int previous, int id) const {
    const std::string& p = piece(id);
    if (p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>') {  // a byte token, <0xHH>
      const auto hex = [](char c) { return c >= 'A' ? (c & ~0x20) - 'A' + 10 : c - '0'; };
      return std::string(1, char(hex(p[3]) * 16 + hex(p[4])));
    }
    if (previous == bos && !p.empty() && p[0] == ' ') return p.substr(1);
    return p;
  }

  /// The text of a sequence of ids (BOS and EOS themselves give nothing).
  std::string decode(const std::vector<int>& ids) const {
    std::string out;
    int previous = -1;
    for (int id : ids) {
      if (id != bos && id != eos) out += decode(previous, id);
      previous = id;
    }
    return out;
  }

private:
  int check(int id) const {
    if (id < 0 || id >= size())
      throw RangeError(bd::detail::message("token id ", id, " is outside the vocabulary of ", size()));
    return id;
  }
  int id_of(const std::string& piece) const {
    const auto found = ids_.find(piece);
    if (found == ids_.end()) throw FormatError(bd::detail::message("the tokenizer has no token for '", piece, "'"));
    return found->second;
  }

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int> ids_;
};

}  // namespace bd::io
