"""torch_tpu.runtime: PjRT clients, buffers, executables and the compile cache."""
