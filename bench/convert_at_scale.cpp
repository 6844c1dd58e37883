// bd_convert_at_scale — bd-convert on a checkpoint of real size, timed, with its peak memory.
//
//   bd_convert_at_scale BD_CONVERT WORK_DIR [--layers N] [--shards N] [--max-rss-mb MB] [--keep]
//                       [-- bd-convert options…]   (default: --arch deepseek-v2 --mode qkvo --dtype bf16)
//
// Writes the synthetic DeepSeek-V2-Lite-shaped checkpoint of bench/synthetic_checkpoint.hpp
// (3.45 GB of bf16 at 27 layers, 4 shards) into WORK_DIR/input unless it is there, runs
// BD_CONVERT on it into WORK_DIR/output (a folder), reads the result back (every shard and the
// index validated; the BD tensors' shapes checked; the first and the last layer's outputs, as
// stored, against the dense layers of the input: within 8 units of the stored type's roundoff)
// and prints one JSON line: input bytes, seconds, peak resident memory of the bd-convert process
// (getrusage of the child), throughput, the spot check's error.
// Exit 1 when the peak exceeds --max-rss-mb or the output is wrong; 77 (skipped) when WORK_DIR's
// disk lacks room for input and output. Both are removed at the end unless --keep (a kept input
// is reused by the next run).
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <bd/io/bd_checkpoint.hpp>
#include <bd/io/checkpoint.hpp>
#include <bd/io/model_folder.hpp>

