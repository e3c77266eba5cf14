"""Images in, uint8 batches out: the image sources (folder or archive, CIFAR-10's and CIFAR-100's
releases, dispatched in vit.data.sources), the decoded cache, the resumable loader and batched
augmentation. Torch only, no Lightning: the LightningDataModule over them is
vit.train.datamodule."""
