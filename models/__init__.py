"""Model registry data and shipped drafters (installed as `redrafter_mlx.models`).

registry.json maps short names to sources; each shipped drafter lives in a folder named
after its base model (e.g. smollm2-135m/drafter/). See README.md here for how each was made.
"""
