// bd/train/corpus.hpp — a text as byte tokens for a byte-level language model: the last
// `held_out` share is validation, never trained on; training windows are drawn at random from
// the rest (seeded), validation windows evenly spaced over its part.
#pragma once

#include <cstdint>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "bd/base/error.hpp"

namespace bd::train {

class Corpus {
public:
  /// Splits `text` into training and validation bytes; refuses a text too short for one window
  /// of `window` tokens on each side.
  Corpus(const std::string& text, std::size_t window, double held_out = 0.1, const std::string& where = "corpus")
      : window_(window) {
    if (text.empty()) throw RangeError(where + " is empty: a language model needs text to learn from");
    if (window == 0 || !(held_out > 0 && held_out < 1)) throw RangeError("Corpus: window must be positive and held_out in (0, 1)");
    const std::size_t val = std::size_t(double(text.size()) * held_out);
    if (text.size() - val < window || val < window)
      throw RangeError(bd::detail::message(where, " holds ", text.size(), " bytes: too short for one sequence of ", window,
                                           " bytes in both its training part and its held-out ", held_out * 100,
                                           " % (needs at least ", std::size_t(double(window) / held_out) + window, ")"));
    train_.assign(text.begin(), text.end() - long(val));
    val_.assign(text.end() - long(val), text.end());
  }

  /// The text of a file; a missing or unreadable file is refused with its path.
  static std::string read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw IoError(path + ": cannot open the corpus (give --corpus PATH to a text file)");
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  std::size_t train_bytes() const { return train_.size(); }
  std::size_t validation_bytes() const { return val_.size(); }

  /// `count` training windows at random offsets, stacked.
  std::vector<int> training_batch(std::size_t count, std::mt19937_64& rng) const {
    std::uniform_int_distribution<std::size_t> at(0, train_.size() - window_);
    std::vector<int> out;
    out.reserve(count * window_);
    for (std::size_t s = 0; s < count; ++s) append(train_, at(rng), out);
    return out;
  }

  /// Up to `count` validation windows, evenly spaced, stacked (the same every call).
  std::vector<int> validation_windows(std::size_t count) const {
    const std::size_t room = val_.size() - window_, n = std::max<std::size_t>(1, std::min(count, room + 1));
    std::vector<int> out;
    for (std::size_t s = 0; s < n; ++s) append(val_, n == 1 ? 0 : s * room / (n - 1), out);
    return out;
  }

private:
  void append(const std::vector<unsigned char>& bytes, std::size_t at, std::vector<int>& out) const {
    for (std::size_t i = 0; i < window_; ++i) out.push_back(int(bytes[at + i]));
  }
  std::size_t window_;
  std::vector<unsigned char> train_, val_;
};

}  // namespace bd::train
