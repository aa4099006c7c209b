// kiln's public C++ API in one include: build an engine from ONNX, save and load it, run it.
//
//   #include <kiln/kiln.h>
//   kiln::Expected<kiln::Engine> e = kiln::Engine::load("model.kiln");
//   kiln::Expected<kiln::Session> s = e->create_session();
//   auto out = s->run({kiln::TensorView{kiln::DType::kFloat32, {1, 3, 224, 224}, image}});
//
// Link with kiln::kiln from find_package(kiln) (see examples/).
#pragma once

#include "kiln/dtype.h"
#include "kiln/engine.h"
#include "kiln/quantize.h"
#include "kiln/status.h"
#include "kiln/tensor.h"
