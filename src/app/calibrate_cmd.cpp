// `trident plan --calibrate`. Stub: being written.
#include "app/commands.h"
#include "trident/check.h"

namespace trident {

int run_calibrate(const CalibrateArgs&, const BlasCoreCheck&) {
  input_error("trident plan --calibrate: not implemented yet");
}

}  // namespace trident
