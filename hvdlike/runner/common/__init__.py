"""Horovod's ``horovod.runner.common`` import paths that training scripts use."""
