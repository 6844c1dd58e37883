// libFuzzer target: the safetensors parser on arbitrary bytes. Any input must either parse or
// throw bd::FormatError — never crash, read out of bounds or allocate beyond the input's size.
#include <bd/io/safetensors.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto st = bd::io::SafeTensors::from_bytes(std::vector<unsigned char>(data, data + size), "fuzz");
    for (const auto& t : st.tensors()) {
      if (t.shape.size() <= 2) (void)st.matrix<double>(t.name);
      (void)st.values<float>(t.name);
    }
    (void)st.metadata();
  } catch (const bd::FormatError&) {
  }
  return 0;
}
