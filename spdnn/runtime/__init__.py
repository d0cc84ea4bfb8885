"""The distributed runtime: the rank grid, halo exchanges (expand, fold), local layers, the
distributed network, gradient sums, accounting, sessions, training, inference, checkpoints."""
