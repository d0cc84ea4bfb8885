"""Files to records and back: network bundles, plans, checkpoints, data sets, the Graph Challenge
and safetensors formats, field formats, atomic writes, output checks, plots."""
