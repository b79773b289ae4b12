// Gradient-ready reports in ready order, shared by the fp32 and the bf16 backward
// (gpt_backward.cpp, gpt_bf16.cpp).
#pragma once

#include "trident/model.h"

namespace trident {

// Reports parameters ready in the list's order (Note [Parameter table]) from `first` on,
// skipping wte, which is reported on its own: whole (wte(): all its pieces) or piece by piece
// (wte_piece) when the head computes it in pieces (Note [Head gradient in pieces]).
class ReadyWalk {
 public:
  ReadyWalk(const GradReadyFn& on_ready, int first, int wte_index, int wte_pieces)
      : on_ready_(on_ready), next_(first), wte_(wte_index), pieces_(wte_pieces) {}
  void through(int last) {
    if (!on_ready_) return;
    for (; next_ <= last; ++next_)
      if (next_ != wte_) on_ready_(next_, 0);
  }
  void wte() const {
    for (int k = 0; k < pieces_; ++k) wte_piece(k);
  }
  void wte_piece(int k) const {
    if (on_ready_) on_ready_(wte_, k);
  }

 private:
  const GradReadyFn& on_ready_;
  int next_, wte_, pieces_;
};

}  // namespace trident
