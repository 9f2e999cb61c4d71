"""Tools for testing hvdlike (and jobs built on it) beyond one process: see ``cluster``."""
