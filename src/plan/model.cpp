// The plan model (Note [Plan model]). Stub: being written.
#include "trident/check.h"
#include "trident/plan.h"

namespace trident {

PlanModel PlanModel::from_deck(const Deck& deck) {
  PlanModel m;
  m.layers = deck.model.layers;
  return m;
}
double Prediction::term(const std::string& name) const {
  for (const auto& t : time) if (t.name == name) return t.value;
  for (const auto& t : memory) if (t.name == name) return t.value;
  return 0;
}
Prediction predict(const PlanModel&, const PlanLayout& layout, const Hardware&) {
  Prediction p;
  p.layout = layout;
  return p;
}
std::vector<Prediction> rank_layouts(const PlanModel&, const Hardware&, const PlanSearch&) {
  return {};
}
PlanLayout parse_layout(const std::string&, int) { return {}; }
std::string format_layout(const PlanLayout&) { return {}; }

}  // namespace trident
