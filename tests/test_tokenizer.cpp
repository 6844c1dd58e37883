// llama2.c's tokenizer (bd::io::Tokenizer) on the tokenizer that ships with stories260K: the ids
// llama2.c's encoder gives — fixed here, computed apart from bd by a transcription of run.c's
// encode — byte fallback for what the 512-token vocabulary lacks, text round trips, and bad files
// and ids refused by name.
#include <bd/io/safetensors.hpp>
#include <bd/io/tokenizer.hpp>

#include <fstream>
#include <iterator>

#include "support.hpp"

using bd::io::Tokenizer;
using Catch::Contains;

namespace {

const Tokenizer& tokenizer() {
  static const Tokenizer t = Tokenizer::read(bd_test::require_model("stories260K") + "/tok512.bin", 512);
  return t;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("tokenizer: the ids llama2.c's encoder gives", "[real-model][tokenizer]") {
  const Tokenizer& t = tokenizer();
  CHECK(t.encode("Once upon a time, there was a little girl named Lily.") ==
        std::vector<int>{1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426});
  // 🙂 is not in the vocabulary: its four UTF-8 bytes as byte tokens (byte + 3).
  CHECK(t.encode("Lily saw a \xF0\x9F\x99\x82 and said: \"Hello!\"") ==
        std::vector<int>{1, 317, 394, 261, 410, 243, 162, 156, 133, 269, 336, 467, 313, 440, 411, 306, 414, 443, 436});
  CHECK(t.encode("x\ty") == std::vector<int>{1, 410, 444, 12, 422});
  CHECK(t.encode("na\xC3\xAFve caf\xC3\xA9") == std::vector<int>{1, 297, 412, 198, 178, 360, 280, 412, 431, 485});
  CHECK(t.encode("") == std::vector<int>{1});
  CHECK(t.encode("", false, true) == std::vector<int>{2});
}

TEST_CASE("tokenizer: decoding inverts encoding, the model's own samples included", "[real-model][tokenizer]") {
  const Tokenizer& t = tokenizer();
  for (const std::string text : {"Once upon a time, there was a little girl named Lily.", "x\ty", "a  b",
                                 "Lily saw a \xF0\x9F\x99\x82.", "na\xC3\xAFve caf\xC3\xA9", "\x01\x7f"}) {
    INFO(text);
    CHECK(t.decode(t.encode(text)) == text);
  }
  CHECK(t.decode(0, 3 + 'A') == "A");   // a byte token gives its byte
  CHECK(t.decode(1, 403) == "Once");    // after BOS, the leading space of " Once" is dropped
  CHECK(t.decode(403, 407) == " upon");
  // The 64 tokens of the reference logits (the model's own sample) read as text, and that text
  // encodes to ids that decode to it again.
  const auto st = bd::io::SafeTensors::open(bd_test::require_model("stories260K") + "/reference.safetensors");
  const std::vector<int> sample = st.values<int>("tokens");
  const std::string text = t.decode(sample);
  INFO(text);
  CHECK(text.size() > 64);
  CHECK(t.decode(t.encode(text)) == text);
}

TEST_CASE("tokenizer: bad files and ids are refused by name", "[real-model][tokenizer][bad-input]") {
  const std::string path = bd_test::require_model("stories260K") + "/tok512.bin";
  const std::string bytes = file_bytes(path);
  BD_CHECK_THROWS_CONTAINING(Tokenizer::from_bytes(bytes.substr(0, bytes.size() - 3), 512, "short.bin"), bd::FormatError,
                             Contains("short.bin: truncated at byte") && Contains("of token 511"));
  BD_CHECK_THROWS_CONTAINING(Tokenizer::from_bytes(bytes, 500, "tok.bin"), bd::FormatError,
                             Contains("bytes after the 500 tokens: is vocab_size right?"));
  BD_CHECK_THROWS_CONTAINING(Tokenizer::from_bytes(bytes, 600, "tok.bin"), bd::FormatError, Contains("truncated"));
  std::string negative = bytes;
  const std::int32_t minus_one = -1;
  std::memcpy(&negative[4 + 4], &minus_one, 4);  // token 0's length
  BD_CHECK_THROWS_CONTAINING(Tokenizer::from_bytes(negative, 512, "neg.bin"), bd::FormatError,
                             Contains("token 0 has length -1"));
  BD_CHECK_THROWS_CONTAINING(Tokenizer::read("/nonexistent/tok.bin", 512), bd::IoError, Contains("cannot open the tokenizer"));
  BD_CHECK_THROWS_CONTAINING(tokenizer().decode(0, 512), bd::RangeError, Contains("token id 512 is outside the vocabulary of 512"));
  BD_CHECK_THROWS_CONTAINING(Tokenizer::from_bytes(bytes, 10, "tok.bin"), bd::RangeError, Contains("below 259"));
}
