"""Transports move buffers between ranks: ``mpi`` (every collective) and ``shm`` (on-node
all-reduce through an MPI-3 shared window). Only the engine calls them."""
