"""Horovod's ``horovod.runner.common.util`` import paths that training scripts use (``env``)."""
