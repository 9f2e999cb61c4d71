"""What every layer of hvdlike uses and nothing in hvdlike below it: the errors, the reduce
operations, the dtypes that travel, the settings (read once from the environment) and the
logger. It imports no MPI and no TensorFlow."""
