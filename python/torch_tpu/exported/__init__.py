"""Exported programs: `torch_tpu.export` (a model as a StableHLO module with its call
signature), `ExportedProgram.save` and `torch_tpu.load` (a folder of VHLO, safetensors and
JSON, no pickle). The public names are `torch_tpu.export`, `torch_tpu.ExportedProgram`,
`torch_tpu.load`, `torch_tpu.is_saved_export` and `torch_tpu.SavedExportError`; this
package is not named `export` because that name is the function.

Importing this package imports nothing: `torch_tpu.is_saved_export` (`_saved_export_format`)
must stay torch-free for `torchtpu-run`'s start-up."""
