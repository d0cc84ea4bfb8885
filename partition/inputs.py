"""The partitioner's input: a network file, validated whole before native code sees it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spdnn.io.bundle import NetworkBundle
    from spdnn.model.plan import Pattern


def load_network_patterns(path: str) -> tuple[NetworkBundle, list[Pattern]]:
    """The network at ``path`` and the sparsity pattern of each of its layers."""
    # Imported here so that ``spdnn-partition --help`` does not load numpy.
    from spdnn.io.bundle import NetworkBundle
    from spdnn.model.plan import network_patterns

    bundle = NetworkBundle(path)
    bundle.validate()  # every array, before any of it reaches native code
    return bundle, network_patterns(bundle)
