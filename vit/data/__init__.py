"""Images in, uint8 batches out: the image sources (folder or archive, CIFAR-10's release), the
decoded cache, the resumable loader and batched augmentation. Torch only, no Lightning: the
LightningDataModule over them is vit.train.datamodule."""
