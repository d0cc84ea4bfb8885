"""The parsers of ``spdnn``'s commands, one module each (``spdnn.cli.parser`` joins them)."""
