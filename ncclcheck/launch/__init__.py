"""Starting ranks through torch.distributed.run, watching them, reaping them."""
