"""The real-client tier: the pinned Claude Code client from the npm registry, cached in
``~/.cache/hostrun-test-claude``, talking to a fake Messages API on loopback only."""
