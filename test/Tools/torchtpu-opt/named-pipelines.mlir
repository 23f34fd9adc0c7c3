// Named pipelines (compiler/pipelines.py) run from torchtpu-opt as a flag or inside
// --pass-pipeline, with typed options; --list-passes lists them.

// RUN: torchtpu-opt %s --torchtpu-compile-pipeline=precision=high | FileCheck %s --check-prefix=HIGH
// RUN: torchtpu-opt %s --pass-pipeline='builtin.module(torchtpu-export-pipeline{precision=highest})' | FileCheck %s --check-prefix=EXPORT
// RUN: torchtpu-opt %s --torchtpu-compile-pipeline --mlir-print-ir-after-all 2>&1 >/dev/null | FileCheck %s --check-prefix=STEPS
// RUN: not torchtpu-opt %s --torchtpu-compile-pipeline=bounds=sometimes 2>&1 | FileCheck %s --check-prefix=BADOPT
// RUN: torchtpu-opt --list-passes | FileCheck %s --check-prefix=LIST

// HIGH-LABEL: func.func @top_k_and_dot
// HIGH:       stablehlo.dot_general {{.*}} precision = [HIGH, HIGH]
// HIGH:       chlo.top_k
// EXPORT-LABEL: func.func @top_k_and_dot
// EXPORT-NOT:   chlo.
// EXPORT:       stablehlo.dot_general {{.*}} precision = [HIGHEST, HIGHEST]
// STEPS: IR Dump After {{.*}}torchtpu-verify
// STEPS: IR Dump After {{.*}}torchtpu-set-precision
// BADOPT: torchtpu-compile-pipeline: option 'bounds' must be one of none, annotate, materialize; got 'sometimes'
// LIST:      torch_tpu pipelines:
// LIST-NEXT:   --torchtpu-collective-pipeline
// LIST-NEXT:   --torchtpu-compile-pipeline
// LIST-NEXT:     precision=<medium|high|highest> (default: medium)
// LIST:        --torchtpu-partition-pipeline
// LIST:        --torchtpu-spmd-pipeline
// LIST:        --torchtpu-views-pipeline
func.func @top_k_and_dot(%a: tensor<2x3xf32>, %b: tensor<3x4xf32>) -> (tensor<2x4xf32>, tensor<2x2xf32>) {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
  %v, %i = chlo.top_k(%0, k = 2) : tensor<2x4xf32> -> (tensor<2x2xf32>, tensor<2x2xi32>)
  return %0, %v : tensor<2x4xf32>, tensor<2x2xf32>
}
