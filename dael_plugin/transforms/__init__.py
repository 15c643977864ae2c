"""The weak and strong views: built on the host from PIL images with torchvision and Dassl's
transforms (``host``), or made on the training device in batch (``device``,
``TRAINER.DAEL.AUG_ON_DEVICE``)."""
