"""torch_tpu.compiler: the MLIR toolchain (FX importer, lowerings, the `torchtpu`
dialect, passes and pipelines). Never imports the torch_tpu frontend or runtime."""
