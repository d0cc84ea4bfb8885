"""The cost model: calibration of this host, machine and cluster files, the workload of a plan,
predicted step times, and the grid choice of ``--replicas auto``."""