#include "synthetic_checkpoint.hpp"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: %s BD_CONVERT WORK_DIR [--layers N] [--shards N] [--max-rss-mb MB] [--keep] [-- bd-convert options]\n",
                 argv[0]);
    return 2;
  }
  const std::string convert = argv[1], work = argv[2];
  bd_bench::SyntheticCheckpoint ckpt;
  double max_rss_mb = 0;
  bool keep = false;
  std::vector<std::string> options = {"--arch", "deepseek-v2", "--mode", "qkvo", "--dtype", "bf16"};
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--layers" && i + 1 < argc) ckpt.layers = std::atoi(argv[++i]);
    else if (a == "--shards" && i + 1 < argc) ckpt.shards = std::atoi(argv[++i]);
    else if (a == "--max-rss-mb" && i + 1 < argc) max_rss_mb = std::atof(argv[++i]);
    else if (a == "--keep") keep = true;
    else if (a == "--") {
      options.assign(argv + i + 1, argv + argc);
      break;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (ckpt.layers < 1 || ckpt.shards < 1 || ckpt.shards > ckpt.layers) {
    std::fprintf(stderr, "--layers and --shards must be positive, shards ≤ layers\n");
    return 2;
  }
  std::uint64_t need = 0;
  for (const auto& shard : ckpt.plan())
    for (const auto& t : shard) need += t.bytes();
  const std::string input = work + "/input", output = work + "/output";
  fs::create_directories(work);
  struct statvfs vfs {};
  const bool have_input = fs::exists(input + "/" + bd::io::ModelFolder::index_file);
  if (::statvfs(work.c_str(), &vfs) == 0) {
    const double free_bytes = double(vfs.f_bavail) * double(vfs.f_frsize);
    if (free_bytes < double(need) * (have_input ? 1.1 : 2.1)) {
      std::printf("skipped: %s has %.1f GB free, the checkpoint needs %.1f GB twice (input and output)\n", work.c_str(),
                  free_bytes / 1e9, double(need) / 1e9);
      return 77;
    }
  }
  if (!have_input) {
    const auto t0 = std::chrono::steady_clock::now();
    ckpt.write(input);
    std::fprintf(stderr, "wrote %s: %.2f GB in %.1f s\n", input.c_str(), double(need) / 1e9,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  fs::remove_all(output);

  std::vector<std::string> args = {convert};
  args.insert(args.end(), options.begin(), options.end());
  args.insert(args.end(), {"--quiet", input, output});
  std::vector<char*> cargs;
  for (auto& s : args) cargs.push_back(s.data());
  cargs.push_back(nullptr);
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execv(cargs[0], cargs.data());
    std::perror("execv");
    ::_exit(127);
  }
  int status = 0;
  struct rusage usage {};
  ::wait4(pid, &status, 0, &usage);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double rss_mb = double(usage.ru_maxrss) / 1024.0;  // kilobytes on Linux
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "bd-convert failed (status %d)\n", status);
    return 1;
  }

  // The output folder is valid and holds every layer's BD tensors with their documented shapes.
  int errors = 0;
  const bd::io::ModelFolder m = bd::io::ModelFolder::open(output);
  for (int l = 0; l < ckpt.layers; ++l) {
    const std::string P = "model.layers." + std::to_string(l) + ".self_attn.";
    const std::int64_t n = ckpt.heads;
    const std::pair<const char*, std::vector<std::int64_t>> expected[] = {
        {"bd_qk.basis", {ckpt.hidden, n * ckpt.nope}},
        {"bd_qk.coeff", {ckpt.latent - ckpt.nope, n * ckpt.nope}},
        {"bd_vo.coeff", {ckpt.latent - ckpt.v, n * ckpt.v}},
        {"bd_vo.basis", {n * ckpt.v, ckpt.hidden}},
        {"q_rope_proj.weight", {n * ckpt.rope, ckpt.hidden}}};
    for (const auto& [name, shape] : expected)
      if (!m.contains(P + name) || m.info(P + name).shape != shape) {
        std::fprintf(stderr, "output: %s%s missing or of the wrong shape\n", P.c_str(), name);
        ++errors;
      }
    if (m.contains(P + "kv_b_proj.weight")) {
      std::fprintf(stderr, "output: %skv_b_proj.weight should have been replaced\n", P.c_str());
      ++errors;
    }
  }
  // Spot check: layers 0 and L−1 as stored (BD tensors rounded to the written type, computed in
  // float) against the dense layers read from the input (in double), on 4 tokens. B and C carry
  // one rounding each and the chosen bases keep |C| near one, so the outputs err by a few units
  // of the type's roundoff u; 8u leaves room, a wrong tensor errs by order one.
  double spot_error = 0;
  const bd::Storage stored = bd::io::recorded_options(m).storage;
  const double spot_bound = 8 * bd::dispatch(stored, [](auto t) { return bd::unit_roundoff<typename decltype(t)::type>(); });
  for (const int l : {0, ckpt.layers - 1}) {
    const auto dense = bd::io::load_attention_layer<double>(input, bd::io::Arch::DeepSeekV2, std::size_t(l));
    const auto converted = bd::io::load_bd_attention_layer<float>(output, std::size_t(l));
    std::mt19937_64 rng(std::uint64_t(l) + 1);
    std::normal_distribution<double> normal;
    const Eigen::MatrixXd x = Eigen::MatrixXd::NullaryExpr(4, dense.input_dim(), [&] { return normal(rng); });
    const Eigen::MatrixXd want = dense.forward(x);
    const Eigen::MatrixXd got = converted.forward(x.cast<float>()).cast<double>();
    const double error = (got - want).cwiseAbs().maxCoeff() / want.cwiseAbs().maxCoeff();
    spot_error = std::max(spot_error, error);
    if (!(error <= spot_bound)) {
      std::fprintf(stderr, "output: layer %d's forward errs by %.3g relative, above %.3g (8u of %s)\n", l, error, spot_bound,
                   bd::to_string(stored));
      ++errors;
    }
  }
  std::printf("{\"input_bytes\": %llu, \"layers\": %d, \"shards\": %d, \"seconds\": %.2f, \"peak_rss_mb\": %.0f, "
              "\"throughput_mb_s\": %.0f, \"max_rss_mb\": %.0f, \"spot_check_max_rel_err\": %.3g}\n",
              (unsigned long long)need, ckpt.layers, ckpt.shards, seconds, rss_mb, double(need) / 1e6 / seconds, max_rss_mb,
              spot_error);
  if (!keep) {
    fs::remove_all(output);
    fs::remove_all(input);
  }
  if (max_rss_mb > 0 && rss_mb > max_rss_mb) {
    std::fprintf(stderr, "peak RSS %.0f MB exceeds the bound %.0f MB\n", rss_mb, max_rss_mb);
    return 1;
  }
  return errors ? 1 : 0;
}
