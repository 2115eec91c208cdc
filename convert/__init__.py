"""Checkpoint converter: `python -m convert --help`.

Turns a base model of a supported family (README: model families; a Hugging Face checkpoint folder
or hub id, or a llama GGUF file) and, optionally, Apple's ReDrafter draft head into one MLX model folder that loads with
`redrafter_mlx.load(PATH)` and `mlx_lm.load(PATH)`.

Modules: cli (arguments, order of work, errors), output (atomic output folder, manifest),
checkpoint (sources, shards, safe tensor reading), base_model (HF via mlx-lm; GGUF),
drafter (Apple drafter -> redrafter_mlx format), tokenizer (tokenizer + chat template).
"""

PROG = "python -m convert"  # how --help and every error name the command (errors began "error:" alone)
