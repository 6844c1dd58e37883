// train_lm — a byte-level decoder-only Transformer language model trained with MHA or with BD
// attention (the paper's §5.2: the basis and coefficient matrices are the learnable parameters),
// Adam with the Noam schedule.
//
//   train_lm [--attention mha|bda] [--start own|mha] [--lr-scale S] [--steps N] [--corpus PATH]
//            [--seed K] [--basis first|pivoted|…] [--batch B] [--context L] [--dim D] [--heads H]
//            [--layers N] [--ffn F] [--warmup W] [--log-every N] [--eval-every N] [--curve CSV]
//            [--save FILE] [--threads N]
//
// --start (bda): own (default) draws BDA as its own architecture, the paper's setup — first-rows
// windows, B and C initialised directly (bd::train::bda_layer); mha starts from the BD of the MHA
// model's initialisation (the same function as MHA's start), prepared with --basis (default
// first, the paper's contiguous window; pivoted: each head's own rows by QR with column
// pivoting, |C| ≲ 1).
//
// The corpus defaults to the King James Bible as Debian's bible-kjv prints it (`bible
// Gen1:1-Rev22:21`, packages bible-kjv and bible-kjv-text); its last 10 % is held out. One
// progress line per --log-every steps; the last line is one JSON object.
#include <bd/core/heap.hpp>
#include <bd/train/corpus.hpp>
#include <bd/train/language_model.hpp>
#include <bd/train/optimizer.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

struct Args {
  std::string attention = "mha", start = "own", corpus, curve, save, basis = "first";
  double lr_scale = 1, warmup = 400;
  long steps = 2000, log_every = 100, eval_every = 0, batch = 16;
  std::uint64_t seed = 1;
  int threads = 0;
  bd::train::ModelConfig model;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "train_lm: " << why
            << "\nusage: train_lm [--attention mha|bda] [--start own|mha] [--lr-scale S] [--steps N] [--corpus PATH]\n"
               "                [--seed K] [--basis first|pivoted|...] [--batch B] [--context L] [--dim D] [--heads H]\n"
               "                [--layers N] [--ffn F] [--warmup W] [--log-every N] [--eval-every N] [--curve CSV]\n"
               "                [--save FILE] [--threads N]\n";
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  bool basis_given = false;
  auto number = [&](int& i, const char* name) {
    if (i + 1 >= argc) usage(std::string(name) + " needs a value");
    char* end = nullptr;
    const double v = std::strtod(argv[++i], &end);
    if (*end || !std::isfinite(v) || v <= 0) usage(std::string(name) + " needs a positive number, got '" + argv[i] + "'");
    return v;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--attention") {
      if (i + 1 >= argc) usage("--attention needs mha or bda");
      a.attention = argv[++i];
      if (a.attention != "mha" && a.attention != "bda") usage("--attention is mha or bda, got '" + a.attention + "'");
    } else if (k == "--start") {
      if (i + 1 >= argc) usage("--start needs own or mha");
      a.start = argv[++i];
      if (a.start != "own" && a.start != "mha") usage("--start is own or mha, got '" + a.start + "'");
    } else if (k == "--basis") {
      if (i + 1 >= argc) usage("--basis needs a strategy name");
      a.basis = argv[++i];
      basis_given = true;
    } else if (k == "--corpus" || k == "--curve" || k == "--save") {
      if (i + 1 >= argc) usage(k + " needs a path");
      (k == "--corpus" ? a.corpus : k == "--curve" ? a.curve : a.save) = argv[++i];
    } else if (k == "--lr-scale") a.lr_scale = number(i, "--lr-scale");
    else if (k == "--warmup") a.warmup = number(i, "--warmup");
    else if (k == "--steps") a.steps = long(number(i, "--steps"));
    else if (k == "--seed") a.seed = std::uint64_t(number(i, "--seed"));
    else if (k == "--batch") a.batch = long(number(i, "--batch"));
    else if (k == "--log-every") a.log_every = long(number(i, "--log-every"));
    else if (k == "--eval-every") a.eval_every = long(number(i, "--eval-every"));
    else if (k == "--threads") a.threads = int(number(i, "--threads"));
    else if (k == "--context") a.model.context = Eigen::Index(number(i, "--context"));
    else if (k == "--dim") a.model.dim = Eigen::Index(number(i, "--dim"));
    else if (k == "--heads") a.model.heads = Eigen::Index(number(i, "--heads"));
    else if (k == "--layers") a.model.layers = Eigen::Index(number(i, "--layers"));
    else if (k == "--ffn") a.model.ffn = Eigen::Index(number(i, "--ffn"));
    else usage("unknown option '" + k + "'");
  }
  if (basis_given && !(a.attention == "bda" && a.start == "mha"))
    usage("--basis chooses the windows of BDA started from MHA (--attention bda --start mha); BDA's own start "
          "uses the paper's first rows");
  return a;
}

/// The King James Bible as the `bible` program of Debian's bible-kjv prints it.
std::string king_james() {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen("bible Gen1:1-Rev22:21 2>/dev/null", "r"), pclose);
  std::string text;
  if (pipe) {
    char buffer[1 << 16];
    for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe.get())) > 0;) text.append(buffer, n);
  }
  if (text.size() < 1000000)
    throw bd::IoError("no --corpus given and the King James Bible is not available: install Debian's bible-kjv and "
                      "bible-kjv-text (apt-get install bible-kjv bible-kjv-text), or give --corpus PATH to a text file");
  return text;
}

