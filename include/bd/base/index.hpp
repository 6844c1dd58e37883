// bd/base/index.hpp — bd::Index, the one index and size type of every layer: Eigen's, so that
// sizes pass between bd and Eigen without conversions.
#pragma once

#include <Eigen/Core>

namespace bd {

using Index = Eigen::Index;

}  // namespace bd
