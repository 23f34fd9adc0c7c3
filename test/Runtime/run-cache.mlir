// RUN: rm -rf %t && mkdir -p %t
// RUN: env TORCH_TPU_CACHE_L2=1 TORCH_TPU_CACHE_DIR=%t/l2 TORCH_TPU_CACHE_URL=file://%t/l3 torchtpu-run %s -v --input-literal 'f32=2' 2>&1 | FileCheck %s --check-prefix=COLD
// RUN: env TORCH_TPU_CACHE_L2=1 TORCH_TPU_CACHE_DIR=%t/l2 TORCH_TPU_CACHE_URL=file://%t/l3 torchtpu-run %s -v --input-literal 'f32=2' 2>&1 | FileCheck %s --check-prefix=FROM-L2
// RUN: env TORCH_TPU_CACHE_L2=0 TORCH_TPU_CACHE_URL=file://%t/l3 torchtpu-run %s -v --input-literal 'f32=2' 2>&1 | FileCheck %s --check-prefix=FROM-L3
// RUN: %PYTHON -m torch_tpu.tools.cache stats --dir %t/l2 --url file://%t/l3 | FileCheck %s --check-prefix=STATS
// RUN: %PYTHON -m torch_tpu.tools.cache verify --dir %t/l2 --url file://%t/l3 | FileCheck %s --check-prefix=VERIFY
// RUN: %PYTHON -c "import glob; p = glob.glob('%t/l2/*.ttpu')[0]; open(p, 'r+b').truncate(100)"
// RUN: not %PYTHON -m torch_tpu.tools.cache verify --dir %t/l2 --url file://%t/l3 | FileCheck %s --check-prefix=BAD
// RUN: env TORCH_TPU_CACHE_L2=1 TORCH_TPU_CACHE_DIR=%t/l2 torchtpu-run %s -v --input-literal 'f32=2' 2>&1 | FileCheck %s --check-prefix=REJECT
// RUN: %PYTHON -m torch_tpu.tools.cache verify --dir %t/l2 --url file://%t/l3 | FileCheck %s --check-prefix=VERIFY
// RUN: %PYTHON -m torch_tpu.tools.cache clear --dir %t/l2 --url file://%t/l3 | FileCheck %s --check-prefix=CLEAR
// RUN: %PYTHON -m torch_tpu.tools.cache list --dir %t/l2 --url file://%t/l3 | FileCheck %s --check-prefix=EMPTY --allow-empty

// The executable comes from a compile, then L2, then L3 in fresh processes; a damaged
// entry is rejected with a warning, recompiled and rewritten.

// COLD:   torchtpu-run: executable from compile in {{.*}} ms (cpu)
// COLD:   result[0]: tensor<f32>
// COLD-NEXT: 8
// FROM-L2: torchtpu-run: executable from l2 in
// FROM-L2: 8
// FROM-L3: torchtpu-run: executable from l3 in
// FROM-L3: 8
// STATS:  L2  {{.*}}/l2: 1 entries
// STATS:  L3  {{.*}}/l3: 1 entries
// VERIFY: verified 2 entries: 2 ok, 0 bad
// BAD:    L2  {{[0-9a-f-]+}}.ttpu: BAD: truncated: 100 bytes, header says
// BAD:    verified 2 entries: 1 ok, 1 bad
// REJECT: compile cache L2: {{[0-9a-f-]+}}.ttpu: rejected entry (truncated: 100 bytes, header says {{[0-9]+}}); recompiling and rewriting it
// REJECT: torchtpu-run: executable from compile
// REJECT: 8
// CLEAR:  L2  {{.*}}: removed 1 entries
// CLEAR:  L3  {{.*}}: removed 1 entries
// EMPTY-NOT: {{.}}

module @cube {
  func.func public @main(%a: tensor<f32>) -> tensor<f32> {
    %0 = stablehlo.multiply %a, %a : tensor<f32>
    %1 = stablehlo.multiply %0, %a : tensor<f32>
    return %1 : tensor<f32>
  }
}
