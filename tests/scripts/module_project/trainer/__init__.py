"""A package run as `torchrun -m trainer.train`: its modules import each other relatively."""
