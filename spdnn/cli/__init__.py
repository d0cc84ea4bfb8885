"""The ``spdnn`` command line: the parser, the commands, option checks and progress lines."""
