"""What every layer of hvdlike uses and nothing in hvdlike below it: the errors, the reduce
operations, the dtypes that travel, the settings (read once from the environment), the
logger, and the native libraries it builds from its own C sources (``native``; the TF_CONFIG
emulation's ``bind_shim``), and the service where a tf.data service's processes meet
(``compute_service``). It imports no MPI and no TensorFlow."""
