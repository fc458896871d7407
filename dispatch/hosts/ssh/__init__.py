"""The ``ssh`` kind: a peer reached over OpenSSH, its transport (one ControlMaster per peer), the sync
of the tree, the agent shipped there and the peer driver's seven steps."""
