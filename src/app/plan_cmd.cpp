// `trident plan DECK --hardware NAME --gpus N`. Stub: being written.
#include "app/commands.h"
#include "trident/check.h"
#include "trident/plan.h"

namespace trident {

int run_plan(const PlanArgs& args) { input_error("{}: trident plan not implemented", args.deck.deck); }

}  // namespace trident
