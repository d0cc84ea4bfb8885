"""The network in memory: layers and their sparsity, plans, pointwise operations, the optimizer,
batching, generators and the result records. No files, no MPI."""
