"""The engine: requests from any thread, matched across ranks by name, negotiated in rounds,
fused and run on a transport (``engine.engine``). Importing the package imports none of its
modules (``runtime`` imports ``engine.engine`` when MPI is up)."""
