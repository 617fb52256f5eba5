"""Device mode (docs/contract.md §3b, DR1-DR4): the exact devices of a node a set takes.

Values and pure functions for ResourceSlices and claims (`dra`), CEL selectors (`cel`), the
buddy-best-fit choice of a group (`topology`) and the operator's view of a node's groups
(`view`). The count-mode core reaches device mode only through the seam object of `seam`.
This package reads the core's values (snapshot, devices, nodes) by attribute and imports
none of them, so it sits below them in the import graph."""
