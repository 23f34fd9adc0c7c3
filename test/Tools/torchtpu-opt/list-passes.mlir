// RUN: torchtpu-opt --list-passes | FileCheck %s

// Every registered torch_tpu pass with its summary and options, then the upstream
// passes that this jaxlib build provides.

// CHECK:      torch_tpu passes:
// CHECK:        --torchtpu-set-precision  Set precision_config on dot_general/dot/convolution
// CHECK-NEXT:       mode=<medium|high|highest> (default: medium)
// CHECK-NEXT:       override=<bool> (default: false)
// CHECK:        --torchtpu-verify  Check every torchtpu op and type against the dialect table
// CHECK:      upstream passes {{.*}} module level:
// CHECK:        --canonicalize
// CHECK:        --cse
// CHECK:        --symbol-dce
// CHECK:      upstream passes nested on func.func
// CHECK:        --chlo-legalize-to-stablehlo
