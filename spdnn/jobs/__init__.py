"""Whole jobs on the ranks of a communicator: open a network under a plan and train it, or run
inference. The Python API (``spdnn.train``, ``spdnn.infer``) and the ``spdnn`` command both run
these; they sit above the runtime, the cost model (``replicas="auto"``) and the file formats."""
