// safetensors in and out: every dtype round-trips, and each malformed file is rejected with a
// message naming the tensor and the problem.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <bd/io/safetensors.hpp>
#include <bd/io/safetensors_writer.hpp>

#include "support.hpp"

using bd::io::DType;
using bd::io::SafeTensors;
using Catch::Contains;

namespace {

/// A file from a literal header and a data section (the header is padded to 8 bytes).
std::vector<unsigned char> craft(std::string header, std::size_t data_bytes, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  std::vector<unsigned char> out(8 + header.size() + data_bytes, 0);
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<unsigned char>(n >> (8 * i));
  std::copy(header.begin(), header.end(), out.begin() + 8);
  return out;
}

void expect_rejected(const std::vector<unsigned char>& bytes, const std::string& fragment) {
  INFO("expected a FormatError containing: " << fragment);
  BD_CHECK_THROWS_CONTAINING(SafeTensors::from_bytes(bytes, "bad.safetensors"), bd::FormatError,
                             Contains("bad.safetensors") && Contains(fragment));
}

}  // namespace

TEST_CASE("every dtype and the metadata round-trip through a file", "[safetensors]") {
  const Eigen::MatrixXd m = bd_test::gaussian(3, 5, 1);
  const std::vector<std::int32_t> i32{1, -2, 3, 2147483647};
  const std::vector<std::int64_t> i64{-9007199254740993LL, 42};
  bd::io::Writer w;
  w.add<double>("f64", m).add<float>("f32", m).add<Eigen::half>("f16", m).add<Eigen::bfloat16>("bf16", m);
  w.add_flat<std::int32_t>("i32", {4}, i32.data(), i32.size());
  w.add_flat<std::int64_t>("i64", {2}, i64.data(), i64.size());
  w.set_metadata("bd.format", "1").set_metadata("note", "ünïcode ✓");
  const auto path = std::filesystem::temp_directory_path() / "bd_roundtrip.safetensors";
  w.write(path.string());
  const auto st = SafeTensors::open(path.string());
  CHECK(st.tensors().size() == 6);
  CHECK(st.metadata().at("bd.format") == "1");
  CHECK(st.metadata().at("note") == "ünïcode ✓");
  CHECK(st.matrix<double>("f64") == m);
  CHECK(st.matrix<double>("f32") == m.cast<float>().cast<double>());
  CHECK(st.matrix<double>("f16") == bd::rounded_in_double<Eigen::half>(m));
  CHECK(st.matrix<double>("bf16") == bd::rounded_in_double<Eigen::bfloat16>(m));
  CHECK(st.values<std::int64_t>("i32") == std::vector<std::int64_t>{1, -2, 3, 2147483647});
  CHECK(st.values<std::int64_t>("i64") == i64);
  CHECK(st.info("f16").shape == std::vector<std::int64_t>{3, 5});
  // Aligned F32 data is viewed in place, without a copy.
  const auto view = st.view<float>("f32");
  CHECK(view(2, 4) == static_cast<float>(m(2, 4)));
  BD_CHECK_THROWS_CONTAINING(st.view<float>("f64"), bd::FormatError, Contains("is F64, not F32"));
  BD_CHECK_THROWS_CONTAINING(st.info("missing"), bd::FormatError, Contains("no tensor named 'missing'"));
  std::filesystem::remove(path);
}

TEST_CASE("writers pad the header to a multiple of 8 and leave no temporary file", "[safetensors]") {
  bd::io::Writer w;
  w.add<float>("x", Eigen::MatrixXf::Ones(1, 3));
  const auto bytes = w.to_bytes();
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<std::size_t>(i)];
  CHECK(n % 8 == 0);
  const auto dir = std::filesystem::temp_directory_path() / "bd_atomic_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  w.write((dir / "out.safetensors").string());
  CHECK(std::distance(std::filesystem::directory_iterator(dir), {}) == 1);
  // Writing into a missing folder fails cleanly and leaves nothing.
  BD_CHECK_THROWS_CONTAINING(w.write((dir / "missing" / "out.safetensors").string()), bd::IoError,
                             Contains("cannot create a temporary file beside it"));
  CHECK(std::distance(std::filesystem::directory_iterator(dir), {}) == 1);
  std::filesystem::remove_all(dir);
}

