// Per-op timing of a backend (ZACK_PROFILE=1 in the environment): a backend
// that forwards every op to another and times it, waiting for the device after
// each op (backend::sync) so that a GPU's time lands on the op that spent it.
// At its end it prints a table to stderr: per op and row class (1-8 rows: a
// decode step; more: prefill), calls, total and mean time, share of the timed
// total. The waits serialise a GPU's queue, so totals include launch latency
// that a run without the profile overlaps: it tells ops apart, it does not
// measure the speed of a run (zack bench does).
#pragma once
#include <memory>

#include "engine/backend.h"

namespace zk {

// Whether ZACK_PROFILE asks for the table (set, non-empty, not "0").
bool backend_profile_requested();
// inner, timed op by op.
std::unique_ptr<backend> backend_profile_wrap(std::unique_ptr<backend> inner);

}  // namespace zk