template <typename Model>
int train(Model& model, const bd::train::Corpus& corpus, const Args& a, double first_loss_mha) {
  using Clock = std::chrono::steady_clock;
  std::mt19937_64 rng(a.seed * 7919 + 1);  // the batches: the same for MHA and BDA under one seed
  const bd::train::NoamSchedule lr{a.lr_scale, double(a.model.dim), a.warmup};
  bd::train::Adam<float> adam(model.parameter_count());
  const std::vector<int> validation = corpus.validation_windows(64);
  std::ofstream curve;
  if (!a.curve.empty()) {
    curve.open(a.curve);
    if (!curve) throw bd::IoError(a.curve + ": cannot write the curve");
    curve << "step,train_loss,val_loss\n";
  }
  const double first_loss = model.loss(validation);
  double recent = 0, train_loss = 0;
  long recent_steps = 0;
  const auto start = Clock::now();
  for (long step = 1; step <= a.steps; ++step) {
    const std::vector<int> batch = corpus.training_batch(std::size_t(a.batch), rng);
    model.parameters().zero_gradient();
    const double loss = model.loss_and_gradient(batch);
    if (!std::isfinite(loss)) {
      std::cerr << "train_lm: the loss diverged at step " << step << " (lr scale " << a.lr_scale << ")\n";
      train_loss = loss;
      break;
    }
    const double norm = bd::train::clip_gradient(model.parameters(), 1.0);
    adam.step(model.parameters(), lr(step));
    recent += loss, ++recent_steps;
    const bool last = step == a.steps;
    if (a.eval_every && (step % a.eval_every == 0 || last) && curve)
      curve << step << "," << loss << "," << model.loss(validation) << "\n";
    if (step % a.log_every == 0 || last) {
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      train_loss = recent / double(recent_steps);
      std::printf("step %6ld/%ld  train loss %.4f  lr %.3g  |grad| %.3g  %.1f ms/step\n", step, a.steps, train_loss, lr(step), norm,
                  1000 * seconds / double(step));
      std::fflush(stdout);
      recent = 0, recent_steps = 0;
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double val_loss = model.loss(validation);
  if (!a.save.empty()) model.save(a.save);
  std::printf(
      "{\"attention\": \"%s\", \"start\": \"%s\", \"basis\": \"%s\", \"lr_scale\": %g, \"steps\": %ld, \"seed\": %llu, \"params\": %lld, \"attention_params\": %lld, "
      "\"first_val_loss\": %.6f, \"first_val_loss_mha\": %.6f, \"train_loss\": %.6f, \"val_loss\": %.6f, \"val_ppl\": %.4f, "
      "\"seconds\": %.2f, \"ms_per_step\": %.2f, \"batch\": %ld, \"context\": %lld, \"dim\": %lld, \"heads\": %lld, "
      "\"layers\": %lld, \"train_bytes\": %zu, \"validation_bytes\": %zu}\n",
      a.attention.c_str(), a.attention == "bda" ? a.start.c_str() : "-",
      a.attention != "bda" ? "-" : a.start == "own" ? "first" : a.basis.c_str(), a.lr_scale, a.steps, (unsigned long long)a.seed, (long long)model.parameter_count(),
      (long long)model.attention_parameter_count(), first_loss, first_loss_mha, train_loss, val_loss, std::exp(val_loss), seconds,
      1000 * seconds / double(a.steps), a.batch, (long long)a.model.context, (long long)a.model.dim, (long long)a.model.heads,
      (long long)a.model.layers, corpus.train_bytes(), corpus.validation_bytes());
  return std::isfinite(val_loss) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
#ifdef _OPENMP
    if (a.threads > 0) omp_set_num_threads(a.threads);
#endif
    a.model.validate();
    // Every step allocates the same activations and gradients and frees them: kept by the
    // process, they are reused instead of faulted in anew each step (bd/core/heap.hpp); without
    // it, which blocks glibc returns to the kernel depends on the allocation history, and one
    // start (BDA from MHA) ran twice as slow as another at the same shapes.
    bd::keep_freed_heap();
    const std::string text = a.corpus.empty() ? king_james() : bd::train::Corpus::read(a.corpus);
    const bd::train::Corpus corpus(text, std::size_t(a.model.context + 1), 0.1, a.corpus.empty() ? "the King James Bible" : a.corpus);
    bd::train::LanguageModel<bd::nn::MultiHeadAttention<float>> mha(a.model, a.seed);
    const double first_mha = mha.loss(corpus.validation_windows(64));
    if (a.attention == "mha") return train(mha, corpus, a, first_mha);
    if (a.start == "own") {
      bd::train::LanguageModel<bd::nn::BDAttention<float>> bda(a.model, a.seed);
      return train(bda, corpus, a, first_mha);
    }
    auto bda = mha.to_bd(bd::nn::BDAttentionOptions{}.with_basis(bd::parse_basis(a.basis)));
    return train(bda, corpus, a, first_mha);
  } catch (const std::exception& e) {
    std::cerr << "train_lm: " << e.what() << "\n";
    return 1;
  }
}
