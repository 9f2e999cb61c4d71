"""Horovod's ``horovod.common`` import paths that training scripts use (``exceptions``)."""
