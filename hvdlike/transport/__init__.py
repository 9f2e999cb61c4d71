"""Transports move buffers between ranks; only the engine calls them. ``mpi``: every
collective, on any buffers; ``shm``: on-node all-reduce through an MPI-3 shared window;
``cma``: on-node single-copy all-reduce, reading peers' memory in place; ``nccl`` and
``staged``: GPU arrays, through NCCL or through host memory; ``gpu``: which arrays live on a
GPU, CuPy and NCCL loaded on demand, CUDA stream ordering."""
