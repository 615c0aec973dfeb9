// The stage-boundary names of engine/pipeline_boundary.h as cli/pipeline_wire.h (the frames'
// tensors) uses them.
#pragma once

#include "engine/pipeline_boundary.h"

namespace xserv::cli {

using engine::boundary_bytes;
using engine::BoundaryTensor;
using engine::check_boundary;
using engine::Named;
using engine::stage_receives;
using engine::stage_sends;
using engine::token_count;

} // namespace xserv::cli
