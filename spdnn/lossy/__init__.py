"""Lossy training: gradient compressors with error feedback, critical sets, and their state in a
checkpoint."""
