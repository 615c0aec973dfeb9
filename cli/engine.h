// The engine layer's names as the commands use them (engine/model.h, engine/engine.h).
#pragma once

#include "engine/engine.h"
#include "engine/model.h"

namespace xserv::cli {

using engine::Model;
using engine::Stopwatch;
using engine::StepOutput;
using engine::check_prompt;

} // namespace xserv::cli
