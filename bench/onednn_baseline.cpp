#include "onednn_baseline.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <vector>

namespace bd_bench {

struct OneDnnMatmul::State {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  dnnl::memory::desc a_md, b_md, c_md;
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul matmul;
  dnnl::memory weights;  // the plain weights, or their reordered copy
  std::vector<std::uint8_t> reordered;
  const char* impl = "";
};

OneDnnMatmul::OneDnnMatmul(long m, long n, long k, const std::uint16_t* b, bool prepacked) : state_(new State) {
  using dt = dnnl::memory::data_type;
  State& s = *state_;
  // Row-major m × k is dims {m, k} with strides {k, 1}; column-major k × n strides {1, k}.
  s.a_md = dnnl::memory::desc({m, k}, dt::bf16, dnnl::memory::dims{k, 1});
  s.c_md = dnnl::memory::desc({m, n}, dt::f32, dnnl::memory::dims{n, 1});
  const dnnl::memory::desc plain_b({k, n}, dt::bf16, dnnl::memory::dims{1, k});
  s.b_md = prepacked ? dnnl::memory::desc({k, n}, dt::bf16, dnnl::memory::format_tag::any) : plain_b;
  s.pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(s.a_md, s.b_md, s.c_md), s.engine);
  s.matmul = dnnl::matmul(s.pd);
  s.impl = s.pd.impl_info_str();
  dnnl::memory source(plain_b, s.engine, const_cast<std::uint16_t*>(b));
  if (prepacked && s.pd.weights_desc() != plain_b) {
    s.weights = dnnl::memory(s.pd.weights_desc(), s.engine);
    dnnl::reorder(source, s.weights).execute(s.stream, source, s.weights);
    s.stream.wait();
  } else {
    s.weights = source;
  }
}

OneDnnMatmul::~OneDnnMatmul() = default;

void OneDnnMatmul::operator()(const std::uint16_t* a, float* c) {
  State& s = *state_;
  dnnl::memory src(s.a_md, s.engine, const_cast<std::uint16_t*>(a)), dst(s.c_md, s.engine, c);
  s.matmul.execute(s.stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, s.weights}, {DNNL_ARG_DST, dst}});
  s.stream.wait();
}

const char* OneDnnMatmul::implementation() const { return state_->impl; }

}  // namespace bd_bench
