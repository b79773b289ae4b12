// The MLP's activation (GPTConfig::activation) over `rows` rows of `width` outputs, through the
// backend: the dense MLP's (GPT::activation_forward) and the experts' (MoeLayer) alike. SwiGLU's
// input rows are gate | up, 2·width wide; GELU's are width wide.
#pragma once

#include "trident/backend.h"
#include "trident/model_config.h"

namespace trident {

inline void activation_forward(Backend& be, Activation a, float* out, const float* pre, int rows,
                               int width) {
  switch (a) {
    case Activation::kGeluTanh: be.gelu_forward(out, pre, size_t(rows) * width); break;
    case Activation::kGeluErf: be.gelu_erf_forward(out, pre, size_t(rows) * width); break;
    case Activation::kSwiGLU: be.swiglu_forward(out, pre, rows, width); break;
  }
}

// dpre (assigned) from the output gradient dout.
inline void activation_backward(Backend& be, Activation a, float* dpre, const float* pre,
                                const float* dout, int rows, int width) {
  switch (a) {
    case Activation::kGeluTanh: be.gelu_backward(dpre, pre, dout, size_t(rows) * width); break;
    case Activation::kGeluErf: be.gelu_erf_backward(dpre, pre, dout, size_t(rows) * width); break;
    case Activation::kSwiGLU: be.swiglu_backward(dpre, pre, dout, rows, width); break;
  }
}

}  // namespace trident
