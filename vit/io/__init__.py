"""Weights in and out: safe checkpoint reading, migration of older layouts, plain models from
checkpoints, safetensors files, the shipped weights, timm interop, the Hugging Face Hub's layout
and fine-tuning's start from trained weights. Torch and safetensors only (huggingface_hub for
downloads and uploads, when installed)."""
