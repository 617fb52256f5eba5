"""Device mode (docs/contract.md §3b, DR1-DR4): the exact devices of a node a set takes.

The count-mode core reaches it only through the mode object of `seam` (`Snapshot.mode`;
count mode's null object when no class is of device mode), at a few named points: choose a
group on a node and whether a set's records still hold (`choice`), what is free (`records`),
the defragmentation steps of a node (`defrag`), the sizes and largest sets (`view`). Below
them: ResourceSlices and claims (`dra`), CEL selectors (`cel`), the matchAttribute (`match`),
the buddy-best-fit choice of a group (`topology`). The package reads the core's values by
attribute (`ports` says what it reads) and imports none of them, so it sits below them."""
