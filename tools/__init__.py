"""Command-line mains: torchtpu-opt, torchtpu-run, torchtpu-cache."""
