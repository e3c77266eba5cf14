"""Weights in and out: safe checkpoint reading, migration of older layouts, plain models from
checkpoints, safetensors files, the shipped weights and timm interop. Torch and safetensors only."""