TEST_CASE("truncated files are rejected", "[safetensors][malformed]") {
  expect_rejected({1, 2, 3}, "truncated: 3 bytes");
  auto bytes = craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
  bytes.resize(bytes.size() - 4);
  expect_rejected(bytes, "run past the data section");
}

TEST_CASE("a header length beyond the file or above 100 MB is rejected", "[safetensors][malformed]") {
  auto bytes = craft("{}", 0);
  bytes[0] = 200;
  expect_rejected(bytes, "runs past the end of the file");
  std::vector<unsigned char> huge(16, 0);
  huge[4] = 1;  // 2^32 bytes
  expect_rejected(huge, "exceeds the 100000000-byte limit");
}

TEST_CASE("invalid UTF-8 and invalid JSON are rejected", "[safetensors][malformed]") {
  expect_rejected(craft("{\"\xC3\x28\":{}}", 0), "not valid UTF-8");
  expect_rejected(craft("{\"\xED\xA0\x80\":{}}", 0), "not valid UTF-8");  // a UTF-16 surrogate
  expect_rejected(craft("{\"a\": [1, 2", 0), "not valid JSON");
  expect_rejected(craft("[1, 2]", 0), "not an object");
}

TEST_CASE("unknown dtypes and fields are rejected", "[safetensors][malformed]") {
  expect_rejected(craft(R"({"w":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}})", 1), "tensor 'w' has unknown dtype \"F8\"");
  expect_rejected(craft(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}})", 4), "unexpected field 'extra'");
  expect_rejected(craft(R"({"w":{"dtype":"F32","shape":[1]}})", 0), "lacks the field 'data_offsets'");
  expect_rejected(craft(R"({"w":[1,2]})", 0), "tensor 'w' is array, expected an object");
}

TEST_CASE("negative, fractional and overflowing shapes are rejected", "[safetensors][malformed]") {
  expect_rejected(craft(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), "expected a non-negative integer");
  expect_rejected(craft(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4), "expected a non-negative integer");
  expect_rejected(craft(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}})", 4),
                  "overflows the element count");
  expect_rejected(craft(R"({"w":{"dtype":"F32","shape":"2","data_offsets":[0,4]}})", 4), "expected an array");
}

TEST_CASE("offsets out of range, reversed or of the wrong span are rejected", "[safetensors][malformed]") {
  expect_rejected(craft(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8), "run past the data section");
  expect_rejected(craft(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8), "are reversed");
  expect_rejected(craft(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "spans 8 bytes but shape [3] of F32 needs 12");
  expect_rejected(craft(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8), "expected [begin, end]");
}

TEST_CASE("overlapping tensors, holes and trailing bytes are rejected", "[safetensors][malformed]") {
  expect_rejected(craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
                  "overlaps the tensor before it");
  expect_rejected(craft(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 12),
                  "a hole of 4 bytes before tensor 'b'");
  expect_rejected(craft(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 12), "8 trailing bytes");
}

TEST_CASE("non-string metadata and duplicate names are rejected", "[safetensors][malformed]") {
  expect_rejected(craft(R"({"__metadata__":{"n":1}})", 0), "__metadata__ entry 'n' is number, expected a string");
  expect_rejected(craft(R"({"__metadata__":[1]})", 0), "__metadata__ must be an object");
  expect_rejected(craft(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
                  "tensor 'a' is defined twice");
}

TEST_CASE("zero-size tensors and an empty file body are valid", "[safetensors]") {
  const auto st = SafeTensors::from_bytes(craft(R"({"e":{"dtype":"F16","shape":[0,3],"data_offsets":[0,0]}})", 0));
  CHECK(st.info("e").numel == 0);
  CHECK(st.matrix<float>("e").rows() == 0);
  CHECK(SafeTensors::from_bytes(craft("{}", 0)).tensors().empty());
}
