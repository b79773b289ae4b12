// Hardware descriptions (Note [Hardware files]). Stub: being written.
#include "trident/check.h"
#include "trident/plan.h"

namespace trident {

Hardware load_hardware(const std::string& path) { input_error("{}: not implemented", path); }
Hardware find_hardware(const std::string& name) { return load_hardware(name); }
std::string hardware_to_yaml(const Hardware&) { return {}; }
double gemm_flops_per_s(const Hardware& hw, double, double, double) {
  return hw.gemm.empty() ? 0 : hw.gemm.front().tflops * 1e12;
}

}  // namespace trident
