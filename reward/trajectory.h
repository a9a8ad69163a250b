// Reward shaping's input from a stored trajectory, once common/schema/trajectory.h has joined
// its segments.
#pragma once

#include "common/schema/trajectory.h"
#include "reward/shaping.h"

namespace strider::reward {

// The shaping input of a stored trajectory: stored step rewards with their 1.2 has-reward flags
// and labels (1.1 segments: all rewarded, labels unknown), step keys from the turns, the end
// from the 1.2 end reason (an abandoned trajectory is a cut, as "stopped" is) or else the
// status, the stored outcome when finished.
TrajectoryRewards StoredRewards(const schema::StoredTrajectory& trajectory);

}  // namespace strider::reward
