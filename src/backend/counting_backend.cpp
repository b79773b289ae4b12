// Note [Memory plan]
// A run's memory is known before any is taken: the model is first built on a backend that
// allocates nothing and only counts (the same constructor runs, so the count is exact). A run
// that cannot fit is refused with the numbers instead of failing in an allocation
// (make_counting_backend in trident/backend.h).
#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "trident/backend.h"
#include "trident/check.h"

namespace trident {
namespace {

class CountingBackend final : public Backend {
 public:
  CountingBackend(const Backend& real, size_t* bytes) : real_(real), bytes_(bytes) {}
  std::string name() const override { return "counting(" + real_.name() + ")"; }
  int threads() const override { return real_.threads(); }
  bool is_device() const override { return real_.is_device(); }
  size_t attention_saved_floats(int B, int T, int C, int NH) const override {
    return real_.attention_saved_floats(B, T, C, NH);
  }
  size_t attention_scratch_floats(int B, int T, int C, int NH) const override {
    return real_.attention_scratch_floats(B, T, C, NH);
  }
  // A distinct, never dereferenced address per allocation (nothing is mapped there).
  void* allocate(size_t bytes) override {
    constexpr size_t kAlign = 256;
    *bytes_ += (bytes + kAlign - 1) / kAlign * kAlign;
    next_ += kAlign;
    return reinterpret_cast<void*>(next_);
  }
  void release(void*) noexcept override {}
  // Zeroing or filling what was just allocated is part of building (buffers that must start at
  // zero, the RoPE tables copied in from the host) and takes no memory: nothing to do. Every
  // other op is refused.
  void copy(void*, const void*, size_t) override {}
  void fill_zero(void*, size_t) override {}

  void encoder_forward(float*, const int32_t*, const float*, const float*, int, int, int) override {
    refuse("encoder_forward");
  }
  void encoder_backward(float*, float*, const float*, const int32_t*, int, int, int) override {
    refuse("encoder_backward");
  }
  void layernorm_forward(float*, float*, float*, const float*, const float*, const float*, int,
                         int) override {
    refuse("layernorm_forward");
  }
  void layernorm_backward(float*, float*, float*, const float*, const float*, const float*,
                          const float*, const float*, int, int) override {
    refuse("layernorm_backward");
  }
  void matmul_forward(float*, const float*, const float*, const float*, int, int, int) override {
    refuse("matmul_forward");
  }
  void matmul_backward(float*, float*, float*, const float*, const float*, const float*, int, int,
                       int) override {
    refuse("matmul_backward");
  }
  void attention_forward(float*, float*, const float*, int, int, int, int) override {
    refuse("attention_forward");
  }
  void attention_backward(float*, float*, const float*, const float*, const float*, const float*,
                          int, int, int, int) override {
    refuse("attention_backward");
  }
  void gelu_forward(float*, const float*, size_t) override { refuse("gelu_forward"); }
  void gelu_backward(float*, const float*, const float*, size_t) override {
    refuse("gelu_backward");
  }
  void add(float*, const float*, const float*, size_t) override { refuse("add"); }
  void crossentropy_forward(float*, float*, const int32_t*, int, int, int) override {
    refuse("crossentropy_forward");
  }
  void crossentropy_backward(float*, const int32_t*, float, int, int, int) override {
    refuse("crossentropy_backward");
  }
  double sum_squares(const float*, size_t) override { refuse("sum_squares"); }
  void adamw_update(float*, float*, float*, const float*, size_t, float, float, float, float, float,
                    int, float) override {
    refuse("adamw_update");
  }
  double measure_gemm_peak_flops() override { refuse("measure_gemm_peak_flops"); }

 private:
  [[noreturn]] static void refuse(const char* op) {
    internal_error(__FILE__, __LINE__,
                   fmt::format("the memory-counting backend runs no ops (asked for {})", op));
  }
  const Backend& real_;
  size_t* bytes_;
  uintptr_t next_ = uintptr_t(1) << 44;
};

}  // namespace

std::unique_ptr<Backend> make_counting_backend(const Backend& real, size_t* bytes) {
  return std::make_unique<CountingBackend>(real, bytes);
}

size_t Backend::free_memory_bytes() const {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("MemAvailable:", 0) == 0) {
      std::istringstream fields(line.substr(13));
      size_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  return 0;
}

}  // namespace trident
