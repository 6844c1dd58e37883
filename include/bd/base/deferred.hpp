// bd/base/deferred.hpp — BD_DEFERRED, which makes a header's function a template of nothing so
// that a program compiles it only where it calls it.
//
// A non-template inline function is checked, and every template it calls is instantiated, in
// every translation unit that includes its header, called or not: including bd/bd.hpp in an
// empty program instantiated Eigen's QR, LU and Cholesky and half of bd's preparation (18 s
// with g++ -O3). A function template is instantiated only where it is used. So the header
// functions that reach heavy templates are written
//
//     BD_DEFERRED WindowScore score_window(const FactoredProduct& p, ...);
//
// and are called exactly as before (the defaulted parameter is deduced away). With bd::compiled
// (src/compiled_*.cpp) the heaviest of them are `extern template`: the library compiles them and
// the programs linking it compile none (docs/architecture.md, "Compile time").
#pragma once

#define BD_DEFERRED template <typename = void>
