// RUN: rm -rf %t && mkdir -p %t
// RUN: %PYTHON -c "import numpy as n, ml_dtypes as m; n.save('%t/h.npy', n.array([1.5, -2, 0.1], dtype=m.bfloat16))"
// RUN: torchtpu-run %s --input %t/h.npy --input-literal '3xf8E4M3FN=1,-0.5,448' --input-literal '2xi1=true,false' --input-literal '2xcomplex<f64>=1+1j,-2j' --input-literal '3xui64=0,1,18446744073709551615' --input-literal 'f64=0.1' | FileCheck %s

// Element types beyond f32 print exactly (bf16 and f8 as their float value).

// CHECK:      result[0]: tensor<3xbf16>
// CHECK-NEXT: [3, -4, 0.20019531]
// CHECK-NEXT: result[1]: tensor<3xf8E4M3FN>
// CHECK-NEXT: [2, -1, nan]
// CHECK-NEXT: result[2]: tensor<2xi1>
// CHECK-NEXT: [false, true]
// CHECK-NEXT: result[3]: tensor<2xcomplex<f64>>
// CHECK-NEXT: [(2+2j), (0-4j)]
// CHECK-NEXT: result[4]: tensor<3xui64>
// CHECK-NEXT: [1, 2, 0]
// CHECK-NEXT: result[5]: tensor<f64>
// CHECK-NEXT: 0.2{{$}}

module @dtypes {
  func.func public @main(%h: tensor<3xbf16>, %e: tensor<3xf8E4M3FN>, %p: tensor<2xi1>, %c: tensor<2xcomplex<f64>>, %u: tensor<3xui64>, %d: tensor<f64>)
      -> (tensor<3xbf16>, tensor<3xf8E4M3FN>, tensor<2xi1>, tensor<2xcomplex<f64>>, tensor<3xui64>, tensor<f64>) {
    %0 = stablehlo.add %h, %h : tensor<3xbf16>
    %1 = stablehlo.add %e, %e : tensor<3xf8E4M3FN>
    %2 = stablehlo.not %p : tensor<2xi1>
    %3 = stablehlo.add %c, %c : tensor<2xcomplex<f64>>
    %one = stablehlo.constant dense<1> : tensor<3xui64>
    %4 = stablehlo.add %u, %one : tensor<3xui64>
    %5 = stablehlo.add %d, %d : tensor<f64>
    return %0, %1, %2, %3, %4, %5 : tensor<3xbf16>, tensor<3xf8E4M3FN>, tensor<2xi1>, tensor<2xcomplex<f64>>, tensor<3xui64>, tensor<f64>
  }
}
