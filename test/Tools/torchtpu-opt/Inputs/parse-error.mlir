func.func @f() {
  stablehlo.frobnicate
}
