"""Training with Lightning: the LightningModule, the DataModule, the optimizers (Muon in its own
file), the learning-rate schedule and the callbacks."""
