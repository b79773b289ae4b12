// Shared by the pipeline device tests (tests/mpi test_pp_device_discipline and test_moe_device):
// the strict device links of this rank's stage (Note [Stage transfers on a device] in
// trident/pipeline.h) and the embedding group's strict communicator.
#pragma once

#include <memory>
#include <vector>

#include "strict_device_backend.h"
#include "trident/comm.h"
#include "trident/grid.h"
#include "trident/pipeline.h"

namespace trident::testing {

// Each link (split_stage_links) a StrictDeviceComm over a two-rank MpiComm of its own.
struct StrictLinks {
  std::vector<std::unique_ptr<MpiComm>> hosts;
  std::vector<std::unique_ptr<StrictDeviceComm>> devices;
  StageLinks links;
  std::unique_ptr<StrictDeviceComm> embedding;
  size_t transfers() const {
    size_t n = 0;
    for (const auto& d : devices) n += d->point_to_point_count();
    return n;
  }
};

inline std::unique_ptr<StrictLinks> strict_links(StrictDeviceBackend& be, ProcessGrid& grid) {
  auto s = std::make_unique<StrictLinks>();
  for (const StageLinkGroup& g : split_stage_links(grid.pp().raw())) {
    s->hosts.push_back(std::make_unique<MpiComm>(g.group, "link"));  // owns the group
    s->devices.push_back(std::make_unique<StrictDeviceComm>(be, *s->hosts.back()));
    (g.sending ? s->links.send : s->links.recv)[g.direction] = s->devices.back().get();
  }
  if (grid.layout().pp > 1 && grid.in_embedding_group())
    s->embedding = std::make_unique<StrictDeviceComm>(be, grid.embedding());
  return s;
}

}  // namespace trident::testing
