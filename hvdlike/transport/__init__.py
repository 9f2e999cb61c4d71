"""Transports move buffers between ranks. Only ``mpi`` exists so far (shm and nccl come later)."""
