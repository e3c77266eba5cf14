#!/bin/sh
# Curves redrawn from their stored points on 2026-11-27, after the run folders were renamed
# (labels and titles now name runs by date and machine); the run folders themselves are gone.
set -e
python scripts/plot_curve.py --from-csv experiments/results/2026-11-24-avx512bf16-sincos2d-lsa-curve/curve.csv --out experiments/results/2026-11-24-avx512bf16-sincos2d-lsa-curve/curve.png
python scripts/plot_curve.py --from-csv experiments/results/2026-11-24-avx512bf16-spt-pdrop-curve/curve.csv --out experiments/results/2026-11-24-avx512bf16-spt-pdrop-curve/curve.png
python scripts/plot_curve.py --from-csv experiments/results/2026-11-24-avx512bf16-spt-pdrop-seed0/curve.csv --out experiments/results/2026-11-24-avx512bf16-spt-pdrop-seed0/curve.png
python scripts/plot_curve.py --from-csv experiments/results/2026-11-24-avx512bf16-spt-pdrop-seed1/curve.csv --out experiments/results/2026-11-24-avx512bf16-spt-pdrop-seed1/curve.png
python scripts/plot_curve.py --from-csv experiments/results/2026-11-25-avx512bf16-clip1-seed0/curve.csv --out experiments/results/2026-11-25-avx512bf16-clip1-seed0/curve.png
python scripts/plot_curve.py --from-csv experiments/results/2026-11-25-avx512bf16-cutmix-pdrop75-seed0/curve.csv --out experiments/results/2026-11-25-avx512bf16-cutmix-pdrop75-seed0/curve.png
python scripts/plot_curve.py --from-csv experiments/results/2026-11-25-avx512bf16-cutmix-seed0/curve.csv --out experiments/results/2026-11-25-avx512bf16-cutmix-seed0/curve.png
python scripts/plot_curve.py --from-csv experiments/results/2026-11-25-avx512bf16-depth3-seed0/curve.csv --out experiments/results/2026-11-25-avx512bf16-depth3-seed0/curve.png
python scripts/plot_curve.py --from-csv experiments/results/2026-11-25-avx512bf16-depth4-curve/curve.csv --out experiments/results/2026-11-25-avx512bf16-depth4-curve/curve.png
python scripts/plot_curve.py --from-csv experiments/results/2026-11-25-avx512bf16-depth4-pdrop75-seed0/curve.csv --out experiments/results/2026-11-25-avx512bf16-depth4-pdrop75-seed0/curve.png
python scripts/plot_curve.py --from-csv experiments/results/2026-11-25-avx512bf16-depth4-seed0/curve.csv --out experiments/results/2026-11-25-avx512bf16-depth4-seed0/curve.png
python scripts/plot_curve.py --from-csv experiments/results/2026-11-25-avx512bf16-depth4-width256-seed0/curve.csv --out experiments/results/2026-11-25-avx512bf16-depth4-width256-seed0/curve.png
python scripts/plot_curve.py --from-csv experiments/results/2026-11-25-avx512bf16-pdrop75-seed0/curve.csv --out experiments/results/2026-11-25-avx512bf16-pdrop75-seed0/curve.png
python scripts/plot_curve.py --from-csv experiments/results/2026-11-25-avx512bf16-width256-seed0/curve.csv --out experiments/results/2026-11-25-avx512bf16-width256-seed0/curve.png
python scripts/plot_curve.py --from-csv experiments/results/2026-11-26-avx2-adamw-100min-seed0/curve.csv --out experiments/results/2026-11-26-avx2-adamw-100min-seed0/curve.png --title 'Today'"'"'s recipe: 100 minutes on an AVX2 CPU against 60'
python scripts/plot_curve.py --from-csv experiments/results/2026-11-26-avx2-adamw-curve/curve.csv --out experiments/results/2026-11-26-avx2-adamw-curve/curve.png
python scripts/plot_curve.py --from-csv experiments/results/2026-11-26-avx2-momentum0.98-wd0.2-screens/curve.csv --out experiments/results/2026-11-26-avx2-momentum0.98-wd0.2-screens/curve.png --title '20-min screens on the adopted recipe, 2026-11-26 (AVX2, fp32)'
python scripts/plot_curve.py --from-csv experiments/results/2026-11-26-avx2-muon-75min-seed0/curve-minutes.csv --out experiments/results/2026-11-26-avx2-muon-75min-seed0/curve-minutes.png --title 'Muon vs AdamW: same recipe, seed, machine kind'
python scripts/plot_curve.py --from-csv experiments/results/2026-11-26-avx2-muon-75min-seed0/curve-steps.csv --out experiments/results/2026-11-26-avx2-muon-75min-seed0/curve-steps.png --title 'Muon vs AdamW: same recipe, seed, machine kind' --x steps
python scripts/plot_curve.py --from-csv experiments/results/2026-11-26-avx2-muon-curve/curve.csv --out experiments/results/2026-11-26-avx2-muon-curve/curve.png --title 'Muon vs AdamW in the hour: same recipe, seeds and CPU kind'
python scripts/plot_curve.py --from-csv experiments/results/2026-11-26-avx2-muon-fastns-curve/curve.csv --out experiments/results/2026-11-26-avx2-muon-fastns-curve/curve.png --title 'AVX2 CPU (float32), 60 min: today'"'"'s code, two seeds'
python scripts/plot_curve.py --from-csv experiments/results/2026-11-26-avx2-muon-fastns-cutmix-curve/curve.csv --out experiments/results/2026-11-26-avx2-muon-fastns-cutmix-curve/curve.png --title 'AVX2 CPU (float32), 60 min: faster Muon iterations, and CutMix'
python scripts/plot_curve.py --from-csv experiments/results/2026-11-26-avx2-muon-lr-screen/curve.csv --out experiments/results/2026-11-26-avx2-muon-lr-screen/curve.png --title '20-min screens: Muon'"'"'s lr and qkv split (AVX2, fp32)'
python scripts/plot_curve.py --from-csv experiments/results/2026-11-26-avx2-wd-pe-momentum-screens/curve.csv --out experiments/results/2026-11-26-avx2-wd-pe-momentum-screens/curve.png --title '20-min screens, 2026-11-26 (AVX2, fp32)'
python scripts/plot_curve.py --from-csv experiments/results/2026-11-26-avx2-wd0.1-pe-seed0/curve.csv --out experiments/results/2026-11-26-avx2-wd0.1-pe-seed0/curve.png --title '60 min, seed 0: weight decay 0.1 + Muon patch projection (AVX2, fp32)'
python scripts/plot_curve.py --from-csv experiments/results/2026-11-26-avx2-wd0.1-pe-seed1/curve.csv --out experiments/results/2026-11-26-avx2-wd0.1-pe-seed1/curve.png --title '60 min, two seeds: the adopted pair (AVX2, fp32)'
python scripts/plot_curve.py --from-csv experiments/results/2026-11-27-avx2-wd0.2-seed1/curve.csv --out experiments/results/2026-11-27-avx2-wd0.2-seed1/curve.png --title '60 min, two seeds: weight decay 0.2 (AVX2, fp32)'
python scripts/plot_curve.py --from-csv experiments/results/2026-11-27-avx512bf16-cutmix-seed0/curve.csv --out experiments/results/2026-11-27-avx512bf16-cutmix-seed0/curve.png --title 'CutMix on today'"'"'s recipe, AVX512-BF16 EPYC, 2026-11-27'
python scripts/plot_curve.py --from-csv experiments/results/2026-11-27-avx512bf16-ns3-seed0/curve.csv --out experiments/results/2026-11-27-avx512bf16-ns3-seed0/curve.png --title '3 Newton-Schulz iterations, AVX512-BF16 EPYC, 2026-11-27'
python scripts/plot_curve.py --from-csv experiments/results/2026-11-27-avx512bf16-seed1/curve.csv --out experiments/results/2026-11-27-avx512bf16-seed1/curve.png --title '60 min, two seeds: today'"'"'s recipe on the AVX512-BF16 VM (bf16)'
python scripts/plot_curve.py --from-csv experiments/results/2026-11-27-avx512bf16-trivialaugment-seed0/curve.csv --out experiments/results/2026-11-27-avx512bf16-trivialaugment-seed0/curve.png --title 'TrivialAugment on today'"'"'s recipe, AVX512-BF16 EPYC, 2026-11-27'
